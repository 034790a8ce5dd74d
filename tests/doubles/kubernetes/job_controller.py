"""The Kubernetes Job controller (and the TTL-after-finished controller), played on the double.

A reconcile loop over every batch/v1 Job, written from the Kubernetes 1.31 source (paths in
github.com/kubernetes/kubernetes at v1.31; "jc.go" is pkg/controller/job/job_controller.go,
"indexed.go" pkg/controller/job/indexed_job_utils.go). Each behaviour names its function:
- `syncJob` (jc.go): a Job finished (Complete or Failed) is left alone; startTime on its first
  sync; the failure checks in order: a pod matching a FailJob rule (`getFailJobMessage`,
  reason PodFailurePolicy), failed pods past backoffLimit (BackoffLimitExceeded), past
  activeDeadlineSeconds (`pastActiveDeadline`, DeadlineExceeded), and, with
  backoffLimitPerIndex, every index ended with some failed (FailedIndexes); success when every
  index succeeded;
- since 1.31 the finished condition comes in two steps (`newFailureCondition`,
  `newSuccessCondition`, `delayTerminalCondition`, JobPodReplacementPolicy on by default):
  FailureTarget or SuccessCriteriaMet first (reason CompletionsReached, JobSuccessPolicy),
  the active pods deleted (`deleteActivePods`), and Failed or Complete with the same reason and
  message once no pod is left running or terminating (`trackJobStatusAndRemoveFinalizers`,
  `enactJobFinished`); completionTime only on success; the Warning event with the failure's
  reason, or Normal "Completed" "Job completed";
- pods of an Indexed Job (`manageJob`, indexed.go `firstPendingIndexes`): the lowest pending
  indexes, at most `parallelism` active, none for an index that succeeded, failed, or has a
  pod running or terminating (podReplacementPolicy Failed, the default with a
  podFailurePolicy); each named `<job>-<index>-<5 random>` (`podGenerateNameWithIndex`, the
  apiserver's generateName), hostname `<job>-<index>`, the index as annotation and label
  `batch.kubernetes.io/job-completion-index` (`addCompletionIndexAnnotation`, PodIndexLabel)
  and as JOB_COMPLETION_INDEX through the downward API (`addCompletionIndexEnvVariable`), a
  controller ownerReference, the "Created pod" event (pkg/controller/controller_utils.go);
- `backoffLimitPerIndex` (indexed.go `getNewIndexFailureCounts`, `isIndexFailed`,
  `calculateFailedIndexes`): a new pod of an index carries the annotations
  `batch.kubernetes.io/job-index-failure-count` (counted failures before it) and
  `...-ignored-failure-count`; the index fails when a pod with `failure-count >= limit` fails
  counted, or matches a FailIndex rule; recreation waits `backoff * 2^(failures-1)`
  (backoff_utils.go `getRemainingTimePerIndex`; 10 s upstream, `backoff_seconds` here);
- `podFailurePolicy` (pod_failure_policy.go `matchPodFailurePolicy`): the first rule matching a
  failed pod decides: FailJob, FailIndex, Ignore (not counted in `failed`, the index run again)
  or Count; onExitCodes (In / NotIn, an optional containerName, exit 0 never matches) and
  onPodConditions (type and status);
- status: active, ready, terminating, succeeded, failed, completedIndexes and failedIndexes as
  interval strings ("0-2,5", indexed.go `orderedIntervals.String`);
- a pod is failed when its phase is Failed, or it vanished while not Succeeded: the pods keep
  the `batch.kubernetes.io/job-tracking` finalizer upstream until the controller counted them;
  here the controller keeps the last state it saw of each pod instead (not the finalizer);
- ttlSecondsAfterFinished (pkg/controller/ttlafterfinished/ttlafterfinished_controller.go
  `processJob`, `processTTL`): a finished Job is deleted, Foreground, once its terminal
  condition's lastTransitionTime is that long ago.
"""

from __future__ import annotations

import calendar
import copy
import random
import threading
import time
from typing import Any

