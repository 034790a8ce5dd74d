"""How a training job fails: `LaunchError` and its kinds (a worker's bad input or permanent
failure, a timeout, a cancel), and the one message format for a failed worker (its exit code
and last log lines).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from contracts.errors import UserError
from contracts.termination import EXIT_CODES, INPUT_ERROR, TerminationMessage


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


class WorkerPermanentError(LaunchError, UserError):
    """A worker stopped on a failure no restart can mend (a full disk, a read-only file system,
    a denied permission, a spent retry budget): it exited 3 and named where and the fix in its
    termination message. Not retried; one line, as a user error, since the fix is the user's."""


class Named(Protocol):
    """A job spec, as an error names it (`JobSpec`, indexed `IndexedJobSpec`)."""

    @property
    def name(self) -> str: ...


def told(exit_code: int | None, said: TerminationMessage | None) -> bool:
    """True if a worker that exited `exit_code` said why in its termination record (`said`):
    an input error with exit 2, or a permanent failure with exit 3."""
    return said is not None and exit_code == EXIT_CODES[said.kind]


def told_error(
    spec: Named,
    what: str,
    replica: str | None,
    exit_code: int | None,
    said: TerminationMessage | None,
    tail: Sequence[str],
) -> WorkerInputError | WorkerPermanentError | None:
    """The error for a worker that exited 2 or 3 having said why in its termination message
    (`said`): a `WorkerInputError` or a `WorkerPermanentError`; None otherwise.

    `what` names the job as the launcher does ("job <name>", "TFJob <namespace>/<name>");
    `replica` the part that failed ("worker-1", "index-3").
    """
    if said is None or not told(exit_code, said):
        return None
    error = WorkerInputError if said.kind == INPUT_ERROR else WorkerPermanentError
    return error(
        f"{what} failed: {replica or 'a worker'} exited with code {exit_code}: {said.message}",
        reason=error.__name__,
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
