"""A cancelled run reaches the launcher as SIGTERM (or SIGHUP): `cancel_on_sigterm` turns it into
`LaunchCancelled`, so that the launcher stops its workers before it goes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from components.jobs.errors import LaunchCancelled
from contracts.process import raise_on_stop


@contextlib.contextmanager
def cancel_on_sigterm() -> Iterator[None]:
    """Turn the first SIGTERM (or SIGHUP) into `LaunchCancelled` while the block runs
    (`raise_on_stop`): the exception gives the launcher the pod's grace period to stop its
    workers or delete its TFJob, and a closed terminal does not orphan the workers (each in a
    session of its own)."""
    with raise_on_stop(lambda message: LaunchCancelled(message, reason="Cancelled")):
        yield
