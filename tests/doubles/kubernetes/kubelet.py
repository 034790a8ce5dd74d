"""A kubelet for the Kubernetes double: each pod's one container is a local process.

It runs the pods a controller owns (a TFJob's workers, a Job's parts), each with a single
container (a TFJob's `tensorflow`, an Indexed Job's part). What it plays, and the Kubernetes
source each behaviour follows:
- a Pending pod's container starts: the container's command and args, its env (plus HOSTNAME:
  the pod's spec.hostname, else its name, `GeneratePodHostNameAndDomain`), started in its own
  empty working folder; an env var's `valueFrom.fieldRef` is resolved from the pod (the
  downward API: metadata.name, .namespace, .uid, .annotations['k'], .labels['k'],
  spec.serviceAccountName, spec.nodeName, status.podIP; pkg/fieldpath/fieldpath.go
  `ExtractFieldPathAsString`, pkg/kubelet/kubelet_pods.go `podFieldSelectorRuntimeValue`),
  as an Indexed Job's JOB_COMPLETION_INDEX is; the pod turns Running with a
  containerStatus `running`, `ready`, and the imageID the runtime resolved (pkg/kubelet/
  kubelet_pods.go, `convertToAPIContainerStatuses`), and its conditions Initialized,
  ContainersReady and Ready True (pkg/kubelet/status/generate.go: with no readiness probe a
  running container is ready), False again with reason PodCompleted once it ended;
- the container's stdout and stderr, line by line, are the pod's log (pkg/kubelet/kuberuntime/
  logs);
- when the process ends, the rest of its process group is killed (the container's PID 1 ended),
  the containerStatus becomes `terminated` with the exit code (128 + N for a signal, as the
  runtime reports) and reason Completed or Error, and, under restartPolicy Never, the pod phase
  Succeeded (exit 0) or Failed (`getPhase` in pkg/kubelet/kubelet_pods.go);
- the memory limit: the kubelet gives the container's cgroup `resources.limits.memory`
  (pkg/kubelet/kuberuntime/kuberuntime_container_linux.go, MemoryLimitInBytes), and on cgroup v2
  from 1.28 memory.oom.group, so the kernel's OOM killer SIGKILLs all of the container's
  processes once they use more; the runtime then reports exit code 137 with reason OOMKilled
  (containerd internal/cri/server/helpers.go `oomExitReason`, set on the TaskOOM event), which
  the kubelet copies into `state.terminated.reason`. Here the resident memory of the
  container's process group, summed every MEMORY_POLL_SECONDS, stands for the cgroup's usage
  (which also counts page cache and memory-backed volumes), and the kubelet sends the SIGKILL;
- the container's termination message: before it starts, an empty file (mode 0666) is made for
  its `terminationMessagePath` (defaulted to /dev/termination-log, policy File: pkg/apis/core/v1/
  defaults.go `SetDefaults_Container`), as `makeMounts` does (pkg/kubelet/kuberuntime/
  kuberuntime_container.go); once it exited, the file's last 4096 bytes become
  `state.terminated.message` (`getTerminationMessage`, `tail.ReadAtMost` of
  `MaxContainerTerminationMessageLength`, pkg/kubelet/container/runtime.go), left out when
  empty (omitempty). Only under `terminationMessagePolicy: FallbackToLogsOnError`, an empty
  file of a container that failed gives the log's last 80 lines, at most its last 2048 bytes
  (`convertToKubeContainerStatus`, `readLastStringFromContainerLogs`);
- a pod marked for deletion: SIGTERM to the container's main process, SIGKILL to all of it after
  deletionGracePeriodSeconds (pkg/kubelet/kuberuntime/kuberuntime_container.go,
  `killContainer`); the pod then turns terminal and the status manager removes the object
  (pkg/kubelet/status/status_manager.go).

Not played: CPU limits, the securityContext (processes run as this user), image pulls,
in-place restarts (restartPolicy OnFailure/Always), which the jobs here never ask for, pods of
more than one container, readiness probes, and the PodScheduled condition (there is no
scheduler).

Mounts: the kubelet bind-mounts the termination-message file at its path in the container.
Here, with no mount namespace, the file is `<pod>-<uid>.termination-log` beside the pod's working
folder, and any environment value equal to the container's path is rewritten to it when the
process starts (the pod object keeps the manifest's).

Service addresses: the operator writes TF_CONFIG with the Services' DNS names
(`<job>-worker-<i>.<ns>.svc:2222`). Here (network.py) a pod's own address is a port of its own,
where its process listens, and each other Service's name is a port that reaches that Service's
pod only while it is Ready, as the cluster DNS answers only for ready endpoints; the kubelet
rewrites TF_CONFIG's addresses to these ports when it starts a process, and the pod object
keeps the operator's TF_CONFIG.

"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.doubles.kubernetes.network import ServiceNetwork
from tests.doubles.kubernetes.store import Cluster, now, owner_uid
from tests.processes import signal_group, signal_leader, wait_unreaped

POLL_SECONDS = 0.05
MEMORY_POLL_SECONDS = 0.2  # how often the containers' memory is measured against their limits
OOM_KILLED = "OOMKilled"  # the runtime's reason for a container the OOM killer ended
# k8s.io/apimachinery/pkg/api/resource/suffix.go: a quantity's suffixes, binary and decimal
_SUFFIXES = {
    **{s: 1024**i for i, s in enumerate(("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: 1000**i for i, s in enumerate(("", "k", "M", "G", "T", "P", "E"))},
    "m": 1e-3,
}
_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)([a-zA-Z]*)")
MESSAGE_PATH = "/dev/termination-log"  # the API's default terminationMessagePath
MAX_MESSAGE_BYTES = 4096  # MaxContainerTerminationMessageLength: the file's end is kept
MAX_LOG_MESSAGE_LINES, MAX_LOG_MESSAGE_BYTES = 80, 2048  # FallbackToLogsOnError's tail of the log


def termination_message(data: bytes) -> str:
    """What the kubelet keeps of a termination-message file's bytes: the last 4096, as text."""
    return data[-MAX_MESSAGE_BYTES:].decode("utf-8", "replace")


