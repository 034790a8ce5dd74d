"""The launcher's watch step: follow the TFJob until it Succeeded or Failed.

Each new state of the job is observed whole: its conditions, its pods (their image digests and
failed exits), workers that cannot start (start.py), the restart step (backoff.py), and a
worker's permanent exit while the job shows Restarting, which the operator would not end
(kubeflow/trainer#2044). The job is watched, and its pods read again on every change of the
job and at least every `poll_seconds`. Transient API failures (an apiserver restart, a dropped
connection) are waited out, up to MAX_API_FAULTS in a row: a day-long job must not fail on one,
since KFP 2.5 does not retry the step inside the exit handler, which would then delete it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from components.jobs import follow, kube
from components.jobs.spec import is_retryable_exit_code
from components.jobs.tfjob.api import TFJobApi
from components.jobs.tfjob.backoff import take_restarts
from components.jobs.tfjob.manifest import CONTAINER, GROUP, PLURAL, VERSION
from components.jobs.tfjob.start import cannot_start_error, not_starting
from components.jobs.tfjob.status import JobState, permanent_error, replica, terminated_exit


class Watch:
    """Follows one TFJob, keeping what it learns in `state`."""

    def __init__(
        self,
        api: TFJobApi,
        state: JobState,
        poll_seconds: int,
        start_grace_seconds: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api, self.state = api, state
        self.poll_seconds = poll_seconds  # longest single watch request
        self.start_grace_seconds = start_grace_seconds  # a worker that cannot start, this long
        self.clock = clock  # seconds, monotonic: what the start grace is measured by

    def until_finished(self, job: dict[str, Any], deadline: float | None) -> dict[str, Any]:
        """Follow the job until it Succeeded or Failed; return the last object seen."""
        from kubernetes.client.exceptions import ApiException

        faults = 0  # consecutive transient API failures
        while True:
            try:
                self.observe(job)
            except Exception as exc:
                job, faults = self._recover(exc, faults)
                continue
            if self.state.finished:
                return job
            window = self._window(deadline)
            try:
                job = self._follow(job, window)
                if self.state.finished:
                    return job
                faults = 0
            except ApiException as exc:
                # 410 Gone: our resourceVersion expired; re-read the job, no fault
                job, faults = self._recover(exc, faults, counted=exc.status != 410)
            except Exception as exc:  # a dropped or timed-out connection (urllib3)
                job, faults = self._recover(exc, faults)

    def _window(self, deadline: float | None) -> int:
        return follow.window(self.api, deadline, self.poll_seconds)

    def _follow(self, job: dict[str, Any], window: int) -> dict[str, Any]:
        """One watch request on the job: observe each change until it ends or the job finished."""
        from kubernetes import watch

        spec = self.api.spec
        for event in watch.Watch().stream(
            self.api.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            spec.namespace,
            PLURAL,
            field_selector=f"metadata.name={spec.name}",
            resource_version=job["metadata"]["resourceVersion"],
            timeout_seconds=window,
            _request_timeout=window + 30,
        ):
            if event["type"] == "DELETED":
                raise self.api.deleted()
            job = event["raw_object"]
            self.observe(job)
            if self.state.finished:
                break
        return job

    def _recover(
        self, exc: Exception, faults: int, *, counted: bool = True
    ) -> tuple[dict[str, Any], int]:
        return follow.reread(self.api, exc, faults, counted=counted)

    def observe(self, job: Mapping[str, Any]) -> None:
        """Take a new state of the job in: its conditions, its pods, its restarts."""
        api, state = self.api, self.state
        if job["metadata"].get("deletionTimestamp"):
            raise api.deleted()
        for cond in state.update(job):
            if cond.get("status") == "True":
                api.say(f"{cond['type']}: {cond.get('reason', '')}: {cond.get('message', '')}")
        uid = job["metadata"]["uid"]
        pods = api.pods(uid)
        self._take_pods(pods)
        take_restarts(api, state, pods, uid)
        if state.phase == "Restarting" and api.spec.restart_policy == "ExitCode":
            self._check_permanent(pods)

    def _take_pods(self, pods: list[Mapping[str, Any]]) -> None:
        """Keep the pods' image digests and failed exits; fail on a worker that cannot start."""
        state = self.state
        for pod in pods:
            image_id = kube.container_image_ids(pod).get(CONTAINER, "")
            if image_id:
                state.digests[pod["metadata"]["name"]] = image_id.rsplit("@", 1)[-1]
            state.saw_exit(pod)
        now = self.clock()
        problems = [p for pod in pods if (p := not_starting(pod, replica(pod))) is not None]
        for line in state.starts.observe(problems, now):
            self.api.say(line)
        if (stuck := state.starts.stuck(now, self.start_grace_seconds)) is not None:
            raise cannot_start_error(self.api.spec, *stuck)

    def _check_permanent(self, pods: list[Mapping[str, Any]]) -> None:
        """Fail a job stuck in Restarting although a worker exited with a permanent code."""
        for pod in pods:
            ended = terminated_exit(pod)
            if ended and not is_retryable_exit_code(ended[0]):
                tail = self.api.log_tail(pod["metadata"]["name"])
                raise permanent_error(self.api.spec, pod, ended[0], ended[1], tail)
