"""Scripted operator behaviours for the Kubernetes double: fast, deterministic, no processes.

A scenario is a list of steps (`Step`: a function of `Script`) that FakeKube plays, one every
STEP_SECONDS, once the TFJob exists. A step adds a status condition with the operator's reason
and message, creates the `<job>-worker-<i>` pods with the operator's labels, writes their logs,
or ends their `tensorflow` container with an exit code, which the operator records as an
ExitedWithCode event on the job (common/pod.go `ReconcilePods`). tests/operator_double.py
plays the operator for real instead (its reconcile loop, with worker processes).
"""

from __future__ import annotations

import copy
import os
import signal
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from tests.doubles.kubernetes.events import EventRecorder
from tests.doubles.kubernetes.kubelet import termination_message
from tests.doubles.kubernetes.store import Cluster, job_label, now
from tests.doubles.kubernetes.training_operator import exited_message

START_TIME = "2025-01-01T00:00:00Z"  # the scripted job's status.startTime
COMPLETION_TIME = "2025-01-01T00:30:00Z"  # its status.completionTime: 1800 s of wall time
IMAGE_DIGEST = "sha256:" + "ab" * 32  # what the scripted kubelet reports in imageID


class Script:
    """What a scripted step can do to the job FakeKube drives (each takes the lock itself)."""

    def __init__(self, cluster: Cluster, pod_listings: list[str] | None = None) -> None:
        self.cluster = cluster
        # FakeKube's record of the pod lists it answered (their label selectors), if given
        self.pod_listings = pod_listings
        self._pods_changed = 0  # how many it had answered when a pod was last created
        self.ticks = 0  # scripted clock for lastTransitionTime, seconds after START_TIME
        self.recorder = EventRecorder(cluster, "tfjob-controller")  # the operator's

    @property
    def job(self) -> dict[str, Any]:
        return self.cluster.tfjobs[self.cluster.job_key]

    def _tick(self) -> str:
        self.ticks += 1
        stamp = datetime.fromisoformat(START_TIME.replace("Z", "+00:00"))
        return (stamp + timedelta(seconds=self.ticks)).strftime("%Y-%m-%dT%H:%M:%SZ")

    def condition(self, kind: str, message: str = "") -> None:
        """Set a condition the way the operator's UpdateJobConditions does (pkg/util/status.go)."""
        c = self.cluster
        with c.cond:
            if c.job_key not in c.tfjobs:
                return
            status = self.job["status"]
            ns, name = c.job_key
            message = (
                message
                or {
                    "Created": f"TFJob {name} is created.",
                    "Running": f"TFJob {ns}/{name} is running.",
                    "Restarting": f"job {name} is restarting because Worker replica(s) failed.",
                    "Succeeded": f"TFJob {ns}/{name} successfully completed.",
                    "Failed": f"TFJob {ns}/{name} has failed because 1 Worker replica(s) failed.",
                }[kind]
            )
            conditions = [c for c in status.get("conditions", []) if c["type"] != kind]
            if kind in ("Running", "Restarting"):  # each replaces the other
                conditions = [c for c in conditions if c["type"] not in ("Running", "Restarting")]
            for cond in conditions:  # a terminal condition ends Running
                if kind in ("Succeeded", "Failed") and cond["type"] == "Running":
                    cond["status"] = "False"
            conditions.append(
                {
                    "type": kind,
                    "status": "True",
                    "reason": f"TFJob{kind}",
                    "message": message,
                    "lastUpdateTime": now(),
                    "lastTransitionTime": self._tick(),  # distinct per transition
                }
            )
            status["conditions"] = conditions
            status.setdefault("startTime", START_TIME)
            if kind in ("Succeeded", "Failed"):
                status["completionTime"] = COMPLETION_TIME
                self._clean_pods()
            status["replicaStatuses"] = {"Worker": self._replica_status()}
            c._emit("MODIFIED", self.job)

    def _clean_pods(self) -> None:
        """runPolicy.cleanPodPolicy, applied when the job ends."""
        policy = self.job["spec"].get("runPolicy", {}).get("cleanPodPolicy", "None")
        for key, pod in list(self.cluster.pods.items()):
            if job_label(pod) != self.cluster.job_key[1]:
                continue
            if policy == "All" or (policy == "Running" and pod["status"]["phase"] == "Running"):
                del self.cluster.pods[key]

    def _replica_status(self) -> dict[str, int]:
        phases = [p["status"]["phase"] for p in self.cluster.pods.values()]
        return {
            "active": phases.count("Running"),
            "succeeded": phases.count("Succeeded"),
            "failed": phases.count("Failed"),
        }

    def create_pods(
        self,
        waiting: Mapping[int, tuple[str, str]] | None = None,
        unscheduled: Mapping[int, str] | None = None,
    ) -> None:
        """Create the Worker pods (the operator) and start their containers (the kubelet), but
        those in `waiting` ({index: (reason, message)}: the kubelet cannot create the
        container, `cannot_start`) and those in `unscheduled` ({index: the scheduler's
        message}: no node takes them, `unschedulable`)."""
        with self.cluster.cond:
            worker = self.job["spec"]["tfReplicaSpecs"]["Worker"]
            for index in range(worker.get("replicas", 1)):
                self._new_pod(index)
                if waiting and index in waiting:
                    self._waiting(self.pod(index), *waiting[index])
                elif unscheduled and index in unscheduled:
                    self._unscheduled(self.pod(index), unscheduled[index])

    def _new_pod(self, index: int) -> None:
        self._pods_changed = len(self.pod_listings or ())  # under the lock, as listings are
        job = self.job
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        template = job["spec"]["tfReplicaSpecs"]["Worker"]["template"]
        labels = {
            **template.get("metadata", {}).get("labels", {}),
            "training.kubeflow.org/job-name": name,
            "training.kubeflow.org/operator-name": "tfjob-controller",
            "training.kubeflow.org/replica-type": "worker",
            "training.kubeflow.org/replica-index": str(index),
        }
        if index == 0:
            labels["training.kubeflow.org/job-role"] = "master"
        owner = {
            "apiVersion": "kubeflow.org/v1",
            "kind": "TFJob",
            "name": name,
            "uid": job["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        pod = self.cluster.create_pod(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{name}-worker-{index}",
                    "namespace": ns,
                    "labels": labels,
                    "ownerReferences": [owner],
                },
                "spec": copy.deepcopy(template["spec"]),
            }
        )
        self._running(pod)

    def _running(self, pod: dict[str, Any]) -> None:
        container = pod["spec"]["containers"][0]
        stamp = now()
        pod["status"] = {
            "phase": "Running",
            "startTime": stamp,
            "containerStatuses": [
                {
                    "name": "tensorflow",
                    "image": container["image"],
                    "imageID": container["image"].split("@")[0] + "@" + IMAGE_DIGEST,
                    # the runtime's ID of this container (pkg/kubelet/kubelet_pods.go,
                    # convertToAPIContainerStatuses: ContainerID = cs.ID.String())
                    "containerID": "containerd://" + pod["metadata"]["uid"].replace("-", ""),
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "state": {"running": {"startedAt": stamp}},
                }
            ],
        }

    def cannot_start(self, index: int, reason: str, message: str) -> None:
        """Worker `index`, created waiting (`create_pods`), waits with another of the kubelet's
        reasons: its image pull back-off alternates ErrImagePull, at each try, and
        ImagePullBackOff, between them (pkg/kubelet/images/image_manager.go pullImage)."""
        with self.cluster.cond:
            pod = self.pod(index)
            assert pod["status"]["phase"] == "Pending", "a container never started is Pending"
            self._waiting(pod, reason, message)
            self.cluster.cond.notify_all()

    @staticmethod
    def _waiting(pod: dict[str, Any], reason: str, message: str) -> None:
        """The kubelet's status for a container it cannot create: the pod Pending (kubelet_pods.go
        getPhase), the container's waiting reason and message from its reasonCache, no image
        ID yet, no container ID (convertToAPIContainerStatuses), not started (prober_manager.go
        UpdatePodStatus)."""
        pod["status"] = {
            "phase": "Pending",
            "startTime": pod["status"].get("startTime") or now(),
            "containerStatuses": [
                {
                    "name": "tensorflow",
                    "image": pod["spec"]["containers"][0]["image"],
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {"waiting": {"reason": reason, "message": message}},
                }
            ],
        }

    @staticmethod
    def _unscheduled(pod: dict[str, Any], message: str) -> None:
        """No node takes the pod: Pending with the scheduler's PodScheduled False, Unschedulable
        condition (pkg/scheduler/schedule_one.go handleSchedulingFailure: FitError's "0/N nodes
        are available: ..."), no start time and no container status (no kubelet has it)."""
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastTransitionTime": now(),
        }
        pod["status"] = {"phase": "Pending", "conditions": [condition]}

    def start(self, index: int) -> None:
        """Worker `index` starts after all (its image pulled, a node found)."""
        with self.cluster.cond:
            self._running(self.pod(index))
            self.cluster.cond.notify_all()

    def pod(self, index: int) -> dict[str, Any]:
        ns, name = self.cluster.job_key
        return self.cluster.pods[(ns, f"{name}-worker-{index}")]

    def log(self, index: int, *lines: str, unfinished: str = "") -> None:
        """Worker `index` writes `lines`, then `unfinished` without a newline, if given."""
        with self.cluster.cond:
            log = self.cluster.logs[self.pod(index)["metadata"]["uid"]]
            log.extend(lines)
            if unfinished:
                log.append(unfinished, partial=True)
            self.cluster.cond.notify_all()

    def exit(
        self, index: int, code: int, reason: str = "", *, recorded: bool = True, wrote: str = ""
    ) -> None:
        """End worker `index`'s container with `code` (the pod is Succeeded or Failed), and
        record the operator's ExitedWithCode event, unless not `recorded` (the operator
        deleted the pod first, or the spam filter dropped it). `wrote` is what the container
        left in its termination-message file: the kubelet keeps its last 4096 bytes as the
        terminated state's message (kubelet.py)."""
        with self.cluster.cond:
            pod = self.pod(index)
            status = pod["status"]
            status["phase"] = "Succeeded" if code == 0 else "Failed"
            container = status["containerStatuses"][0]
            container.update(ready=False, started=False)
            container["state"] = {
                "terminated": {
                    "exitCode": code,
                    "reason": reason or ("Completed" if code == 0 else "Error"),
                    "startedAt": container["state"]["running"]["startedAt"],
                    "finishedAt": now(),
                }
            }
            if message := termination_message(wrote.encode()):
                container["state"]["terminated"]["message"] = message
            if recorded:
                text = exited_message(pod, code)
                self.recorder.event(self.job, "TFJob", "Normal", "ExitedWithCode", text)
            self.cluster.cond.notify_all()

    def exit_all(self, code: int) -> None:
        """End every worker, the chief (worker 0) last."""
        for index in reversed(range(self._replicas())):
            self.exit(index, code)

    def _replicas(self) -> int:
        return int(self.job["spec"]["tfReplicaSpecs"]["Worker"].get("replicas", 1))

    def recreate_pod(self, index: int) -> None:
        """Delete worker `index` and create it again (the operator's ExitCode restart)."""
        with self.cluster.cond:
            self.cluster.remove_pod(self.pod(index))
            self._new_pod(index)

    def launcher_lists_pods_again(self, timeout: float = 60.0) -> None:
        """Wait until the launcher lists the job's pods after this call, so it has seen what
        the steps before it changed (goes on as `launcher_listed_pods` does)."""
        with self.cluster.cond:
            self._pods_changed = len(self.pod_listings or ())
        self.launcher_listed_pods(timeout)

    def launcher_listed_pods(self, timeout: float = 10.0) -> None:
        """Wait until the launcher has listed the job's pods since one was last created. It
        watches only the TFJob and tells a restart by the new pods' uids (`_pods` in
        the TFJob launcher, by the job-name label alone; the log follower lists worker
        0 by a narrower selector), so it must see each incarnation: a real operator's restart
        takes seconds (the pods' grace period, the scheduler, the image), never a step of
        STEP_SECONDS that a loaded machine can outrun. Goes on after `timeout`, or once the
        double closes or the job is gone (a test then fails on what the launcher missed)."""
        if self.pod_listings is None:
            return
        ns, name = self.cluster.job_key
        selector = f"training.kubeflow.org/job-name={name}"
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            if selector in self.pod_listings[self._pods_changed :]:
                return
            if self.cluster.closed or (ns, name) not in self.cluster.tfjobs:
                return
            time.sleep(0.005)


