"""How a worker ends when training raised: its exit code, and its termination record.

The codes are the launchers' contract (docs/training.md, "Exit codes"): below 128 the
operator's ExitCode policy fails the job at once, 128 and above it restarts every worker.
- 2: a mistake in the input (`UserError`), with an `input_error` record naming it;
- 3: a failure no restart can mend (`trainer.unmendable`), or restarts that lost more
  training than the run's length (`trainer.restarts`), with a `permanent_error` record naming
  where and the fix;
- 143: preempted after the backup, a failed export, a lost peer: a restart resumes from the
  backup;
- anything else is raised again: a bug, exit 1.
"""

from __future__ import annotations

import logging
import sys

import tensorflow as tf

from contracts import termination
from contracts.errors import UserError
from trainer import restarts, unmendable
from trainer.export import ExportFailed
from trainer.preemption import EXIT_PREEMPTED, Preempted

log = logging.getLogger("trainer")


def exit_code(err: Exception, message_file: str | None) -> int:
    """The exit code for `err`, having said why where the launcher reads it (`message_file`,
    the termination-message file, if it gave one); `err` is raised again if no code fits."""
    if isinstance(err, UserError):
        return _stop(termination.INPUT_ERROR, str(err), message_file)
    if isinstance(err, Preempted):
        return EXIT_PREEMPTED
    if isinstance(err, restarts.LostTooMuch):
        return _stop(termination.PERMANENT_ERROR, str(err), message_file)
    permanent = unmendable.describe(err)
    if permanent is not None:
        return _stop(termination.PERMANENT_ERROR, permanent, message_file)
    if isinstance(err, ExportFailed):
        log.error("export failed (%s); exiting %d to retry from the backup", err, EXIT_PREEMPTED)
        return EXIT_PREEMPTED
    if isinstance(err, tf.errors.UnavailableError | tf.errors.AbortedError):
        # How collectives report a lost peer worker. The whole group must restart, so this one
        # exits retryably too; exit 1 would make the operator fail the job.
        log.error("lost a peer worker or the cluster (%s); exiting %d", err.message, EXIT_PREEMPTED)
        return EXIT_PREEMPTED
    raise err


def _stop(kind: str, message: str, message_file: str | None) -> int:
    """Say `message` on stderr, for people reading the log, and in the termination record."""
    print(f"error: {message}", file=sys.stderr)
    tell_launcher(message_file, kind, message)
    return termination.EXIT_CODES[kind]


def tell_launcher(path: str | None, kind: str, message: str) -> None:
    """Say why this worker stops in its termination-message file, where the launcher reads it
    (contracts/termination.py), if the launcher gave one."""
    if not path:
        return
    said = termination.TerminationMessage(kind, message)
    try:
        termination.write(path, said)
    except OSError as e:
        print(f"could not write the termination message to {path}: {e}", file=sys.stderr)
