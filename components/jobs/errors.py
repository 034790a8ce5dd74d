"""How a training job fails: `LaunchError` and its kinds (a worker's bad input, a timeout, a
cancel), and the one message format for a failed worker (its exit code and last log lines).
"""

from __future__ import annotations

from collections.abc import Sequence

from components.jobs.spec import JobSpec
from contracts.errors import UserError


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
    """A worker stopped on a mistake in its input (a bad config, damaged Examples) and said
    which in one `error: ...` line (exit code 2): the message is that one line, so the train
    step prints it as a user error, with no traceback."""


# The trainer's exit code for a mistake in its input (docs/training.md), which it explains in
# one line on stderr starting with USER_ERROR_PREFIX: that line becomes the job's error.
USER_ERROR_EXIT = 2
USER_ERROR_PREFIX = "error: "


def user_error_line(tail: Sequence[str]) -> str:
    """The last one-line user error (`error: ...`) in a worker's log tail, without the prefix."""
    for line in reversed(tail):
        if line.startswith(USER_ERROR_PREFIX):
            return line.removeprefix(USER_ERROR_PREFIX).strip()
    return ""


def input_error(
    spec: JobSpec, what: str, replica: str | None, exit_code: int | None, tail: Sequence[str]
) -> WorkerInputError | None:
    """The error for a worker that exited 2 having named its bad input; None otherwise.

    `what` names the job as the launcher does ("job <name>", "TFJob <namespace>/<name>").
    """
    told = user_error_line(tail) if exit_code == USER_ERROR_EXIT else ""
    if not told:
        return None
    return WorkerInputError(
        f"{what} failed: {replica or 'a worker'} exited with code 2: {told}",
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
