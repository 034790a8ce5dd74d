"""What both watchers of a job (tfjob/watch.py, indexed/watch.py) do the same way: size each
watch request to the launcher's deadline, and read the job again after a failed request."""

from __future__ import annotations

import time
from typing import Any, Protocol

from components.jobs import kube
from components.jobs.errors import LaunchError, LaunchTimeout

MAX_API_FAULTS = 10  # transient API failures in a row (about 2.5 min of backoff) before failing


class Watched(Protocol):
    """What both kinds' API wrappers offer a watcher."""

    spec: Any  # the job's spec: its name
    what: str  # how messages name the job

    def say(self, message: str) -> None: ...
    def get(self) -> dict[str, Any]: ...
    def deleted(self) -> LaunchError: ...


def window(api: Watched, deadline: float | None, poll_seconds: int) -> int:
    """Seconds of the next watch request; LaunchTimeout once `deadline` has passed."""
    remaining = None if deadline is None else deadline - time.monotonic()
    if remaining is not None and remaining <= 0:
        raise LaunchTimeout(
            f"{api.what} did not finish within the launcher's timeout; deleted it",
            reason="Timeout",
            job_name=api.spec.name,
        )
    seconds = poll_seconds if remaining is None else int(remaining) + 1
    return max(1, min(poll_seconds, seconds))


def reread(
    api: Watched, exc: Exception, faults: int, *, counted: bool = True
) -> tuple[dict[str, Any], int]:
    """After a failed request: wait out a transient failure (re-raise any other, or the
    MAX_API_FAULTS-th in a row), then read the job again, waiting out failures the same way.
    A job gone meanwhile (deleted while the watch was down) is the watch's DELETED."""
    if counted:
        faults = kube.wait_out(exc, faults, MAX_API_FAULTS, api.say, time.sleep)
    while True:
        try:
            return api.get(), faults
        except Exception as again:
            if getattr(again, "status", None) == 404:
                raise api.deleted() from None
            faults = kube.wait_out(again, faults, MAX_API_FAULTS, api.say, time.sleep)
