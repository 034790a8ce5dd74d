"""The Kubeflow Training Operator v1.9 TFJob controller, played against the double's store.

A reconcile loop over every TFJob, written from the v1.9.0 source (paths in
github.com/kubeflow/training-operator at tag v1.9.0); Worker replicas only, which is what
components/jobs/tfjob/manifest.py writes:
- Created on a new job: tensorflow/tfjob_controller.go `onOwnerCreateFunc`;
- defaults: apis/kubeflow.org/v1/tensorflow_defaults.go (cleanPodPolicy None, replicas 1,
  restartPolicy Never, port tfjob-port 2222);
- no reconcile of a job being deleted: tfjob_controller.go `Reconcile`;
- a finished job: its pods deleted per cleanPodPolicy, the job deleted ttlSecondsAfterFinished
  after completionTime: common/job.go `ReconcileJobs`, `DeletePodsAndServices`, `CleanupJob`;
- backoffLimit and activeDeadlineSeconds: common/job.go (`exceedsBackoffLimit`,
  `PastBackoffLimit`, `PastActiveDeadline`, both in core/job.go): every pod deleted, Failed with
  reason TFJobFailed and the operator's message;
- pods: created per missing index with the operator's labels, TF_CONFIG in the `tensorflow`
  container (tensorflow/tensorflow.go `genTFConfigJSONStr`, only when the job has more than one
  replica: `isDistributed`), restartPolicy from the replica's (ExitCode -> Never) and a
  controller ownerReference: common/pod.go `createNewPod`, core/pod.go `SetRestartPolicy`;
- a Failed pod: deleted and the job Restarting when the policy restarts it (ExitCode and an exit
  code >= 128, util/train/train_util.go `IsRetryableExitCode`; OnFailure; Always), Failed when
  ExitCode and the code is permanent: common/pod.go `ReconcilePods`. A Succeeded pod is never
  recreated (only a missing index is);
- replica counts: core/status.go `UpdateJobReplicaStatuses`; conditions and success (worker 0
  exited 0, the default success policy): tfjob_controller.go `UpdateJobStatus`; how a condition
  is set (Running and Restarting replace each other, nothing after Failed):
  util/status.go `setCondition`, `filterOutCondition`;
- headless Services `<job>-worker-<i>` (common/service.go), without publishNotReadyAddresses:
  network.py, where a Service's name reaches its pod only while the pod is Ready;
- events on the job, through client-go's recorder (event_recorder.py): "Created pod" and
  "Deleted pod" (control/pod_control.go `CreatePodsWithControllerRef`, and `DeletePod`, which
  skips a pod already terminating), "Created service" (control/service_control.go),
  ExitedWithCode for every pod whose `tensorflow` container terminated, and the Restarting and
  failing Warnings (common/pod.go `ReconcilePods`), the Failed event past a limit (common/job.go
  `ReconcileJobs`), and the Succeeded and Failed ones of tfjob_controller.go
  `UpdateJobStatus`. The operator reconciles when the job or one of its pods changes (its
  watches, tfjob_controller.go `SetupWithManager`); this loop runs every RESYNC_SECONDS, so it
  records ExitedWithCode only in a pass that finds the job or its pods changed since its last.
"""

from __future__ import annotations

import calendar
import copy
import json
import threading
import time
from typing import Any

from tests.doubles.kubernetes.events import EventRecorder
from tests.doubles.kubernetes.network import ServiceNetwork
from tests.doubles.kubernetes.store import Cluster, now

Json = dict[str, Any]
Pods = list[dict[str, Any]]

KIND = "TFJob"
CONTROLLER = "tfjob-controller"
DEFAULT_PORT = 2222  # kubeflowv1.TFJobDefaultPort
LABELS = "training.kubeflow.org/"
RESYNC_SECONDS = 0.05
NO_EXIT = 0xBEEF  # common/pod.go ReconcilePods: the exit code of a container not terminated


def _seconds(stamp: str) -> float:
    return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))


