"""A cancelled run reaches the launcher as SIGTERM (or SIGHUP): `cancel_on_sigterm` turns it into
`LaunchCancelled`, so that the launcher stops its workers before it goes."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

from components.jobs.errors import LaunchCancelled
from contracts.process import ignored, signal_handlers


@contextlib.contextmanager
def cancel_on_sigterm() -> Iterator[None]:
    """Turn the first SIGTERM (or SIGHUP) into `LaunchCancelled` in the main thread while the
    block runs.

    Kubernetes stops a cancelled KFP run's pod with SIGTERM, then SIGKILL after the grace period;
    the exception gives the launcher that time to stop its workers or delete its TFJob. A closed
    terminal sends a local run's whole process group SIGHUP, which would otherwise kill the
    launcher and orphan its workers (each in a session of its own). Later signals are ignored
    so that cleanup is not interrupted; a SIGHUP already ignored (`nohup`) stays ignored.
    Outside the main thread (where Python cannot install handlers) this does nothing.
    """
    fired = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal fired
        if fired:
            return
        fired = True
        raise LaunchCancelled(
            f"received {signal.Signals(signum).name}: the run was cancelled", reason="Cancelled"
        )

    signals = [signal.SIGTERM] + ([] if ignored(signal.SIGHUP) else [signal.SIGHUP])
    with signal_handlers(dict.fromkeys(signals, handler)):
        yield
