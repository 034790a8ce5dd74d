"""A test double of the Kubernetes API server with a scripted Training Operator behind it.

It speaks the wire format the official `kubernetes` client speaks: JSON bodies, `Status` objects
for errors (404 NotFound, 409 AlreadyExists), `?watch=true` as newline-delimited watch events in
a chunked response (honouring resourceVersion, fieldSelector and timeoutSeconds), pod lists by
labelSelector, single pods by name (`Cluster.add_pod` adds one outside any TFJob, such as a KFP
executor pod), and pod logs (`follow=true` streams until the container ends, `tailLines`).

Behind it, a scenario (a list of steps run in a thread once the TFJob exists) plays the
operator: it adds status conditions as the operator does (Created, Running, Restarting,
Succeeded, Failed with reasons TFJobCreated ... TFJobFailed), creates pods named
`<job>-worker-<i>` with the operator's labels, writes their logs, and ends their `tensorflow`
container with an exit code. Every request is recorded, so tests can assert a DELETE happened.

Usage:
    with FakeKube(scenarios.success()) as kube:
        client = kube.api_client()
"""

from __future__ import annotations

import copy
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kubernetes import client

START_TIME = "2025-01-01T00:00:00Z"  # the scripted job's status.startTime
COMPLETION_TIME = "2025-01-01T00:30:00Z"  # its status.completionTime: 1800 s of wall time
IMAGE_DIGEST = "sha256:" + "ab" * 32  # what the scripted kubelet reports in imageID
STEP_SECONDS = 0.02  # pause between scenario steps, so that watch events arrive one by one