def exit_code(pod: dict[str, Any]) -> int:
    """The `tensorflow` container's exit code, NO_EXIT when it has none."""
    for status in pod["status"].get("containerStatuses", []):
        terminated = status.get("state", {}).get("terminated")
        if status["name"] == "tensorflow" and terminated:
            return int(terminated["exitCode"])
    return NO_EXIT


def exited_message(pod: dict[str, Any], code: int) -> str:
    """The message of common/pod.go's ExitedWithCode event: "Pod: <namespace>.<name> exited
    with code <code>"."""
    return f"Pod: {pod['metadata']['namespace']}.{pod['metadata']['name']} exited with code {code}"


def set_condition(status: dict[str, Any], kind: str, reason: str, message: str) -> None:
    """UpdateJobConditions with status True: util/status.go setCondition."""
    conditions = status.get("conditions") or []
    if any(c["type"] == "Failed" and c["status"] == "True" for c in conditions):
        return  # nothing changes a Failed job
    current = next((c for c in conditions if c["type"] == kind), None)
    if current and current["status"] == "True" and current["reason"] == reason:
        return
    stamp = now()
    transition = current["lastTransitionTime"] if current and current["status"] == "True" else stamp
    kept = []
    for c in conditions:  # filterOutCondition
        if c["type"] == kind or {c["type"], kind} == {"Running", "Restarting"}:
            continue
        if kind in ("Failed", "Succeeded") and c["type"] == "Running":
            c = {**c, "status": "False"}
        kept.append(c)
    kept.append(
        {
            "type": kind,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastUpdateTime": stamp,
            "lastTransitionTime": transition,
        }
    )
    status["conditions"] = kept


def _is(status: dict[str, Any], kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in status.get("conditions", []))


