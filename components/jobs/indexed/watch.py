"""The Job launcher's watch step: follow the Job until its Complete or Failed condition.

Each new state of the Job is said as it comes: a condition turning True (the interim
SuccessCriteriaMet and FailureTarget of Kubernetes 1.31 included) and the indexes completed
and failed so far. Transient API failures are waited out, up to MAX_API_FAULTS in a row, as
the TFJob launcher's watch does (components/jobs/tfjob/watch.py); an expired resourceVersion
(410 Gone) re-reads the job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.jobs import follow
from components.jobs.errors import LaunchError
from components.jobs.indexed.api import JobApi
from components.jobs.indexed.status import finished


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
        return follow.window(self.api, deadline, self.poll_seconds)

    def _recover(
        self, exc: Exception, faults: int, *, counted: bool = True
    ) -> tuple[dict[str, Any], int]:
        return follow.reread(self.api, exc, faults, counted=counted)

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
