"""Run a `JobSpec` as a Kubeflow Training Operator v1 TFJob and watch it to the end.

The manifest comes from `tfjob_manifest` (which explains the replica layout). What the launcher
adds to the operator:
- it enforces `backoff_limit` itself: under `restartPolicy: ExitCode` the v1 operator recreates
  pods forever and ignores runPolicy.backoffLimit (kubeflow/trainer#2045);
- a worker that exits 1-127 while the job shows Restarting (kubeflow/trainer#2044) fails the job;
- SIGTERM (a cancelled run), its own timeout, or too many restarts DELETE the TFJob, since
  nobody else would stop it. A Failed job is left to `ttlSecondsAfterFinished`, and an API
  error leaves the job running, so that a retried launcher re-attaches to it.
"""

from __future__ import annotations

import collections
import logging
import math
import sys
import threading
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any, TextIO

from components import kube
from components.train.launcher import (
    JobSpec,
    LaunchCancelled,
    LaunchError,
    LaunchResult,
    LaunchTimeout,
    cancel_on_sigterm,
    format_failure,
    is_retryable_exit_code,
)
from components.train.tfjob_manifest import (
    CONTAINER,
    GROUP,
    LABEL_JOB_NAME,
    LABEL_REPLICA_INDEX,
    LABEL_REPLICA_TYPE,
    LABEL_RUN_ID,
    PLURAL,
    VERSION,
    build_manifest,
)
from contracts.errors import UserError

log = logging.getLogger(__name__)

TIMEOUT_SLACK_SECONDS = 900  # default launcher timeout beyond active_deadline_seconds


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _worker_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            return status
    return {}


def _replica(pod: Mapping[str, Any]) -> str:
    labels = pod["metadata"].get("labels") or {}
    return f"{labels.get(LABEL_REPLICA_TYPE, 'worker')}-{labels.get(LABEL_REPLICA_INDEX, '?')}"


def _terminated_exit(pod: Mapping[str, Any]) -> tuple[int, str] | None:
    """(exit code, reason) of the `tensorflow` container if it ended with a non-zero code."""
    terminated = (_worker_status(pod).get("state") or {}).get("terminated")
    if terminated and terminated.get("exitCode"):
        return int(terminated["exitCode"]), terminated.get("reason") or ""
    return None