Step = Callable[[Script], None]


class scenarios:  # noqa: N801 - a namespace of scenario builders
    """Scripted operator behaviours. Each returns the list of steps to play."""

    @staticmethod
    def success(lines: tuple[str, ...] = ("step 1 loss 4.2", "step 2 loss 3.1")) -> list[Step]:
        return [
            lambda c: c.condition("Created"),
            lambda c: c.create_pods(),
            lambda c: c.condition("Running"),
            lambda c: c.log(0, *lines),
            lambda c: c.exit_all(0),
            lambda c: c.condition("Succeeded"),
        ]

    @staticmethod
    def failure(index: int = 1, code: int = 1) -> list[Step]:
        return [
            lambda c: c.condition("Created"),
            lambda c: c.create_pods(),
            lambda c: c.condition("Running"),
            lambda c: c.log(0, "step 1 loss 4.2"),
            lambda c: c.log(index, "Traceback (most recent call last):", "ValueError: bad shard"),
            lambda c: c.exit(index, code),
            lambda c: c.condition("Failed"),
        ]

    @staticmethod
    def restart_then_success(index: int = 1, code: int = 137, times: int = 1) -> list[Step]:
        """Worker `index` dies `times` times. Under MultiWorkerMirrored the others then lose
        their peer and exit 143 (docs/training.md), so the operator recreates every pod."""
        restart: list[Step] = [
            lambda c: c.exit(index, code, "OOMKilled"),
            lambda c: c.condition("Restarting"),
            lambda c: c.recreate_pod(index),
            lambda c: [c.exit(i, 143) for i in range(c._replicas()) if i != index],
            lambda c: [c.recreate_pod(i) for i in range(c._replicas()) if i != index],
            lambda c: c.condition("Running"),
            lambda c: c.launcher_listed_pods(),
        ]
        return [
            lambda c: c.condition("Created"),
            lambda c: c.create_pods(),
            lambda c: c.condition("Running"),
            lambda c: c.launcher_listed_pods(),
            *(restart * times),
            *scenarios.success()[3:],
        ]

    @staticmethod
    def hang() -> list[Step]:
        return [
            lambda c: c.condition("Created"),
            lambda c: c.create_pods(),
            lambda c: c.condition("Running"),
            lambda c: c.log(0, "step 1 loss 4.2"),
        ]

    @staticmethod
    def cancel() -> list[Step]:
        """Runs, then SIGTERMs this process: what Kubernetes does to a cancelled run's pod."""
        return [*scenarios.hang(), lambda c: os.kill(os.getpid(), signal.SIGTERM)]