Step = Callable[["Cluster"], None]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def status_object(code: int, reason: str, message: str, name: str = "") -> dict[str, Any]:
    """A metav1.Status, as the apiserver returns for errors."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure" if code >= 400 else "Success",
        "message": message,
        "reason": reason,
        "details": {"name": name, "group": "kubeflow.org", "kind": "tfjobs"},
        "code": code,
    }


@dataclass
class Request:
    """One request the double received."""

    method: str
    path: str
    query: dict[str, str]
    body: Any = None


@dataclass
class Cluster:
    """The double's state: TFJobs, pods, logs, and the TFJob watch history."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    tfjobs: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    logs: dict[str, list[str]] = field(default_factory=dict)  # pod uid -> lines
    events: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)  # rv, type, obj
    rv: int = 100
    closed: bool = False
    job_key: tuple[str, str] = ("", "")  # the TFJob the scenario drives

    ticks: int = 0  # scripted clock for lastTransitionTime, seconds after START_TIME

    # -- bookkeeping (callers hold self.cond) --

    def _tick(self) -> str:
        self.ticks += 1
        stamp = datetime.fromisoformat(START_TIME.replace("Z", "+00:00"))
        return (stamp + timedelta(seconds=self.ticks)).strftime("%Y-%m-%dT%H:%M:%SZ")

    def _bump(self, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    def _emit(self, kind: str, job: dict[str, Any]) -> None:
        self._bump(job)
        self.events.append((self.rv, kind, copy.deepcopy(job)))
        self.cond.notify_all()

    def add_job(self, body: dict[str, Any]) -> dict[str, Any]:
        job = copy.deepcopy(body)
        meta = job["metadata"]
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        job["status"] = {}
        self.tfjobs[(meta["namespace"], meta["name"])] = job
        self.job_key = (meta["namespace"], meta["name"])
        self._emit("ADDED", job)
        return job

    def delete_job(self, key: tuple[str, str]) -> dict[str, Any]:
        job = self.tfjobs.pop(key)
        for pod_key in [k for k, p in self.pods.items() if _job_of(p) == key[1]]:
            self.pods.pop(pod_key)
        self._emit("DELETED", job)
        return job

    # -- what a scenario step can do (each takes the lock itself) --

    @property
    def job(self) -> dict[str, Any]:
        return self.tfjobs[self.job_key]

    def condition(self, kind: str, message: str = "") -> None:
        """Set a condition the way the operator's UpdateJobConditions does."""
        with self.cond:
            if self.job_key not in self.tfjobs:
                return
            status = self.job["status"]
            ns, name = self.job_key
            reason = f"TFJob{kind}"
            message = (
                message
                or {
                    "Created": f"TFJob {name} is created.",
                    "Running": f"TFJob {ns}/{name} is running.",
                    "Restarting": f"TFJob {name} is restarting because 1 Worker replica(s) failed.",
                    "Succeeded": f"TFJob {ns}/{name} successfully completed.",
                    "Failed": f"TFJob {ns}/{name} has failed because 1 Worker replica(s) failed.",
                }[kind]
            )
            conditions = [c for c in status.get("conditions", []) if c["type"] != kind]
            for c in conditions:  # a new Running/Restarting/terminal condition ends the others
                if kind in ("Running", "Restarting", "Succeeded", "Failed") and c["type"] in (
                    "Running",
                    "Restarting",
                ):
                    c["status"] = "False"
            now = _now()
            conditions.append(
                {
                    "type": kind,
                    "status": "True",
                    "reason": reason,
                    "message": message,
                    "lastUpdateTime": now,
                    "lastTransitionTime": self._tick(),  # distinct per transition
                }
            )
            status["conditions"] = conditions
            status.setdefault("startTime", START_TIME)
            if kind in ("Succeeded", "Failed"):
                status["completionTime"] = COMPLETION_TIME
                self._clean_pods()
            status["replicaStatuses"] = {"Worker": self._replica_status()}
            self._emit("MODIFIED", self.job)

    def _clean_pods(self) -> None:
        """runPolicy.cleanPodPolicy, applied when the job ends."""
        policy = self.job["spec"].get("runPolicy", {}).get("cleanPodPolicy", "None")
        for key, pod in list(self.pods.items()):
            if _job_of(pod) != self.job_key[1]:
                continue
            if policy == "All" or (policy == "Running" and pod["status"]["phase"] == "Running"):
                del self.pods[key]

    def _replica_status(self) -> dict[str, int]:
        phases = [p["status"]["phase"] for p in self.pods.values()]
        return {
            "active": phases.count("Running"),
            "succeeded": phases.count("Succeeded"),
            "failed": phases.count("Failed"),
        }

    def create_pods(self) -> None:
        """Create the Worker pods (the operator) and start their containers (the kubelet)."""
        with self.cond:
            job = self.job
            worker = job["spec"]["tfReplicaSpecs"]["Worker"]
            for index in range(worker.get("replicas", 1)):
                self._new_pod(job, worker["template"], index)
            self.cond.notify_all()

    def _new_pod(self, job: dict[str, Any], template: dict[str, Any], index: int) -> None:
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        container = template["spec"]["containers"][0]
        image_id = container["image"].split("@")[0] + "@" + IMAGE_DIGEST
        labels = {
            **template.get("metadata", {}).get("labels", {}),
            "training.kubeflow.org/job-name": name,
            "training.kubeflow.org/operator-name": "tfjob-controller",
            "training.kubeflow.org/replica-type": "worker",
            "training.kubeflow.org/replica-index": str(index),
        }
        if index == 0:
            labels["training.kubeflow.org/job-role"] = "master"
        pod_name = f"{name}-worker-{index}"
        uid = str(uuid.uuid4())
        self.pods[(ns, pod_name)] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": ns,
                "uid": uid,
                "labels": labels,
                "creationTimestamp": _now(),
                "ownerReferences": [
                    {
                        "apiVersion": "kubeflow.org/v1",
                        "kind": "TFJob",
                        "name": name,
                        "uid": job["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {
                "containers": [
                    {"name": c["name"], "image": c["image"]} for c in template["spec"]["containers"]
                ]
            },
            "status": {
                "phase": "Running",
                "startTime": _now(),
                "containerStatuses": [
                    {
                        "name": "tensorflow",
                        "image": container["image"],
                        "imageID": image_id,
                        "ready": True,
                        "restartCount": 0,
                        "started": True,
                        "state": {"running": {"startedAt": _now()}},
                    }
                ],
            },
        }
        self.logs[uid] = []

    def add_pod(self, namespace: str, name: str, images: dict[str, tuple[str, str]]) -> None:
        """A running pod outside any TFJob (a KFP executor pod): container -> (image, imageID)."""
        with self.cond:
            containers = [{"name": c, "image": image} for c, (image, _) in images.items()]
            statuses = [
                {
                    "name": c,
                    "image": image,
                    "imageID": image_id,
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "state": {"running": {"startedAt": _now()}},
                }
                for c, (image, image_id) in images.items()
            ]
            self.pods[(namespace, name)] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "uid": str(uuid.uuid4()),
                    "labels": {},
                    "creationTimestamp": _now(),
                },
                "spec": {"containers": containers},
                "status": {"phase": "Running", "startTime": _now(), "containerStatuses": statuses},
            }
            self.cond.notify_all()

    def pod(self, index: int) -> dict[str, Any]:
        ns, name = self.job_key
        return self.pods[(ns, f"{name}-worker-{index}")]

    def log(self, index: int, *lines: str) -> None:
        with self.cond:
            self.logs[self.pod(index)["metadata"]["uid"]].extend(lines)
            self.cond.notify_all()

    def exit(self, index: int, code: int, reason: str = "") -> None:
        """End worker `index`'s container with `code` (the pod is Succeeded or Failed)."""
        with self.cond:
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
                    "finishedAt": _now(),
                }
            }
            self.cond.notify_all()

    def exit_all(self, code: int) -> None:
        """End every worker, the chief (worker 0) last."""
        replicas = self.job["spec"]["tfReplicaSpecs"]["Worker"].get("replicas", 1)
        for index in reversed(range(replicas)):
            self.exit(index, code)

    def recreate_pod(self, index: int) -> None:
        """Delete worker `index` and create it again (the operator's ExitCode restart)."""
        with self.cond:
            job = self.job
            ns, name = self.job_key
            del self.pods[(ns, f"{name}-worker-{index}")]
            self._new_pod(job, job["spec"]["tfReplicaSpecs"]["Worker"]["template"], index)
            self.cond.notify_all()


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
        restart: list[Step] = [
            lambda c: c.exit(index, code, "OOMKilled"),
            lambda c: c.condition("Restarting"),
            lambda c: c.recreate_pod(index),
            lambda c: c.condition("Running"),
        ]
        return [
            lambda c: c.condition("Created"),
            lambda c: c.create_pods(),
            lambda c: c.condition("Running"),
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


def _job_of(pod: dict[str, Any]) -> str:
    return pod["metadata"]["labels"].get("training.kubeflow.org/job-name", "")


def _matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


def _true(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # chunked streaming, as the apiserver does
    kube: FakeKube  # set on the subclass made per server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet test output
        pass

    # -- plumbing --

    def _parts(self) -> tuple[list[str], dict[str, str]]:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        return url.path.strip("/").split("/"), query

    def _send_json(self, code: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _start_stream(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _record(self, method: str, body: Any = None) -> tuple[list[str], dict[str, str]]:
        parts, query = self._parts()
        self.kube.requests.append(Request(method, "/" + "/".join(parts), query, body))
        return parts, query

    # -- verbs --

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        parts, _ = self._record("POST", body)
        if parts[:3] != ["apis", "kubeflow.org", "v1"] or parts[5:] != ["tfjobs"]:
            return self._send_json(404, status_object(404, "NotFound", "no such resource"))
        ns, name = parts[4], body["metadata"]["name"]
        cluster = self.kube.cluster
        with cluster.cond:
            if (ns, name) in cluster.tfjobs:
                msg = f'tfjobs.kubeflow.org "{name}" already exists'
                return self._send_json(409, status_object(409, "AlreadyExists", msg, name))
            body["metadata"]["namespace"] = ns
            job = cluster.add_job(body)
        self.kube.play()
        self._send_json(201, job)

    def do_DELETE(self) -> None:  # noqa: N802
        parts, _ = self._record("DELETE")
        ns, name = parts[4], parts[-1]
        cluster = self.kube.cluster
        with cluster.cond:
            if (ns, name) not in cluster.tfjobs:
                msg = f'tfjobs.kubeflow.org "{name}" not found'
                return self._send_json(404, status_object(404, "NotFound", msg, name))
            job = cluster.delete_job((ns, name))
        ok = status_object(200, "", "", name)
        ok["details"]["uid"] = job["metadata"]["uid"]
        self._send_json(200, ok)

    def do_GET(self) -> None:  # noqa: N802
        parts, query = self._record("GET")
        if parts[:3] == ["apis", "kubeflow.org", "v1"] and parts[5] == "tfjobs":
            if len(parts) == 7:
                return self._get_job(parts[4], parts[6])
            if _true(query.get("watch")):
                return self._watch_jobs(parts[4], query)
            return self._list_jobs(parts[4])
        if parts[:2] == ["api", "v1"] and parts[4] == "pods":
            if len(parts) == 5:
                return self._list_pods(parts[3], query.get("labelSelector", ""))
            if len(parts) == 6:
                return self._get_pod(parts[3], parts[5])
            if len(parts) == 7 and parts[6] == "log":
                return self._pod_log(parts[3], parts[5], query)
        self._send_json(404, status_object(404, "NotFound", f"no route {self.path}"))

    # -- resources --

    def _get_job(self, ns: str, name: str) -> None:
        with self.kube.cluster.cond:
            job = copy.deepcopy(self.kube.cluster.tfjobs.get((ns, name)))
        if job is None:
            msg = f'tfjobs.kubeflow.org "{name}" not found'
            return self._send_json(404, status_object(404, "NotFound", msg, name))
        self._send_json(200, job)

    def _list_jobs(self, ns: str) -> None:
        cluster = self.kube.cluster
        with cluster.cond:
            items = [copy.deepcopy(j) for (n, _), j in cluster.tfjobs.items() if n == ns]
            rv = str(cluster.rv)
        self._send_json(
            200,
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "TFJobList",
                "metadata": {"resourceVersion": rv},
                "items": items,
            },
        )

    def _watch_jobs(self, ns: str, query: dict[str, str]) -> None:
        cluster = self.kube.cluster
        name = query.get("fieldSelector", "").removeprefix("metadata.name=")
        until = time.monotonic() + float(query.get("timeoutSeconds", 1800))
        since = int(query.get("resourceVersion") or 0)
        self._start_stream("application/json")
        try:
            with cluster.cond:
                if since == 0 and (ns, name) in cluster.tfjobs:  # no rv: current state first
                    job = cluster.tfjobs[(ns, name)]
                    self._chunk(json.dumps({"type": "ADDED", "object": job}).encode() + b"\n")
                    since = cluster.rv
                while not cluster.closed and time.monotonic() < until:
                    for rv, kind, obj in cluster.events:
                        meta = obj["metadata"]
                        if rv > since and meta["namespace"] == ns and meta["name"] == name:
                            line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
                            self._chunk(line)
                        since = max(since, rv)
                    cluster.cond.wait(timeout=max(0.0, min(0.2, until - time.monotonic())))
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _list_pods(self, ns: str, selector: str) -> None:
        cluster = self.kube.cluster
        with cluster.cond:
            items = [
                copy.deepcopy(p)
                for (n, _), p in cluster.pods.items()
                if n == ns and _matches(p["metadata"]["labels"], selector)
            ]
            rv = str(cluster.rv)
        self._send_json(
            200,
            {
                "apiVersion": "v1",
                "kind": "PodList",
                "metadata": {"resourceVersion": rv},
                "items": items,
            },
        )

    def _get_pod(self, ns: str, name: str) -> None:
        with self.kube.cluster.cond:
            pod = copy.deepcopy(self.kube.cluster.pods.get((ns, name)))
        if pod is None:
            msg = f'pods "{name}" not found'
            return self._send_json(404, status_object(404, "NotFound", msg, name))
        self._send_json(200, pod)

    def _pod_log(self, ns: str, name: str, query: dict[str, str]) -> None:
        cluster = self.kube.cluster
        with cluster.cond:
            pod = cluster.pods.get((ns, name))
            if pod is None:
                msg = f'pods "{name}" not found'
                return self._send_json(404, status_object(404, "NotFound", msg, name))
            uid = pod["metadata"]["uid"]
            if not _true(query.get("follow")):
                lines = cluster.logs[uid]
                if "tailLines" in query:
                    lines = lines[-int(query["tailLines"]) :]
                body = "".join(f"{line}\n" for line in lines).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return None
        self._follow_log(ns, name, uid)

    def _follow_log(self, ns: str, name: str, uid: str) -> None:
        cluster = self.kube.cluster
        self._start_stream("text/plain")
        sent = 0
        try:
            with cluster.cond:
                while not cluster.closed:
                    lines = cluster.logs.get(uid, [])
                    for line in lines[sent:]:
                        self._chunk(f"{line}\n".encode())
                    sent = len(lines)
                    pod = cluster.pods.get((ns, name))
                    ended = (
                        pod is None
                        or pod["metadata"]["uid"] != uid
                        or ("terminated" in pod["status"]["containerStatuses"][0]["state"])
                    )
                    if ended:
                        break
                    cluster.cond.wait(timeout=0.2)
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class FakeKube:
    """The double: an HTTP server on a free localhost port, plus the scenario player."""

    def __init__(self, steps: list[Step] | None = None, *, existing: dict[str, Any] | None = None):
        self.cluster = Cluster()
        self.steps = list(steps or [])
        self.requests: list[Request] = []
        self.output = ""  # a test may keep the launcher's output here
        self._player: threading.Thread | None = None
        self._existing = existing
        handler = type("Handler", (_Handler,), {"kube": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.host = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._serve = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeKube:
        self._serve.start()
        if self._existing is not None:  # a job a previous launcher attempt created
            with self.cluster.cond:
                self.cluster.add_job(self._existing)
            self.play()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.cluster.cond:
            self.cluster.closed = True
            self.cluster.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()
        if self._player is not None:
            self._player.join(timeout=5)

    def api_client(self) -> client.ApiClient:
        """An ApiClient of the official client, pointed at this double."""
        return client.ApiClient(client.Configuration(host=self.host))

    def play(self) -> None:
        """Start playing the scenario (once): the operator reacting to a new TFJob."""
        if self._player is None:
            self._player = threading.Thread(target=self._play, daemon=True)
            self._player.start()

    def _play(self) -> None:
        for step in self.steps:
            time.sleep(STEP_SECONDS)
            if self.cluster.closed or self.cluster.job_key not in self.cluster.tfjobs:
                return
            step(self.cluster)

    def calls(self, method: str, suffix: str = "") -> list[Request]:
        """The recorded requests with this method whose path ends with `suffix`."""
        return [r for r in self.requests if r.method == method and r.path.endswith(suffix)]
