"""The Job launcher's watch step: follow the Job until its Complete or Failed condition.

Each new state of the Job is said as it comes: a condition turning True (the interim
SuccessCriteriaMet and FailureTarget of Kubernetes 1.31 included) and the indexes completed
and failed so far. Transient API failures are waited out, up to MAX_API_FAULTS in a row, as
the TFJob launcher's watch does (components/jobs/tfjob/watch.py); an expired resourceVersion
(410 Gone) re-reads the job.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from components.jobs import kube
from components.jobs.errors import LaunchError, LaunchTimeout
from components.jobs.indexed.api import JobApi
from components.jobs.indexed.status import finished

MAX_API_FAULTS = 10  # transient API failures in a row (about 2.5 min of backoff) before failing


class Watch:
    """Follows one Job, saying what changes."""

    def __init__(self, api: JobApi, poll_seconds: int) -> None:
        self.api = api
        self.poll_seconds = poll_seconds  # longest single watch request
        self._said: set[tuple[str, str]] = set()  # conditions said: (type, reason)
        self._progress = ""

    def until_finished(self, job: dict[str, Any], deadline: float | None) -> dict[str, Any]:
        """Follow the job until it is Complete or Failed; return the last object seen."""
        from kubernetes.client.exceptions import ApiException

        faults = 0  # consecutive transient API failures
        while True:
            self.observe(job)
            if finished(job):
                return job
            window = self._window(deadline)
            try:
                for event in self.api.watch(job["metadata"]["resourceVersion"], window):
                    if event["type"] == "DELETED":
                        raise self.api.deleted()
                    job = event["object"]
                    self.observe(job)
                    if finished(job):
                        return job
                faults = 0
            except LaunchError:
                raise
            except ApiException as exc:
                job, faults = self._recover(exc, faults, counted=exc.status != 410)
            except Exception as exc:  # a dropped or timed-out connection (urllib3)
                job, faults = self._recover(exc, faults)

    def _window(self, deadline: float | None) -> int:
        """Seconds of the next watch request; LaunchTimeout once `deadline` has passed."""
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise LaunchTimeout(
                f"{self.api.what} did not finish within the launcher's timeout; deleted it",
                reason="Timeout",
                job_name=self.api.spec.name,
            )
        window = self.poll_seconds if remaining is None else int(remaining) + 1
        return max(1, min(self.poll_seconds, window))

    def _recover(
        self, exc: Exception, faults: int, *, counted: bool = True
    ) -> tuple[dict[str, Any], int]:
        """After a failed request: wait out a transient failure (re-raise any other), then
        read the job again, waiting out failures the same way."""
        if counted:
            faults = kube.wait_out(exc, faults, MAX_API_FAULTS, self.api.say, time.sleep)
        while True:
            try:
                return self.api.get(), faults
            except Exception as again:
                if getattr(again, "status", None) == 404:
                    raise self.api.deleted() from None
                faults = kube.wait_out(again, faults, MAX_API_FAULTS, self.api.say, time.sleep)

    def observe(self, job: Mapping[str, Any]) -> None:
        """Say what is new in this state of the job: conditions, indexes done and failed."""
        if job["metadata"].get("deletionTimestamp"):
            raise self.api.deleted()
        status = job.get("status") or {}
        for cond in status.get("conditions") or []:
            key = (cond.get("type", ""), cond.get("reason", ""))
            if cond.get("status") == "True" and key not in self._said:
                self._said.add(key)
                self.api.say(f"{key[0]}: {key[1]}: {cond.get('message', '')}")
        progress = (
            f"{status.get('succeeded', 0)}/{self.api.spec.completions} indexes completed "
            f"({status.get('completedIndexes') or 'none'}), failed: "
            f"{status.get('failedIndexes') or 'none'}, failed pods: {status.get('failed', 0)}"
        )
        if progress != self._progress:
            self._progress = progress
            self.api.say(progress)