from tests.doubles.kubernetes.events import EventRecorder
from tests.doubles.kubernetes.store import Cluster, now

Json = dict[str, Any]
CONTROLLER = "job-controller"
INDEX = "batch.kubernetes.io/job-completion-index"  # annotation and label
FAILURES = "batch.kubernetes.io/job-index-failure-count"
IGNORED = "batch.kubernetes.io/job-index-ignored-failure-count"
INDEX_ENV = "JOB_COMPLETION_INDEX"
RESYNC_SECONDS = 0.05
MAX_BACKOFF_SECONDS = 600.0  # DefaultJobPodFailureBackOff's cap, MaxJobPodFailureBackOff
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery util/rand `alphanums`


def intervals(indexes: set[int]) -> str:
    """indexed.go orderedIntervals.String: "0-2,5"."""
    spans: list[list[int]] = []
    for index in sorted(indexes):
        if spans and index == spans[-1][1] + 1:
            spans[-1][1] = index
        else:
            spans.append([index, index])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def parse_intervals(text: str) -> set[int]:
    found: set[int] = set()
    for term in filter(None, (text or "").split(",")):
        first, _, last = term.partition("-")
        found.update(range(int(first), int(last or first) + 1))
    return found


def _is(status: Json, kind: str) -> Json | None:
    for cond in status.get("conditions") or []:
        if cond["type"] == kind and cond["status"] == "True":
            return dict(cond)
    return None


def _condition(kind: str, reason: str, message: str) -> Json:
    """jc.go newCondition."""
    stamp = now()
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastProbeTime": stamp,
        "lastTransitionTime": stamp,
    }


def _index(pod: Json) -> int:
    """indexed.go getCompletionIndex: the annotation, -1 if none or not a number."""
    value = (pod["metadata"].get("annotations") or {}).get(INDEX, "")
    return int(value) if value.isdigit() else -1


def _annotation(pod: Json, key: str) -> int:
    return int((pod["metadata"].get("annotations") or {}).get(key, "0"))


def _terminal(pod: Json) -> bool:
    return pod["status"].get("phase") in ("Succeeded", "Failed")


def _active(pod: Json) -> bool:
    """controller.FilterActivePods: not terminal and not being deleted."""
    return not _terminal(pod) and not pod["metadata"].get("deletionTimestamp")


def match_pod_failure_policy(policy: Json | None, pod: Json) -> tuple[str | None, bool, str]:
    """pod_failure_policy.go matchPodFailurePolicy: (the FailJob message, whether the failure
    counts, the action matched or "")."""
    for i, rule in enumerate((policy or {}).get("rules") or []):
        action = rule["action"]
        if (codes := rule.get("onExitCodes")) is not None:
            status = _matching_container(pod, codes)
            if status is None:
                continue
            code = status["state"]["terminated"]["exitCode"]
            msg = (
                f"Container {status['name']} for pod {pod['metadata']['namespace']}/"
                f"{pod['metadata']['name']} failed with exit code {code} matching {action} "
                f"rule at index {i}"
            )
        elif (patterns := rule.get("onPodConditions")) is not None:
            cond = next(
                (
                    c
                    for c in pod["status"].get("conditions") or []
                    for p in patterns
                    if c["type"] == p["type"] and c["status"] == p.get("status", "True")
                ),
                None,
            )
            if cond is None:
                continue
            msg = (
                f"Pod {pod['metadata']['namespace']}/{pod['metadata']['name']} has condition "
                f"{cond['type']} matching {action} rule at index {i}"
            )
        else:
            continue
        return (msg if action == "FailJob" else None), action != "Ignore", action
    return None, True, ""


def _matching_container(pod: Json, codes: Json) -> Json | None:
    """pod_failure_policy.go getMatchingContainerFromList / isOnExitCodesOperatorMatching."""
    for status in pod["status"].get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated")
        if not terminated or codes.get("containerName") not in (None, status["name"]):
            continue
        code = terminated["exitCode"]
        if code != 0 and (code in codes["values"]) == (codes["operator"] == "In"):
            return dict(status)
    return None


