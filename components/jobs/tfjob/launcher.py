"""Run a `JobSpec` as a Kubeflow Training Operator v1 TFJob and watch it to the end.

The manifest comes from `tfjob_manifest` (which explains the replica layout). What the launcher
adds to the operator:
- it counts restarts of the whole worker group, not failed pods (`tfjob_restarts`), keeps the
  count in annotations on the TFJob so that a retried launcher continues it, and enforces
  `backoff_limit` itself: under `restartPolicy: ExitCode` the v1 operator recreates pods
  forever and ignores runPolicy.backoffLimit (kubeflow/trainer#2045);
- a worker that exits 1-127 while the job shows Restarting (kubeflow/trainer#2044) fails the job;
- a worker that cannot start (an image pull, a missing Secret) fails the job after
  `start_grace_seconds`; one no node takes is said (`tfjob_start`);
- it says which worker exited how, at each restart and in its error: from the pods it lists
  and, since the operator deletes failed pods at once, from the operator's ExitedWithCode events
  on the job (`tfjob_status`);
- SIGTERM (a cancelled run), its own timeout, or too many restarts DELETE the TFJob, since
  nobody else would stop it. A Failed job is left to `ttlSecondsAfterFinished` (its pods keep
  the logs), and an API error leaves the job running, for a retried launcher to re-attach to;
  one that finds the job Failed runs it again, unless it ran past its deadline.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

from components.jobs import kube
from components.jobs.cancel import cancel_on_sigterm
from components.jobs.errors import LaunchCancelled, LaunchError, LaunchTimeout, format_failure
from components.jobs.launcher import LaunchResult
from components.jobs.spec import JobSpec, is_retryable_exit_code
from components.jobs.tfjob.logs import LogFollower
from components.jobs.tfjob.manifest import (
    CONTAINER,
    GROUP,
    LABEL_JOB_NAME,
    LABEL_RUN_ID,
    PLURAL,
    VERSION,
    build_manifest,
    worker0_selector,
)
from components.jobs.tfjob.restarts import RestartLedger
from components.jobs.tfjob.start import START_GRACE_SECONDS, cannot_start_error, not_starting
from components.jobs.tfjob.status import (
    BACKOFF_MESSAGE,
    EXITED_REASON,
    JobState,
    WorkerExit,
    condition_true,
    event_exits,
    failure_error,
    merge_exits,
    past_deadline_error,
    permanent_error,
    replica,
    terminated_exit,
)
from contracts.errors import UserError

TIMEOUT_SLACK_SECONDS = 900  # default launcher timeout beyond active_deadline_seconds
DELETE_WAIT_SECONDS = 300  # how long a re-attach waits for a Failed job to be deleted
_EPOCH = datetime.fromtimestamp(0, UTC)
EVENTS_TIMEOUT_SECONDS = 30  # reading the job's events, a diagnosis: never waited on for long
MAX_API_FAULTS = 10  # transient API failures in a row (about 2.5 min of backoff) before failing


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


class TFJobLauncher:
    """Creates (or re-attaches to) a TFJob, watches it, streams worker 0's log, reports."""

    def __init__(
        self,
        api_client: Any = None,
        out: TextIO | None = None,
        *,
        poll_seconds: int = 30,
        log_tail_lines: int = 30,
        start_grace_seconds: float = START_GRACE_SECONDS,
    ) -> None:
        from kubernetes import client

        self.api_client = api_client if api_client is not None else kube.default_api_client()
        self.custom = client.CustomObjectsApi(self.api_client)
        self.core = client.CoreV1Api(self.api_client)
        self.out = out if out is not None else sys.stdout
        self.poll_seconds = poll_seconds  # longest single watch request
        self.log_tail_lines = log_tail_lines
        self.start_grace_seconds = start_grace_seconds  # a worker that cannot start, this long

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
        with cancel_on_sigterm():
            follower = None
            try:
                job, reattached = self._create_or_attach(spec, manifest)
                annotations = job["metadata"].get("annotations") or {}
                state = JobState(RestartLedger.from_annotations(spec.workers, annotations))
                follower = LogFollower(self.core, spec, self.out, self.log_tail_lines)
                follower.start()
                job = self._watch(spec, job, state, deadline)
                follower.finish(timeout=5)
            except (LaunchTimeout, LaunchCancelled, KeyboardInterrupt) as exc:
                if follower is not None:
                    follower.stop()
                if getattr(exc, "reason", "") != "DeadlineExceeded":  # that job stays: a record
                    self._delete(spec, why=type(exc).__name__)
                raise
            except LaunchError as exc:
                if follower is not None:
                    follower.stop()
                if exc.reason in _ENDED_BY_US:
                    self._delete(spec, why=exc.reason)
                raise
        if state.phase == "Failed":
            tail = list(follower.tail) if follower else []
            raise self._failure(spec, job["metadata"]["uid"], state, tail)
        return self._result(spec, job, state, started, reattached)

    def _create_or_attach(
        self, spec: JobSpec, manifest: Mapping[str, Any]
    ) -> tuple[dict[str, Any], bool]:
        """Create the job; if it exists, re-attach to it, or run it again if it Failed."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self._create(spec, manifest), False
        except ApiException as exc:
            if exc.status in (403, 404):
                raise UserError(_setup_problem(spec, exc.status)) from None
            if exc.status != 409:
                raise
        job = self._get(spec)
        owner_run = (job["metadata"].get("labels") or {}).get(LABEL_RUN_ID, "")
        if spec.run_id and owner_run != spec.run_id:
            raise UserError(
                f"TFJob {spec.namespace}/{spec.name} already exists for run {owner_run!r}, not "
                f"{spec.run_id!r}: choose another job name (launcher.job_name(run_id, task_id))"
            )
        failed = condition_true(job, "Failed")
        if failed is None and not job["metadata"].get("deletionTimestamp"):
            self._say(f"re-attached to existing TFJob {spec.namespace}/{spec.name}")
            return job, True
        if failed is not None and (past := past_deadline_error(spec, failed)) is not None:
            raise past
        if failed is not None:
            self._say(
                f"TFJob {spec.namespace}/{spec.name} failed in an earlier attempt "
                f"({failed.get('reason', '')}: {failed.get('message', '')}); running it again"
            )
            self._delete(spec, why="Failed in an earlier attempt")
        self._wait_gone(spec, job["metadata"]["uid"])
        return self._create(spec, manifest), False

    def _create(self, spec: JobSpec, manifest: Mapping[str, Any]) -> dict[str, Any]:
        job = self.custom.create_namespaced_custom_object(
            GROUP, VERSION, spec.namespace, PLURAL, manifest
        )
        self._say(f"created TFJob {spec.namespace}/{spec.name} ({spec.workers} workers)")
        return dict(job)

    def _get(self, spec: JobSpec) -> dict[str, Any]:
        return dict(
            self.custom.get_namespaced_custom_object(
                GROUP, VERSION, spec.namespace, PLURAL, spec.name
            )
        )

    def _wait_gone(self, spec: JobSpec, uid: str) -> None:
        """Wait until the job with `uid` is deleted (its pods first: foreground deletion)."""
        from kubernetes.client.exceptions import ApiException

        until = time.monotonic() + DELETE_WAIT_SECONDS
        while time.monotonic() < until:
            try:
                if self._get(spec)["metadata"]["uid"] != uid:
                    return
            except ApiException as exc:
                if exc.status == 404:
                    return
                raise
            time.sleep(1)
        raise LaunchError(
            f"TFJob {spec.namespace}/{spec.name} was not deleted within {DELETE_WAIT_SECONDS} s; "
            "delete it (kubectl delete tfjob) and retry",
            reason="DeleteTimeout",
            job_name=spec.name,
        )

    def _watch(
        self, spec: JobSpec, job: dict[str, Any], state: JobState, deadline: float | None
    ) -> dict[str, Any]:
        """Follow the job until it Succeeded or Failed; return the last object seen.

        The pods are read again on every change of the job and at least every poll_seconds.
        """
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        faults = 0  # consecutive transient API failures
        while True:
            try:
                self._observe(spec, job, state)
            except Exception as exc:
                faults = self._transient(spec, exc, faults)
                job, faults = self._get_when_reachable(spec, faults)
                continue
            if state.finished:
                return job
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise LaunchTimeout(
                    f"TFJob {spec.namespace}/{spec.name} did not finish within the launcher's "
                    "timeout; deleted it",
                    reason="Timeout",
                    job_name=spec.name,
                )
            window = self.poll_seconds if remaining is None else int(remaining) + 1
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
                        raise self._deleted(spec)
                    job = event["raw_object"]
                    self._observe(spec, job, state)
                    if state.finished:
                        return job
                faults = 0
            except ApiException as exc:
                if exc.status != 410:  # 410 Gone: our resourceVersion expired; re-read the job
                    faults = self._transient(spec, exc, faults)
                job, faults = self._get_when_reachable(spec, faults)
            except Exception as exc:  # a dropped or timed-out connection (urllib3)
                faults = self._transient(spec, exc, faults)
                job, faults = self._get_when_reachable(spec, faults)

    def _transient(self, spec: JobSpec, exc: Exception, faults: int) -> int:
        """Wait out a transient API failure (429, 5xx, a lost connection); re-raise others.

        A day-long job must not fail on an apiserver restart: KFP 2.5 does not retry the step
        inside the exit handler, and the exit handler would then delete the TFJob. After
        MAX_API_FAULTS failures in a row, the error is real.
        """
        return kube.wait_out(exc, faults, MAX_API_FAULTS, self._say, time.sleep)

    def _get_when_reachable(self, spec: JobSpec, faults: int) -> tuple[dict[str, Any], int]:
        """Read the job again, waiting out transient failures; the count goes on from `faults`.
        A job gone meanwhile (deleted while the watch was down) is the watch's DELETED."""
        while True:
            try:
                return self._get(spec), faults
            except Exception as exc:
                if getattr(exc, "status", None) == 404:
                    raise self._deleted(spec) from None
                faults = self._transient(spec, exc, faults)

    def _deleted(self, spec: JobSpec) -> LaunchError:
        return LaunchError(
            f"TFJob {spec.namespace}/{spec.name} was deleted while running",
            reason="Deleted",
            job_name=spec.name,
        )

    def _observe(self, spec: JobSpec, job: Mapping[str, Any], state: JobState) -> None:
        """Take a new state of the job in: its conditions, its pods, its restarts."""
        if job["metadata"].get("deletionTimestamp"):
            raise self._deleted(spec)
        for cond in state.update(job):
            if cond.get("status") == "True":
                self._say(f"{cond['type']}: {cond.get('reason', '')}: {cond.get('message', '')}")
        uid = job["metadata"]["uid"]
        pods = self._pods(spec, uid)
        for pod in pods:
            image_id = kube.container_image_ids(pod).get(CONTAINER, "")
            if image_id:
                state.digests[pod["metadata"]["name"]] = image_id.rsplit("@", 1)[-1]
            state.saw_exit(pod)
        now = time.monotonic()
        problems = [p for pod in pods if (p := not_starting(pod, replica(pod))) is not None]
        for line in state.starts.observe(problems, now):
            self._say(line)
        if (stuck := state.starts.stuck(now, self.start_grace_seconds)) is not None:
            raise cannot_start_error(spec, *stuck)
        before = state.ledger.restarts
        state.unrecorded |= state.ledger.observe(pods)  # stays set if the patch raises
        if state.unrecorded:
            state.unrecorded = not self._record_restarts(spec, state.ledger)
        restarted = state.ledger.restarts > before
        if restarted or state.ledger.restarts > spec.backoff_limit:
            exits = self._exits(spec, uid, state)
            if restarted:
                self._say(
                    f"all {spec.workers} workers restarted: restart {state.ledger.restarts}"
                    + (f"; worker exits so far: {_listed(exits)}" if exits else "")
                )
            if state.ledger.restarts > spec.backoff_limit:
                raise _backoff_error(spec, state.ledger.restarts, exits)
        if state.phase == "Restarting" and spec.restart_policy == "ExitCode":
            self._check_permanent(spec, pods)

    def _record_restarts(self, spec: JobSpec, ledger: RestartLedger) -> bool:
        """Keep the ledger on the job (a merge patch of its annotations); False if that failed,
        and the next observation tries again: a launcher that re-attaches counts from it."""
        from kubernetes.client.exceptions import ApiException

        patch = {"metadata": {"annotations": ledger.annotations()}}
        try:
            self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, spec.namespace, PLURAL, spec.name, patch
            )
        except ApiException as exc:
            self._say(f"could not record restarts on TFJob {spec.name}: {exc.status} {exc.reason}")
            return False
        return True

    def _check_permanent(self, spec: JobSpec, pods: list[Mapping[str, Any]]) -> None:
        """Fail a job stuck in Restarting although a worker exited with a permanent code."""
        for pod in pods:
            ended = terminated_exit(pod)
            if ended and not is_retryable_exit_code(ended[0]):
                tail = self._log_tail(spec, pod["metadata"]["name"])
                raise permanent_error(spec, pod, ended[0], ended[1], tail)

    def _pods(self, spec: JobSpec, job_uid: str = "") -> list[Mapping[str, Any]]:
        """The job's pods as plain JSON (this module's field names are the manifest's). With
        `job_uid`, only the pods of that incarnation of the job (its ownerReference)."""
        pods = self.core.list_namespaced_pod(
            spec.namespace, label_selector=f"{LABEL_JOB_NAME}={spec.name}"
        )
        found = [self.api_client.sanitize_for_serialization(p) for p in pods.items]
        if not job_uid:
            return found
        return [
            p
            for p in found
            if any(r.get("uid") == job_uid for r in p["metadata"].get("ownerReferences") or [])
        ]

    def worker0_log(self, spec: JobSpec, tail_lines: int) -> list[str]:
        """The last `tail_lines` lines of worker 0's log, read from its newest pod once the job
        has ended, so not from the stream that followed it. A job that succeeded, or failed by
        a worker's exit, keeps its pods until its TTL (cleanPodPolicy `Running` deletes only
        running ones); one the operator failed past its deadline or backoff limit has none
        left (it deletes them all), and then this is []."""
        pods = self.core.list_namespaced_pod(
            spec.namespace, label_selector=worker0_selector(spec.name)
        ).items
        if not pods:
            return []
        newest = max(pods, key=lambda p: p.metadata.creation_timestamp or _EPOCH)
        return self._log_tail(spec, newest.metadata.name, tail_lines)

    def _log_tail(self, spec: JobSpec, pod_name: str, lines: int | None = None) -> list[str]:
        from kubernetes.client.exceptions import ApiException

        lines = lines or self.log_tail_lines
        try:
            # The raw body: deserialised, a log that is one JSON value comes back as its
            # Python repr (kubernetes-client/python#811, #1354).
            response = self.core.read_namespaced_pod_log(
                pod_name,
                spec.namespace,
                container=CONTAINER,
                tail_lines=lines,
                _preload_content=False,
            )
            text = response.data.decode("utf-8", errors="replace")
        except ApiException as exc:
            self._say(f"could not read the log of {pod_name}: {exc.status} {exc.reason}")
            return []
        return text.splitlines()[-lines:]

    def _exits(self, spec: JobSpec, job_uid: str, state: JobState) -> list[WorkerExit]:
        """The job's failed worker exits, the likely cause first: those the pod listings showed
        and those the operator's ExitedWithCode events on this job (by uid) recorded.

        A diagnosis only: whatever goes wrong reading the events (no rights, an outage, a body
        the client cannot read) is said once per kind and never fails or delays the job.
        """
        recorded: list[WorkerExit] = []
        try:
            # The raw body, as _log_tail reads it: the client's models are not needed here.
            response = self.core.list_namespaced_event(
                spec.namespace,
                field_selector=f"involvedObject.uid={job_uid},reason={EXITED_REASON}",
                _preload_content=False,
                _request_timeout=EVENTS_TIMEOUT_SECONDS,
            )
            recorded = event_exits(json.loads(response.data).get("items") or [], spec.name)
        except LaunchError:  # SIGTERM's LaunchCancelled, raised wherever the main thread is
            raise
        except Exception as exc:
            brief = kube.api_error_brief(exc)
            if brief not in state.events_failures:
                state.events_failures.add(brief)
                rights = getattr(exc, "status", None) == 403
                self._say(
                    f"could not read TFJob {spec.name}'s events ({brief}): which worker exited "
                    "how is shown as far as the pod listings saw it"
                    + ("; deploy/rbac.yaml grants list on events" if rights else "")
                )
        return merge_exits(state.exits, recorded)

    def _failure(
        self, spec: JobSpec, job_uid: str, state: JobState, worker0_tail: list[str]
    ) -> LaunchError:
        """The error for a Failed job, with the failing worker's log (worker 0's if none)."""
        failed = [pod for pod in self._pods(spec) if terminated_exit(pod)]
        failed.sort(key=lambda pod: (pod.get("status") or {}).get("phase") != "Failed")
        tail = worker0_tail
        cause = None
        if failed:
            tail = self._log_tail(spec, failed[0]["metadata"]["name"]) or tail
        elif BACKOFF_MESSAGE in state.condition.get("message", ""):
            # Past its backoff limit the operator deleted every pod: the exits that took it
            # there are in its events. Past a deadline, no exit is the cause.
            cause = next(iter(self._exits(spec, job_uid, state)), None)
        return failure_error(spec, state.condition, failed[0] if failed else None, tail, cause)

    def _result(
        self,
        spec: JobSpec,
        job: Mapping[str, Any],
        state: JobState,
        started: float,
        reattached: bool,
    ) -> LaunchResult:
        status = job.get("status") or {}
        begin, end = _parse_time(status.get("startTime")), _parse_time(status.get("completionTime"))
        # The operator's times cover the whole job, including before a retried launcher attached.
        wall = (end - begin).total_seconds() if begin and end else time.monotonic() - started
        gpu_hours = spec.workers * spec.gpus_per_worker * wall / 3600
        restarts = state.ledger.restarts
        self._say(f"succeeded in {wall:.0f} s after {restarts} restarts, {gpu_hours:.3f} GPU-hours")
        return LaunchResult(
            launcher="tfjob",
            job_name=spec.name,
            workers=spec.workers,
            attempts=restarts + 1,
            restarts=restarts,
            wall_seconds=wall,
            gpu_hours=gpu_hours,
            image_digests=dict(state.digests),
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


# The errors by which the launcher ends a job the operator would go on running (restarts past
# the backoff limit; a worker's permanent exit, or its exit 2 naming its bad input, while the
# job is Restarting: kubeflow/trainer#2044; a worker that cannot start: tfjob_start): the job
# is deleted, its workers' GPUs freed.
_ENDED_BY_US = frozenset(
    {"BackoffLimitExceeded", "PermanentWorkerError", "WorkerInputError", "WorkerCannotStart"}
)


def _listed(exits: list[WorkerExit]) -> str:
    return "; ".join(e.describe() for e in exits)


def _backoff_error(spec: JobSpec, restarts: int, exits: list[WorkerExit]) -> LaunchError:
    """Restarts past `backoff_limit`: the error names the exits that caused them, if known."""
    head = (
        f"TFJob {spec.namespace}/{spec.name} restarted {restarts} times, "
        f"more than backoff_limit={spec.backoff_limit}; deleted it"
    )
    if exits:
        head += f"\nworker exits: {_listed(exits)}"
    if any(e.code == 137 for e in exits):  # what a user can change about it
        head += (
            f"\neach worker has {spec.memory} of memory (the pipeline's worker_memory): "
            "raise it, or lower train.batch_size, if the exits were the OOM killer's"
        )
    cause = exits[0] if exits else None
    return LaunchError(
        format_failure(
            head,
            cause.replica if cause else None,
            cause.code if cause else None,
            (),
        ),
        reason="BackoffLimitExceeded",
        job_name=spec.name,
        replica=cause.replica if cause else None,
        exit_code=cause.code if cause else None,
    )


def _setup_problem(spec: JobSpec, status: int) -> str:
    """What a 403 or 404 on creating a TFJob means for the person setting the cluster up."""
    if status == 403:
        return (
            f"not allowed to create TFJobs in namespace {spec.namespace}: apply "
            "deploy/rbac.yaml there, for the service account the pipeline's steps run as; run "
            "from your own machine (gptpipe gpu-bench), your kubeconfig's user needs the rights "
            "that file's Role grants"
        )
    return (
        f"the cluster has no TFJob resource ({GROUP}/{VERSION} {PLURAL}): install the Kubeflow "
        "Training Operator 1.9 with its TFJob CRD"
    )
