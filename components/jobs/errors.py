"""How a training job fails: `LaunchError` and its kinds (a worker's bad input, a timeout, a
cancel), and the one message format for a failed worker (its exit code and last log lines).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from contracts.errors import UserError
from contracts.termination import INPUT_ERROR, INPUT_ERROR_EXIT, TerminationMessage


class LaunchError(RuntimeError):
    """The job failed. The message names the reason, the failing worker, its exit code and log."""

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        job_name: str = "",
        replica: str | None = None,
        exit_code: int | None = None,
        log_tail: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.reason = reason  # operator condition reason, or the launcher's own (see subclasses)
        self.job_name = job_name
        self.replica = replica  # e.g. "worker-1", when known
        self.exit_code = exit_code  # the failing container's exit code, when known
        self.log_tail = tuple(log_tail)  # last lines of the failing worker's log


class WorkerInputError(LaunchError, UserError):
    """A worker stopped on a mistake in its input (a bad config, damaged Examples): it exited 2
    and named the input and the fix in its termination message (contracts/termination.py). The
    error's message is that one line, so the train step prints it as a user error."""


class Named(Protocol):
    """A job spec, as an error names it (`JobSpec`, indexed `IndexedJobSpec`)."""

    @property
    def name(self) -> str: ...


def input_error(
    spec: Named,
    what: str,
    replica: str | None,
    exit_code: int | None,
    said: TerminationMessage | None,
    tail: Sequence[str],
) -> WorkerInputError | None:
    """The error for a worker that exited 2 having named its bad input in its termination
    message (`said`); None otherwise.

    `what` names the job as the launcher does ("job <name>", "TFJob <namespace>/<name>");
    `replica` the part that failed ("worker-1", "index-3").
    """
    if exit_code != INPUT_ERROR_EXIT or said is None or said.kind != INPUT_ERROR:
        return None
    return WorkerInputError(
        f"{what} failed: {replica or 'a worker'} exited with code 2: {said.message}",
        reason="WorkerInputError",
        job_name=spec.name,
        replica=replica,
        exit_code=exit_code,
        log_tail=tail,
    )


class LaunchTimeout(LaunchError):
    """The job ran past its deadline; the launcher stopped it."""


class LaunchCancelled(LaunchError):
    """The launcher was told to stop (SIGTERM: a cancelled run); it stopped the job."""


def format_failure(
    head: str,
    replica: str | None,
    exit_code: int | None,
    tail: Sequence[str],
    *,
    tail_of: str | None = None,
) -> str:
    """One message for a failed job: what happened, which worker, its exit code and last lines
    (the failing worker's, else worker 0's; `tail_of` says whose when it is not the former)."""
    parts = [head]
    if replica is not None:
        parts.append(f"failing replica: {replica}, exit code: {exit_code}")
    if tail:
        parts.append(f"last {len(tail)} log lines of {tail_of or replica or 'worker-0'}:")
        parts.extend(f"  | {line}" for line in tail)
    return "\n".join(parts)