class JobController:
    """The Job controller's and the TTL controller's loops, one pass every RESYNC_SECONDS."""

    def __init__(self, cluster: Cluster, *, backoff_seconds: float = 10.0) -> None:
        self.cluster = cluster
        self.backoff_seconds = backoff_seconds  # DefaultJobPodFailureBackOff: 10 s upstream
        self.recorder = EventRecorder(cluster, CONTROLLER)
        self._pods: dict[str, dict[str, Json]] = {}  # job uid -> pod uid -> pod as last seen
        self._failed_at: dict[str, float] = {}  # pod uid -> when first seen failed (monotonic)
        self._started: dict[str, float] = {}  # job uid -> its startTime (monotonic)
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=CONTROLLER, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._halt.set()
        with self.cluster.cond:
            self.cluster.cond.notify_all()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        cluster = self.cluster
        with cluster.cond:
            while not self._halt.is_set() and not cluster.closed:
                for key in list(cluster.jobs):
                    self.reconcile(key)
                cluster.cond.wait(RESYNC_SECONDS)

    # -- syncJob --

    def reconcile(self, key: tuple[str, str]) -> None:
        """jc.go syncJob for an Indexed Job (lock held)."""
        job = self.cluster.jobs[key]
        if job["metadata"].get("deletionTimestamp"):
            return  # the garbage collector deletes its pods
        status = copy.deepcopy(job.get("status") or {})
        if _is(status, "Complete") or _is(status, "Failed"):
            self._ttl(key, job, status)
            return
        spec, uid = job["spec"], job["metadata"]["uid"]
        status.setdefault("startTime", now())
        self._started.setdefault(uid, time.monotonic())
        pods = self._seen_pods(job)
        failed = [p for p in pods if self._failed(p)]
        counted = [
            p for p in failed if match_pod_failure_policy(spec.get("podFailurePolicy"), p)[1]
        ]
        succeeded = parse_intervals(status.get("completedIndexes", "")) | {
            _index(p) for p in pods if p["status"].get("phase") == "Succeeded"
        }
        succeeded &= set(range(spec["completions"]))
        per_index = "backoffLimitPerIndex" in spec
        failed_indexes = self._failed_indexes(spec, failed) - succeeded if per_index else set()
        finishing = _is(status, "FailureTarget") or _is(status, "SuccessCriteriaMet")
        if finishing is None:
            finishing = self._finished_condition(job, failed, counted, succeeded, failed_indexes)
            if finishing is not None:
                status.setdefault("conditions", []).append(finishing)
                self._event_finished(job, finishing)
        if finishing is not None:
            for pod in pods:
                if _active(pod) and not pod.get("_gone"):
                    self._delete_pod(job, pod)
        else:
            self._manage(job, pods, succeeded, failed_indexes)
        self._update_status(job, status, pods, counted, succeeded, failed_indexes, finishing)
        self.cluster.set_job_status(key, status, resource="jobs")

    def _finished_condition(
        self, job: Json, failed: list[Json], counted: list[Json], ok: set[int], bad: set[int]
    ) -> Json | None:
        """The checks of syncJob, in its order (module docstring)."""
        spec, uid = job["spec"], job["metadata"]["uid"]
        policy = spec.get("podFailurePolicy")
        for pod in failed:  # getFailJobMessage
            message = match_pod_failure_policy(policy, pod)[0]
            if message is not None:
                return _condition("FailureTarget", "PodFailurePolicy", message)
        if len(counted) > spec["backoffLimit"]:
            message = "Job has reached the specified backoff limit"
            return _condition("FailureTarget", "BackoffLimitExceeded", message)
        deadline = spec.get("activeDeadlineSeconds")
        if deadline is not None and time.monotonic() - self._started[uid] >= deadline:
            message = "Job was active longer than specified deadline"
            return _condition("FailureTarget", "DeadlineExceeded", message)
        if bad and len(bad) + len(ok) >= spec["completions"]:
            return _condition("FailureTarget", "FailedIndexes", "Job has failed indexes")
        if len(ok) >= spec["completions"]:
            message = "Reached expected number of succeeded pods"
            return _condition("SuccessCriteriaMet", "CompletionsReached", message)
        return None

    def _event_finished(self, job: Json, cond: Json) -> None:
        if cond["type"] == "FailureTarget":
            self.recorder.event(job, "Job", "Warning", cond["reason"], cond["message"])
        else:
            self.recorder.event(job, "Job", "Normal", "Completed", "Job completed")

    def _seen_pods(self, job: Json) -> list[Json]:
        """The job's pods: those there now, and the last state seen of those gone (marked
        `_gone`), which the tracking finalizer would have kept for the controller to count."""
        seen = self._pods.setdefault(job["metadata"]["uid"], {})
        live = {p["metadata"]["uid"]: p for p in self.cluster.owned_pods(job)}
        for uid, pod in live.items():
            seen[uid] = copy.deepcopy(pod)
        for uid, pod in seen.items():
            if uid not in live:
                pod["_gone"] = True
        return list(seen.values())

    def _failed(self, pod: Json) -> bool:
        """jc.go isPodFailed, with podReplacementPolicy Failed; first seen failed when."""
        failed = pod["status"].get("phase") == "Failed" or (
            pod.get("_gone", False) and pod["status"].get("phase") != "Succeeded"
        )
        if failed:
            self._failed_at.setdefault(pod["metadata"]["uid"], time.monotonic())
        return failed

    def _failed_indexes(self, spec: Json, failed: list[Json]) -> set[int]:
        """indexed.go calculateFailedIndexes and isIndexFailed."""
        found = set()
        for pod in failed:
            _, counts, action = match_pod_failure_policy(spec.get("podFailurePolicy"), pod)
            over = counts and _annotation(pod, FAILURES) >= spec["backoffLimitPerIndex"]
            if (action == "FailIndex" or over) and 0 <= _index(pod) < spec["completions"]:
                found.add(_index(pod))
        return found

    # -- manageJob --

    def _manage(self, job: Json, pods: list[Json], succeeded: set[int], failed: set[int]) -> None:
        """jc.go manageJob for an Indexed Job: pods for the lowest pending indexes."""
        spec = job["spec"]
        busy = {_index(p) for p in pods if not _terminal(p) and not p.get("_gone")}
        active = sum(1 for p in pods if _active(p) and not p.get("_gone"))
        room = min(spec["parallelism"], spec["completions"] - len(succeeded)) - active
        for index in range(spec["completions"]):
            if room <= 0:
                break
            if index in succeeded or index in failed or index in busy:
                continue
            counts = self._failure_counts(spec, pods, index)
            if counts is None:
                continue  # still backing off
            self._create_pod(job, index, *counts)
            room -= 1

    def _failure_counts(self, spec: Json, pods: list[Json], index: int) -> tuple[int, int] | None:
        """indexed.go getNewIndexFailureCounts for the index's next pod, from its last failed
        one; None while backoff_utils.go's delay after that failure runs."""
        last = [p for p in pods if _index(p) == index and self._failed(p)]
        if not last:
            return 0, 0
        pod = last[-1]
        counts = match_pod_failure_policy(spec.get("podFailurePolicy"), pod)[1]
        failures = _annotation(pod, FAILURES) + (1 if counts else 0)
        ignored = _annotation(pod, IGNORED) + (0 if counts else 1)
        delay = min(self.backoff_seconds * 2 ** (failures + ignored - 1), MAX_BACKOFF_SECONDS)
        if time.monotonic() < self._failed_at[pod["metadata"]["uid"]] + delay:
            return None
        return failures, ignored

    def _create_pod(self, job: Json, index: int, failures: int, ignored: int) -> None:
        """The pod of `index` (module docstring), through podControl.CreatePodsWithGenerateName."""
        meta, spec = job["metadata"], job["spec"]
        template = copy.deepcopy(spec["template"])
        pod_meta = template.setdefault("metadata", {})
        annotations = {**(pod_meta.get("annotations") or {}), INDEX: str(index)}
        if "backoffLimitPerIndex" in spec:
            annotations[FAILURES] = str(failures)
            if ignored:
                annotations[IGNORED] = str(ignored)
        pod_spec = template["spec"]
        pod_spec.setdefault("hostname", f"{meta['name']}-{index}")
        for container in pod_spec["containers"] + pod_spec.get("initContainers", []):
            env = container.setdefault("env", [])
            if not any(e["name"] == INDEX_ENV for e in env):
                field = {"fieldPath": f"metadata.annotations['{INDEX}']"}
                env.append({"name": INDEX_ENV, "valueFrom": {"fieldRef": field}})
        suffix = "".join(random.choices(_NAME_CHARS, k=5))
        owner = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        pod_meta.update(
            name=f"{meta['name']}-{index}-{suffix}",
            namespace=meta["namespace"],
            labels={**(pod_meta.get("labels") or {}), INDEX: str(index)},
            annotations=annotations,
            ownerReferences=[owner],
        )
        pod = self.cluster.create_pod({"apiVersion": "v1", "kind": "Pod", **template})
        self._pods[meta["uid"]][pod["metadata"]["uid"]] = copy.deepcopy(pod)
        self.recorder.event(
            job, "Job", "Normal", "SuccessfulCreate", f"Created pod: {pod_meta['name']}"
        )

    def _delete_pod(self, job: Json, pod: Json) -> None:
        live = self.cluster.pods.get((pod["metadata"]["namespace"], pod["metadata"]["name"]))
        if live is None or live["metadata"].get("deletionTimestamp"):
            return
        self.cluster.delete_pod(live)
        name = pod["metadata"]["name"]
        self.recorder.event(job, "Job", "Normal", "SuccessfulDelete", f"Deleted pod: {name}")

    # -- status --

    def _update_status(
        self,
        job: Json,
        status: Json,
        pods: list[Json],
        counted: list[Json],
        succeeded: set[int],
        failed_indexes: set[int],
        finishing: Json | None,
    ) -> None:
        """The counts and index sets, and the terminal condition once no pod runs."""
        live = [p for p in pods if not p.get("_gone")]
        status["active"] = sum(1 for p in live if _active(p))
        status["ready"] = sum(1 for p in live if _active(p) and _ready(p))
        status["terminating"] = sum(
            1 for p in live if p["metadata"].get("deletionTimestamp") and not _terminal(p)
        )
        status["succeeded"] = len(succeeded)
        status["failed"] = len(counted)
        status["completedIndexes"] = intervals(succeeded)
        if "backoffLimitPerIndex" in job["spec"]:
            status["failedIndexes"] = intervals(failed_indexes)
        running = any(not _terminal(p) for p in live)
        if finishing is not None and not running:  # enactJobFinished
            kind = "Complete" if finishing["type"] == "SuccessCriteriaMet" else "Failed"
            status["conditions"].append(_condition(kind, finishing["reason"], finishing["message"]))
            if kind == "Complete":
                status["completionTime"] = now()

    # -- ttlafterfinished --

    def _ttl(self, key: tuple[str, str], job: Json, status: Json) -> None:
        """ttlafterfinished_controller.go processTTL: delete the finished job once its TTL is
        past its terminal condition's lastTransitionTime, Foreground."""
        ttl = job["spec"].get("ttlSecondsAfterFinished")
        done = _is(status, "Complete") or _is(status, "Failed")
        if ttl is None or done is None:
            return
        finished = calendar.timegm(time.strptime(done["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ"))
        if time.time() >= finished + ttl:
            self.cluster.delete_job(key, "Foreground", resource="jobs")


def _ready(pod: Json) -> bool:
    return all(s.get("ready") for s in pod["status"].get("containerStatuses") or [{}])