class _JobState:
    """What the watcher has learned from the TFJob's status conditions."""

    def __init__(self) -> None:
        self.phase = ""  # type of the newest condition whose status is "True"
        self.condition: Mapping[str, Any] = {}  # that condition
        self.restarts = 0
        self.seen: set[tuple[str, str, str]] = set()

    def update(self, job: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        """Take the job's conditions in; return the conditions not seen before."""
        conditions = (job.get("status") or {}).get("conditions") or []
        new = []
        for cond in conditions:
            key = (cond.get("type", ""), cond.get("status", ""), cond.get("lastTransitionTime", ""))
            if key not in self.seen:
                self.seen.add(key)
                new.append(cond)
                if key[:2] == ("Restarting", "True"):
                    self.restarts += 1
        # The operator appends the newest condition last and flips earlier ones to "False".
        current = [c for c in conditions if c.get("status") == "True"]
        if current:
            self.condition = current[-1]
            self.phase = self.condition.get("type", "")
        return new

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


class _LogFollower(threading.Thread):
    """Streams worker 0's log into the step log, following each incarnation of its pod once."""

    def __init__(self, core: Any, spec: JobSpec, out: TextIO, tail_lines: int) -> None:
        super().__init__(name=f"logs-{spec.name}", daemon=True)
        self.core, self.spec, self.out = core, spec, out
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self._halt = threading.Event()
        self._final = threading.Event()
        self._selector = (
            f"{LABEL_JOB_NAME}={spec.name},{LABEL_REPLICA_TYPE}=worker,{LABEL_REPLICA_INDEX}=0"
        )

    def run(self) -> None:
        seen: set[str] = set()
        while not self._halt.is_set():
            try:
                pods = self.core.list_namespaced_pod(
                    self.spec.namespace, label_selector=self._selector
                ).items
                ready = [p for p in pods if p.status and p.status.phase != "Pending"]
                fresh = [p for p in ready if p.metadata.uid not in seen]
                if not fresh:
                    if self._final.is_set():
                        return
                    self._halt.wait(0.5)
                    continue
                pod = fresh[0]
                seen.add(pod.metadata.uid)
                self._follow(pod.metadata.name)
            except Exception as exc:  # the log is a convenience; never fail the job over it
                log.debug("following worker-0 log: %s", exc)
                self._halt.wait(0.5)

    def _follow(self, pod_name: str) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        resp = self.core.read_namespaced_pod_log(
            pod_name, self.spec.namespace, container=CONTAINER, follow=True, _preload_content=False
        )
        try:
            for line in iter_resp_lines(resp):
                if self._halt.is_set():
                    return
                self.tail.append(line)
                self.out.write(f"[{pod_name}] {line}\n")
                self.out.flush()
        finally:
            resp.release_conn()

    def finish(self, timeout: float) -> None:
        """Let the current stream drain (the pod has ended), then stop."""
        self._final.set()
        self.join(timeout)
        self.stop()

    def stop(self) -> None:
        """Stop writing. A stream still open is left to end with its pod: closing a response
        another thread is reading blocks on the reader's lock."""
        self._halt.set()


class TFJobLauncher:
    """Creates (or re-attaches to) a TFJob, watches it, streams worker 0's log, reports."""

    def __init__(
        self,
        api_client: Any = None,
        out: TextIO | None = None,
        *,
        poll_seconds: int = 30,
        log_tail_lines: int = 30,
    ) -> None:
        from kubernetes import client

        self.api_client = api_client if api_client is not None else kube.default_api_client()
        self.custom = client.CustomObjectsApi(self.api_client)
        self.core = client.CoreV1Api(self.api_client)
        self.out = out if out is not None else sys.stdout
        self.poll_seconds = poll_seconds  # longest single watch request
        self.log_tail_lines = log_tail_lines

    def run(self, spec: JobSpec, *, timeout_seconds: float | None = None) -> LaunchResult:
        """Run `spec` as a TFJob to the end; return the result or raise `LaunchError`.

        `timeout_seconds` defaults to active_deadline_seconds plus TIMEOUT_SLACK_SECONDS (no
        limit if neither is set). On the timeout, on SIGTERM and when restarts exceed
        `spec.backoff_limit`, the TFJob is deleted before the error is raised.
        """
        manifest = build_manifest(spec)
        if timeout_seconds is None and spec.active_deadline_seconds is not None:
            timeout_seconds = spec.active_deadline_seconds + TIMEOUT_SLACK_SECONDS
        started = time.monotonic()
        deadline = None if timeout_seconds is None else started + timeout_seconds
        state = _JobState()
        digests: dict[str, str] = {}
        with cancel_on_sigterm():
            follower = None
            try:
                job, reattached = self._create_or_attach(spec, manifest)
                follower = _LogFollower(self.core, spec, self.out, self.log_tail_lines)
                follower.start()
                job = self._watch(spec, job, state, deadline, digests)
                follower.finish(timeout=5)
            except (LaunchTimeout, LaunchCancelled, KeyboardInterrupt) as exc:
                if follower is not None:
                    follower.stop()
                self._delete(spec, why=type(exc).__name__)
                raise
            except LaunchError as exc:
                if follower is not None:
                    follower.stop()
                if exc.reason in ("BackoffLimitExceeded", "PermanentWorkerError"):
                    self._delete(spec, why=exc.reason)
                raise
        if state.phase == "Failed":
            raise self._failure(spec, state.condition, list(follower.tail))
        return self._result(spec, job, state, started, digests, reattached)

    def _create_or_attach(
        self, spec: JobSpec, manifest: Mapping[str, Any]
    ) -> tuple[dict[str, Any], bool]:
        from kubernetes.client.exceptions import ApiException

        try:
            job = self.custom.create_namespaced_custom_object(
                GROUP, VERSION, spec.namespace, PLURAL, manifest
            )
            self._say(f"created TFJob {spec.namespace}/{spec.name} ({spec.workers} workers)")
            return job, False
        except ApiException as exc:
            if exc.status != 409:
                raise
        job = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, spec.namespace, PLURAL, spec.name
        )
        owner_run = (job["metadata"].get("labels") or {}).get(LABEL_RUN_ID, "")
        if spec.run_id and owner_run != spec.run_id:
            raise UserError(
                f"TFJob {spec.namespace}/{spec.name} already exists for run {owner_run!r}, not "
                f"{spec.run_id!r}: choose another job name (launcher.job_name(run_id, task_id))"
            )
        self._say(f"re-attached to existing TFJob {spec.namespace}/{spec.name}")
        return job, True

    def _watch(
        self,
        spec: JobSpec,
        job: dict[str, Any],
        state: _JobState,
        deadline: float | None,
        digests: dict[str, str],
    ) -> dict[str, Any]:
        """Follow the job's conditions until it Succeeded or Failed; return the last object."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        self._observe(spec, job, state, digests)
        while not state.finished:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise LaunchTimeout(
                    f"TFJob {spec.namespace}/{spec.name} did not finish within the launcher's "
                    "timeout; deleted it",
                    reason="Timeout",
                    job_name=spec.name,
                )
            window = self.poll_seconds if remaining is None else math.ceil(remaining)
            window = max(1, min(self.poll_seconds, window))
            try:
                for event in watch.Watch().stream(
                    self.custom.list_namespaced_custom_object,
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
                        raise LaunchError(
                            f"TFJob {spec.namespace}/{spec.name} was deleted while running",
                            reason="Deleted",
                            job_name=spec.name,
                        )
                    job = event["raw_object"]
                    self._observe(spec, job, state, digests)
                    if state.finished:
                        break
            except ApiException as exc:
                if exc.status != 410:  # 410 Gone: our resourceVersion expired; re-read the job
                    raise
                job = self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, spec.namespace, PLURAL, spec.name
                )
                self._observe(spec, job, state, digests)
        return job

    def _observe(
        self, spec: JobSpec, job: Mapping[str, Any], state: _JobState, digests: dict[str, str]
    ) -> None:
        new = state.update(job)
        for cond in new:
            if cond.get("status") == "True":
                self._say(f"{cond['type']}: {cond.get('reason', '')}: {cond.get('message', '')}")
        if not new:
            return
        pods = self._pods(spec)
        for pod in pods:
            image_id = kube.container_image_ids(pod).get(CONTAINER, "")
            if image_id:
                digests[pod["metadata"]["name"]] = image_id.rsplit("@", 1)[-1]
        if state.restarts > spec.backoff_limit:
            raise LaunchError(
                f"TFJob {spec.namespace}/{spec.name} restarted {state.restarts} times, more than "
                f"backoff_limit={spec.backoff_limit}; deleted it",
                reason="BackoffLimitExceeded",
                job_name=spec.name,
            )
        if state.phase == "Restarting" and spec.restart_policy == "ExitCode":
            self._check_permanent(spec, pods)

    def _check_permanent(self, spec: JobSpec, pods: list[Mapping[str, Any]]) -> None:
        """Fail a job stuck in Restarting although a worker exited with a permanent code."""
        for pod in pods:
            ended = _terminated_exit(pod)
            if ended and not is_retryable_exit_code(ended[0]):
                tail = self._log_tail(spec, pod["metadata"]["name"])
                raise LaunchError(
                    format_failure(
                        f"TFJob {spec.namespace}/{spec.name}: a worker exited with permanent "
                        f"code {ended[0]} ({ended[1]}) while the job was Restarting; deleted it",
                        _replica(pod),
                        ended[0],
                        tail,
                    ),
                    reason="PermanentWorkerError",
                    job_name=spec.name,
                    replica=_replica(pod),
                    exit_code=ended[0],
                    log_tail=tail,
                )

    def _pods(self, spec: JobSpec) -> list[Mapping[str, Any]]:
        """The job's pods as plain JSON (the snake_case models lose nothing we need, but JSON
        keeps this module's field names the same as the manifest's)."""
        pods = self.core.list_namespaced_pod(
            spec.namespace, label_selector=f"{LABEL_JOB_NAME}={spec.name}"
        )
        return [self.api_client.sanitize_for_serialization(p) for p in pods.items]

    def _log_tail(self, spec: JobSpec, pod_name: str) -> list[str]:
        from kubernetes.client.exceptions import ApiException

        try:
            text = self.core.read_namespaced_pod_log(
                pod_name, spec.namespace, container=CONTAINER, tail_lines=self.log_tail_lines
            )
        except ApiException as exc:
            log.debug("reading the log of %s: %s", pod_name, exc)
            return []
        return text.splitlines()[-self.log_tail_lines :]

    def _failure(
        self, spec: JobSpec, condition: Mapping[str, Any], worker0_tail: list[str]
    ) -> LaunchError:
        """The error for a Failed job: the operator's reason, the failing worker, its log."""
        failed = [(pod, ended) for pod in self._pods(spec) if (ended := _terminated_exit(pod))]
        failed.sort(key=lambda pe: (pe[0].get("status") or {}).get("phase") != "Failed")
        replica: str | None = None
        exit_code: int | None = None
        tail = worker0_tail
        if failed:
            pod, (exit_code, _) = failed[0]
            replica = _replica(pod)
            tail = self._log_tail(spec, pod["metadata"]["name"]) or tail
        reason = condition.get("reason", "Failed")
        message = condition.get("message", "")
        head = f"TFJob {spec.namespace}/{spec.name} failed: {reason}: {message}"
        return LaunchError(
            format_failure(head, replica, exit_code, tail),
            reason=reason,
            job_name=spec.name,
            replica=replica,
            exit_code=exit_code,
            log_tail=tail,
        )

    def _result(
        self,
        spec: JobSpec,
        job: Mapping[str, Any],
        state: _JobState,
        started: float,
        digests: Mapping[str, str],
        reattached: bool,
    ) -> LaunchResult:
        status = job.get("status") or {}
        begin, end = _parse_time(status.get("startTime")), _parse_time(status.get("completionTime"))
        # The operator's times cover the whole job, including before a retried launcher attached.
        wall = (end - begin).total_seconds() if begin and end else time.monotonic() - started
        gpu_hours = spec.workers * spec.gpus_per_worker * wall / 3600
        self._say(f"succeeded in {wall:.0f} s, {gpu_hours:.3f} GPU-hours")
        return LaunchResult(
            launcher="tfjob",
            job_name=spec.name,
            workers=spec.workers,
            attempts=state.restarts + 1,
            restarts=state.restarts,
            wall_seconds=wall,
            gpu_hours=gpu_hours,
            image_digests=dict(digests),
            reattached=reattached,
        )

    def _delete(self, spec: JobSpec, why: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, spec.namespace, PLURAL, spec.name, propagation_policy="Foreground"
            )
            self._say(f"deleted TFJob {spec.namespace}/{spec.name} ({why})")
        except ApiException as exc:
            if exc.status != 404:
                self._say(f"could not delete TFJob {spec.namespace}/{spec.name}: {exc.reason}")

    def _say(self, message: str) -> None:
        self.out.write(f"[tfjob] {message}\n")
        self.out.flush()