def log_message(lines: list[str]) -> str:
    """FallbackToLogsOnError's message: the log's last 80 lines, of which the last 2048 bytes
    (a circular buffer of that size)."""
    text = "".join(line + "\n" for line in lines[-MAX_LOG_MESSAGE_LINES:]).encode()
    return termination_message(text[-MAX_LOG_MESSAGE_BYTES:])


def env_value(pod: dict[str, Any], var: dict[str, Any]) -> str:
    """An env var's value: its `value`, or its downward-API `fieldRef` resolved from the pod
    (module docstring); a field not played is ""."""
    path = ((var.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
    if path is None:
        return str(var.get("value", ""))
    meta = pod["metadata"]
    for kind in ("annotations", "labels"):
        if path.startswith(f"metadata.{kind}['") and path.endswith("']"):
            return str((meta.get(kind) or {}).get(path[len(kind) + 11 : -2], ""))
    fields = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "status.podIP": "127.0.0.1",
    }
    return str(fields.get(path, ""))


def quantity_bytes(text: str) -> int:
    """A memory quantity ("16Gi", "500M", "1.5Gi") in bytes, rounded up as the API does."""
    match = _QUANTITY.fullmatch(text.strip())
    if match is None or match[2] not in _SUFFIXES:
        raise ValueError(f"not a quantity the double reads: {text!r}")
    return math.ceil(float(match[1]) * _SUFFIXES[match[2]])


def group_memory(groups: set[int]) -> dict[int, int]:
    """The resident bytes of each process group in `groups`: the sum of its processes' RSS
    (/proc/<pid>/stat's pgrp and rss)."""
    page = os.sysconf("SC_PAGE_SIZE")
    totals = dict.fromkeys(groups, 0)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()  # after the command, which may hold spaces
        group = int(fields[2])
        if group in totals:
            totals[group] += int(fields[21]) * page
    return totals


def set_pod_conditions(status: dict[str, Any], ready: bool, reason: str = "") -> None:
    """Set the kubelet's pod conditions (pkg/kubelet/status/generate.go): Initialized (no init
    containers), and ContainersReady and Ready, True while its one container runs and is ready
    (no readiness probe), else False with `reason`. Conditions others own (DisruptionTarget)
    are kept, as status_manager.go `mergePodStatus` keeps them."""
    stamp = now()
    state = {"status": "True"} if ready else {"status": "False", "reason": reason}
    ours = [
        {"type": "Initialized", "status": "True", "lastTransitionTime": stamp},
        {"type": "Ready", **state, "lastTransitionTime": stamp},
        {"type": "ContainersReady", **state, "lastTransitionTime": stamp},
    ]
    kinds = {c["type"] for c in ours}
    others = [c for c in status.get("conditions") or [] if c.get("type") not in kinds]
    status["conditions"] = others + ours


def exit_code_of(returncode: int) -> int:
    """A Popen return code as the container runtime reports it: signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class Kubelet:
    """Runs the double's pods as processes; keeps their status as the kubelet would."""

    def __init__(
        self,
        cluster: Cluster,
        root: Path,
        image_env: Mapping[str, str],
        network: ServiceNetwork,
        *,
        image_digest: str,
    ) -> None:
        self.cluster = cluster
        self.root = Path(root)
        self.image_env = dict(image_env)  # the image's environment (its ENV lines)
        self.network = network  # the Services and the pods' own ports (network.py)
        self.image_digest = image_digest  # what the runtime reports for an image by tag
        self.procs: dict[str, subprocess.Popen[bytes]] = {}  # pod uid -> its main process
        # pod uid -> its container's termination-message file here, and the message policy
        self.message_files: dict[str, tuple[Path, str]] = {}
        self.stopping: dict[str, float] = {}  # pod uid -> when to SIGKILL it
        self.memory_limits: dict[str, int] = {}  # pod uid -> its container's limit, bytes
        self.oom_killed: set[str] = set()  # pod uids whose container the OOM killer ended
        self.all_pids: list[int] = []  # every process started, for tests to check they are gone
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kubelet", daemon=True)
        self._oom = threading.Thread(target=self._oom_killer, name="oom-killer", daemon=True)
        cluster.on_pod_deleting = self._deleting

    def start(self) -> None:
        self._thread.start()
        self._oom.start()

    def stop(self) -> None:
        """Kill every process left (the test is over) and stop the loop."""
        self._halt.set()
        with self.cluster.cond:
            self.cluster.cond.notify_all()
        self._thread.join(timeout=5)
        self._oom.join(timeout=5)
        for proc in list(self.procs.values()):
            signal_group(proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    # -- the sync loop --

    def _loop(self) -> None:
        cluster = self.cluster
        with cluster.cond:
            while not self._halt.is_set() and not cluster.closed:
                for pod in list(cluster.pods.values()):
                    if not owner_uid(pod) and pod["metadata"]["uid"] not in self.procs:
                        continue  # not ours to run (e.g. a KFP executor pod added as data)
                    if pod["metadata"].get("deletionTimestamp"):
                        self._terminate(pod)
                    elif pod["status"].get("phase") == "Pending":
                        self._start(pod)
                cluster.cond.wait(POLL_SECONDS)

    def _start(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        (container,) = spec["containers"]
        env = {**self.image_env, "HOSTNAME": spec.get("hostname") or meta["name"]}
        env.update({e["name"]: env_value(pod, e) for e in container.get("env", [])})
        if "TF_CONFIG" in env:
            env["TF_CONFIG"] = self._local_tf_config(env["TF_CONFIG"], meta["uid"])
        workdir = self.root / f"{meta['name']}-{meta['uid'][:8]}"
        argv = [*container.get("command", []), *container.get("args", [])]
        workdir.mkdir(parents=True, exist_ok=True)
        env = self._mount_message_file(pod, container, workdir, env)
        stamp = now()
        image = container["image"]
        status: dict[str, Any] = {
            "name": container["name"],
            "image": image,
            "imageID": image if "@sha256:" in image else f"{image}@{self.image_digest}",
            "containerID": f"containerd://{meta['uid'].replace('-', '')}",
            "restartCount": 0,
        }
        pod["status"] = {"phase": "Running", "startTime": stamp, "podIP": "127.0.0.1"}
        pod["status"]["containerStatuses"] = [status]
        limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
        try:
            proc = subprocess.Popen(
                argv,
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a process group: the container's processes
            )
        except OSError as exc:  # the runtime's StartError: exit code 128
            self.cluster.logs[meta["uid"]].append(f"StartError: {exc}")
            self._terminated(pod, 128, "StartError", stamp)
            return
        self.procs[meta["uid"]] = proc
        self.all_pids.append(proc.pid)
        if limit:
            self.memory_limits[meta["uid"]] = quantity_bytes(str(limit))
        status.update(ready=True, started=True, state={"running": {"startedAt": stamp}})
        set_pod_conditions(pod["status"], ready=True)
        threading.Thread(target=self._watch, args=(pod, proc, stamp), daemon=True).start()

    def _mount_message_file(
        self, pod: dict[str, Any], container: dict[str, Any], workdir: Path, env: dict[str, str]
    ) -> dict[str, str]:
        """Make the container's empty termination-message file (`makeMounts`); return `env`
        with the container's path to it rewritten to the file here (module docstring)."""
        path = container.get("terminationMessagePath") or MESSAGE_PATH
        policy = container.get("terminationMessagePolicy") or "File"
        host = workdir.with_name(workdir.name + ".termination-log")
        host.write_bytes(b"")
        host.chmod(0o666)
        self.message_files[pod["metadata"]["uid"]] = (host, policy)
        return {k: str(host) if v == path else v for k, v in env.items()}

    def _local_tf_config(self, text: str, uid: str) -> str:
        """TF_CONFIG with the pod's own address its own port, the others their Services'."""
        config = json.loads(text)
        task = config.get("task") or {}
        for kind, addresses in config.get("cluster", {}).items():
            local = []
            for index, address in enumerate(addresses):
                if (kind, index) == (task.get("type"), task.get("index")):
                    local.append(f"127.0.0.1:{self.network.pod_port(uid)}")
                    continue
                host = address.rsplit(":", 1)[0]
                service = host.split(".")[0] + "." + host.split(".")[1]  # <svc>.<ns>
                local.append(f"127.0.0.1:{self.network.port_of(service)}")
            config["cluster"][kind] = local
        return json.dumps(config)

    def _watch(
        self,
        pod: dict[str, Any],
        proc: subprocess.Popen[bytes],
        started: str,
    ) -> None:
        """Copy the output into the pod's log; record the exit once the process is gone."""
        uid = pod["metadata"]["uid"]
        reader = threading.Thread(target=self._read, args=(uid, proc), daemon=True)
        reader.start()
        wait_unreaped(proc)
        signal_group(proc, signal.SIGKILL)  # PID 1 ended: the container's others go too
        returncode = proc.wait()
        reader.join(timeout=10)
        code = exit_code_of(returncode)
        with self.cluster.cond:
            self.procs.pop(uid, None)
            self.memory_limits.pop(uid, None)
            reason = "Completed" if code == 0 else "Error"
            self._terminated(pod, code, OOM_KILLED if uid in self.oom_killed else reason, started)

    def _read(self, uid: str, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:  # the last may lack its newline: a partial record then
            line = raw.decode("utf-8", "replace")
            with self.cluster.cond:
                self.cluster.logs[uid].append(line.rstrip("\n"), not line.endswith("\n"))
                self.cluster.cond.notify_all()

    def _terminated(self, pod: dict[str, Any], code: int, reason: str, started: str) -> None:
        status = pod["status"]
        container = status["containerStatuses"][0]
        container.update(ready=False, started=False)
        terminated = {
            "exitCode": code,
            "reason": reason,
            "startedAt": started,
            "finishedAt": now(),
            "containerID": container["containerID"],
        }
        message = self._message(pod["metadata"]["uid"], code, reason)
        if message:
            terminated["message"] = message
        container["state"] = {"terminated": terminated}
        if pod["spec"].get("restartPolicy", "Always") == "Never":
            status["phase"] = "Succeeded" if code == 0 else "Failed"
        terminal = status.get("phase") in ("Succeeded", "Failed")
        set_pod_conditions(status, False, "PodCompleted" if terminal else "ContainersNotReady")
        self.cluster.cond.notify_all()

    def _message(self, uid: str, code: int, reason: str) -> str:
        """The exited container's termination message (`convertToKubeContainerStatus`)."""
        host, policy = self.message_files.get(uid, (None, "File"))
        message = ""
        if host is not None and host.exists():
            message = termination_message(host.read_bytes())
        fallback = policy == "FallbackToLogsOnError" and code != 0
        if not message and fallback and reason != "ContainerCannotRun":
            message = log_message(list(self.cluster.logs[uid]))
        return message

    # -- memory --

    def _oom_killer(self) -> None:
        """Every MEMORY_POLL_SECONDS, SIGKILL the containers over their memory limit (module
        docstring); `_watch` then reports them OOMKilled."""
        while not self._halt.wait(MEMORY_POLL_SECONDS):
            with self.cluster.cond:
                limited = {
                    uid: (self.procs[uid], limit)
                    for uid, limit in self.memory_limits.items()
                    if uid in self.procs
                }
            if not limited:
                continue
            used = group_memory({proc.pid for proc, _ in limited.values()})
            for uid, (proc, limit) in limited.items():
                if used.get(proc.pid, 0) > limit:
                    with self.cluster.cond:
                        self.oom_killed.add(uid)
                    signal_group(proc, signal.SIGKILL)

    # -- deletion --

    def _deleting(self, pod: dict[str, Any]) -> None:
        """The store marked `pod` for deletion (called with the lock held)."""
        self._terminate(pod)

    def _terminate(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        proc = self.procs.get(uid)
        if proc is None:  # nothing runs (never started, or ended): the object goes
            if pod["status"].get("phase") == "Pending":
                pod["status"]["phase"] = "Failed"
            self.cluster.remove_pod(pod)
            return
        if uid not in self.stopping:
            grace = float(pod["metadata"].get("deletionGracePeriodSeconds", 30))
            self.stopping[uid] = time.monotonic() + grace
            signal_leader(proc, signal.SIGTERM)  # the runtime signals the container's PID 1
        elif time.monotonic() >= self.stopping[uid]:
            signal_group(proc, signal.SIGKILL)