class TrainingOperator:
    """The TFJob controller's reconcile loop, one pass over every job every RESYNC_SECONDS."""

    def __init__(self, cluster: Cluster, network: ServiceNetwork) -> None:
        self.cluster = cluster
        self.network = network  # the headless Services (network.py), shared with the kubelet
        self._created: set[str] = set()  # job uids given their Created condition
        self.recorder = EventRecorder(cluster, CONTROLLER)
        self._last_seen: dict[str, Any] = {}  # job uid -> its and its pods' state, last pass
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tfjob-controller", daemon=True)

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
                for key in list(cluster.tfjobs):
                    self.reconcile(key)
                cluster.cond.wait(RESYNC_SECONDS)

    def reconcile(self, key: tuple[str, str]) -> None:
        """tfjob_controller.go Reconcile, then common/job.go ReconcileJobs (lock held)."""
        job = self.cluster.tfjobs[key]
        if job["metadata"].get("deletionTimestamp"):
            return
        spec = _defaulted(job["spec"])
        status = copy.deepcopy(job.get("status") or {})
        if job["metadata"]["uid"] not in self._created:
            self._created.add(job["metadata"]["uid"])
            name = job["metadata"]["name"]
            set_condition(status, "Created", f"{KIND}Created", f"TFJob {name} is created.")
        pods = self.cluster.owned_pods(job)
        if _is(status, "Succeeded") or _is(status, "Failed"):
            self._finished(key, job, spec, status, pods)
            return
        message = self._past_limits(job, spec, status, pods)
        if message:
            status.setdefault("completionTime", now())
            for pod in pods:  # DeletePodsAndServices of a job not yet finished: all of them
                self._delete_pod(job, pod)
            self._event(job, "Normal", f"{KIND}Failed", message)
            set_condition(status, "Failed", f"{KIND}Failed", message)
            self.cluster.set_job_status(key, status)
            return
        seen = (
            job["metadata"].get("resourceVersion"),
            sorted((p["metadata"]["uid"], json.dumps(p["status"], sort_keys=True)) for p in pods),
        )
        changed = self._last_seen.get(job["metadata"]["uid"]) != seen
        self._last_seen[job["metadata"]["uid"]] = seen
        self._reconcile_pods(job, spec, status, pods, changed)
        self._update_status(job, spec, status)
        self.cluster.set_job_status(key, status)

    def _finished(
        self, key: tuple[str, str], job: Json, spec: Json, status: Json, pods: Pods
    ) -> None:
        policy = spec["runPolicy"]["cleanPodPolicy"]
        for pod in pods:
            if policy == "None":
                break
            if policy == "Running" and pod["status"].get("phase") not in ("Running", "Pending"):
                continue
            self._delete_pod(job, pod)
        if _is(status, "Succeeded"):
            for counts in status.get("replicaStatuses", {}).values():
                counts["succeeded"] = counts.get("succeeded", 0) + counts.pop("active", 0)
        self.cluster.set_job_status(key, status)
        ttl = spec["runPolicy"].get("ttlSecondsAfterFinished")
        done = status.get("completionTime")
        if ttl is not None and done and time.time() > _seconds(done) + ttl:
            self.cluster.delete_job(key)  # CleanupJob -> DeleteJob: background propagation

    def _past_limits(self, job: Json, spec: Json, status: Json, pods: Pods) -> str:
        """The Failed message when backoffLimit or activeDeadlineSeconds is past, else ""."""
        name, policy = job["metadata"]["name"], spec["runPolicy"]
        limit = policy.get("backoffLimit")
        if limit is not None:
            active = sum(1 for p in pods if _active(p))
            failed = sum(1 for p in pods if p["status"].get("phase") == "Failed")
            previous = sum(r.get("failed", 0) for r in status.get("replicaStatuses", {}).values())
            total = sum(r["replicas"] for r in spec["tfReplicaSpecs"].values())
            # previousRetry + 1 > backoffLimit, where previousRetry is jc.WorkQueue.NumRequeues:
            # the TFJob reconciler's WorkQueue is a util.FakeWorkQueue (tensorflow/
            # tfjob_controller.go NewReconciler), whose NumRequeues is always 0 (pkg/common/util/
            # fake_workqueue.go). Failed reconciles are requeued by controller-runtime's own
            # queue, which job.go never reads, so they cannot bring this limit closer.
            previous_retry = 0
            exceeds = failed > previous and active != total and previous_retry + 1 > limit
            restarts = sum(
                s.get("restartCount", 0)
                for p in pods
                if p["status"].get("phase") == "Running"
                for s in p["status"].get("containerStatuses", [])
            )
            past = restarts > 0 if limit == 0 else restarts >= limit
            if exceeds or past:
                return f"Job {name} has failed because it has reached the specified backoff limit"
        deadline, start = policy.get("activeDeadlineSeconds"), status.get("startTime")
        if deadline is not None and start and time.time() - _seconds(start) >= deadline:
            return f"Job {name} has failed because it was active longer than specified deadline"
        return ""

    def _reconcile_pods(
        self, job: Json, spec: Json, status: Json, pods: Pods, changed: bool
    ) -> None:
        """common/pod.go ReconcilePods for the Worker replicas (`changed`: what would have
        triggered the operator's reconcile)."""
        worker = spec["tfReplicaSpecs"]["Worker"]
        counts: dict[str, int] = {}
        status.setdefault("replicaStatuses", {})["Worker"] = counts  # initializeReplicaStatuses
        by_index: dict[int, list[dict[str, Any]]] = {}
        for pod in pods:
            labels = pod["metadata"]["labels"]
            if labels.get(LABELS + "replica-type") == "worker":
                by_index.setdefault(int(labels[LABELS + "replica-index"]), []).append(pod)
        for index in range(max([worker["replicas"], *(i + 1 for i in by_index)])):
            slice_ = by_index.get(index, [])
            if not slice_:
                self._create_pod(job, spec, index)
                continue
            if len(slice_) > 1:
                continue  # "We have too many pods for worker %d"
            pod = slice_[0]
            if index >= worker["replicas"]:
                self._delete_pod(job, pod)
            code = exit_code(pod)
            if code != NO_EXIT and changed:
                self._event(job, "Normal", "ExitedWithCode", exited_message(pod, code))
            if pod["status"].get("phase") == "Failed":
                self._failed_pod(job, worker["restartPolicy"], status, pod)
            _count(counts, pod)

    def _failed_pod(self, job: Json, policy: str, status: Json, pod: Json) -> None:
        name = job["metadata"]["name"]
        code = exit_code(pod)
        if (policy == "ExitCode" and code >= 128) or policy in ("OnFailure", "Always"):
            self._delete_pod(job, pod)
            message = f"job {name} is restarting because Worker replica(s) failed."
            self._event(job, "Warning", f"{KIND}Restarting", message)
            set_condition(status, "Restarting", f"{KIND}Restarting", message)
        elif policy == "ExitCode":
            message = f'job "{name}" is failing because "Worker" replica(s) failed.'
            self._event(job, "Warning", f"{KIND}Failed", message)
            set_condition(status, "Failed", f"{KIND}Failed", message)

    def _event(self, job: Json, type_: str, reason: str, message: str) -> None:
        self.recorder.event(job, KIND, type_, reason, message)

    def _delete_pod(self, job: Json, pod: Json) -> None:
        """pod_control.go DeletePod: the pod, then the event on the job; a pod already
        terminating is left alone, with no event."""
        if pod["metadata"].get("deletionTimestamp"):
            return
        self.cluster.delete_pod(pod)
        self._event(job, "Normal", "SuccessfulDeletePod", f"Deleted pod: {pod['metadata']['name']}")

    def _create_pod(self, job: dict[str, Any], spec: dict[str, Any], index: int) -> None:
        """common/pod.go createNewPod."""
        meta = job["metadata"]
        name, ns = meta["name"], meta["namespace"]
        worker = spec["tfReplicaSpecs"]["Worker"]
        template = copy.deepcopy(worker["template"])
        labels = {
            **(template.get("metadata", {}).get("labels") or {}),
            LABELS + "operator-name": CONTROLLER,
            LABELS + "job-name": name,
            LABELS + "replica-type": "worker",
            LABELS + "replica-index": str(index),
        }
        if index == 0:  # IsMasterRole: worker 0 when there is no Chief
            labels[LABELS + "job-role"] = "master"
        pod_spec = template["spec"]
        if sum(r["replicas"] for r in spec["tfReplicaSpecs"].values()) != 1:  # isDistributed
            for container in pod_spec["containers"]:
                if container["name"] == "tensorflow":
                    tf_config = self._tf_config(job, spec, index)
                    container.setdefault("env", []).append(
                        {"name": "TF_CONFIG", "value": tf_config}
                    )
                    break
        policy = worker["restartPolicy"]
        pod_spec["restartPolicy"] = "Never" if policy == "ExitCode" else policy
        owner = {
            "apiVersion": "kubeflow.org/v1",
            "kind": KIND,
            "name": name,
            "uid": meta["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        metadata = {**template.get("metadata", {}), "labels": labels}
        metadata.update(name=f"{name}-worker-{index}", namespace=ns, ownerReferences=[owner])
        self.cluster.create_pod(
            {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}
        )
        self._event(job, "Normal", "SuccessfulCreatePod", f"Created pod: {metadata['name']}")

    def _tf_config(self, job: dict[str, Any], spec: dict[str, Any], index: int) -> str:
        """tensorflow.go genTFConfigJSONStr / genClusterSpec; also makes the Services."""
        name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
        cluster = {}
        for rtype, replica in spec["tfReplicaSpecs"].items():
            rt = rtype.lower()
            port = _port(replica)
            addresses = []
            for i in range(replica["replicas"]):
                service = f"{name}-{rt}-{i}"
                # ReconcileServices: one headless Service per replica, selecting its pod by
                # GenLabels plus the replica's type and index (common/service.go CreateNewService)
                selector = {
                    LABELS + "operator-name": CONTROLLER,
                    LABELS + "job-name": name,
                    LABELS + "replica-type": rt,
                    LABELS + "replica-index": str(i),
                }
                if self.network.ensure(service, ns, selector):
                    created = f"Created service: {service}"  # service_control.go
                    self._event(job, "Normal", "SuccessfulCreateService", created)
                addresses.append(f"{service}.{ns}.svc:{port}")
            cluster[rt] = addresses
        task = {"type": "worker", "index": index}
        return json.dumps({"cluster": cluster, "task": task, "environment": "cloud"})

    def _update_status(self, job: Json, spec: Json, status: Json) -> None:
        """tfjob_controller.go UpdateJobStatus for a Worker-only job."""
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        worker = spec["tfReplicaSpecs"]["Worker"]
        counts = status["replicaStatuses"]["Worker"]
        status.setdefault("startTime", now())
        restarting = next(
            (c for c in status.get("conditions", []) if c["type"] == "Restarting"), None
        )
        worker0 = [
            p
            for p in self.cluster.owned_pods(job)
            if p["metadata"]["labels"].get(LABELS + "replica-index") == "0"
        ]
        worker0_done = any(
            p["status"].get("phase") == "Succeeded" and exit_code(p) == 0 for p in worker0
        )
        expected = worker["replicas"] - counts.get("succeeded", 0)
        if expected == 0 or (worker0_done and spec.get("successPolicy") != "AllWorkers"):
            status.setdefault("completionTime", now())
            message = f"TFJob {ns}/{name} successfully completed."
            self._event(job, "Normal", f"{KIND}Succeeded", message)
            set_condition(status, "Succeeded", f"{KIND}Succeeded", message)
        elif counts.get("active", 0) > 0:
            set_condition(status, "Running", f"{KIND}Running", f"TFJob {ns}/{name} is running.")
        failed = counts.get("failed", 0)
        if failed > 0:
            if restarting is not None:
                set_condition(status, "Restarting", restarting["reason"], restarting["message"])
            else:
                status.setdefault("completionTime", now())
                message = f"TFJob {ns}/{name} has failed because {failed} Worker replica(s) failed."
                self._event(job, "Normal", f"{KIND}Failed", message)
                set_condition(status, "Failed", f"{KIND}Failed", message)


def _defaulted(spec: dict[str, Any]) -> dict[str, Any]:
    """tensorflow_defaults.go SetDefaults_TFJob, on a copy."""
    spec = copy.deepcopy(spec)
    run_policy = spec.setdefault("runPolicy", {})
    run_policy.setdefault("cleanPodPolicy", "None")
    spec.setdefault("successPolicy", "")
    for replica in spec["tfReplicaSpecs"].values():
        replica.setdefault("replicas", 1)
        replica.setdefault("restartPolicy", "Never")
    return spec


def _port(replica: dict[str, Any]) -> int:
    """tensorflow/util.go GetPortFromTFJob: the container port named tfjob-port, else 2222."""
    for container in replica["template"]["spec"]["containers"]:
        if container["name"] == "tensorflow":
            for port in container.get("ports", []):
                if port.get("name") == "tfjob-port":
                    return int(port["containerPort"])
    return DEFAULT_PORT


def _active(pod: dict[str, Any]) -> bool:
    """k8sutil.FilterActivePods: not Succeeded or Failed, and not being deleted."""
    phase = pod["status"].get("phase")
    return phase not in ("Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp")


def _count(counts: dict[str, int], pod: dict[str, Any]) -> None:
    """core/status.go UpdateJobReplicaStatuses (zeros are left out, as omitempty does)."""
    phase = pod["status"].get("phase")
    if phase == "Running":
        key = "failed" if pod["metadata"].get("deletionTimestamp") else "active"
    elif phase in ("Succeeded", "Failed"):
        key = phase.lower()
    else:
        return
    counts[key] = counts.get(key, 0) + 1
