"""A test double of the Kubernetes API server, with a Training Operator behind it.

It speaks the wire format the official `kubernetes` client speaks: JSON bodies, `Status` objects
for errors (404 NotFound, 409 AlreadyExists), `?watch=true` as newline-delimited watch events in
a chunked response (honouring resourceVersion, fieldSelector and timeoutSeconds), TFJob lists
and pod lists by labelSelector, merge PATCH of a TFJob, DELETE with a propagationPolicy, single
pods by name (`Cluster.add_pod` adds one outside any TFJob, such as a KFP executor pod), and pod
logs (`follow=true` streams until the container ends, `tailLines`, `sinceSeconds`, `sinceTime`,
`timestamps`, Accept negotiated as the API server does; `cut_follows` drops streams early, as a
proxy's idle timeout does, `end_follows` ends them cleanly while the container runs on,
`end_follows_at` after so many characters, in a line or between two), and Events by
fieldSelector (event_recorder.py records them as client-go does; `forbid_events` answers 403,
as for a Role without `list` on events). The objects and what the apiserver does with them
live in k8s_store.py. Every request is recorded.

Behind it plays one of:
- a scripted operator (k8s_scenarios.py): a list of steps, fast and deterministic;
- the operator for real (`FakeKube.running`): operator_double.py reconciles every TFJob as the
  Training Operator v1.9 does, and kubelet.py runs each pod as a local process.

Usage:
    with FakeKube(scenarios.success()) as kube:
        client = kube.api_client()
    with FakeKube.running(tmp_path, image_env={...}) as kube:
        ...
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kubernetes import client

from tests.doubles.kubernetes import batch_api, cluster_api
from tests.doubles.kubernetes.job_controller import JobController
from tests.doubles.kubernetes.kubelet import Kubelet
from tests.doubles.kubernetes.network import ServiceNetwork
from tests.doubles.kubernetes.scenarios import (
    COMPLETION_TIME,
    IMAGE_DIGEST,
    START_TIME,
    Script,
    Step,
    scenarios,
)
from tests.doubles.kubernetes.store import (
    Cluster,
    PodLog,
    event_matches,
    forbidden,
    status_object,
    unsupported_event_field,
)
from tests.doubles.kubernetes.training_operator import TrainingOperator

__all__ = ["COMPLETION_TIME", "IMAGE_DIGEST", "START_TIME", "FakeKube", "scenarios"]
STEP_SECONDS = 0.02  # pause between scenario steps, so that watch events arrive one by one
Objects = dict[tuple[str, str], dict[str, Any]]  # (namespace, name) -> object


@dataclass
class Request:
    """One request the double received."""

    method: str
    path: str
    query: dict[str, str]
    body: Any = None


def _matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


def _true(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


def _not_found(kind: str, name: str) -> dict[str, Any]:
    return status_object(404, "NotFound", f'{kind} "{name}" not found', name)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # chunked streaming, as the apiserver does
    kube: FakeKube  # set on the subclass made per server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet test output
        pass

    # -- plumbing --

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

    def _record(self, method: str) -> tuple[list[str], dict[str, str], Any]:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        parts = url.path.strip("/").split("/")
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.kube.requests.append(Request(method, "/" + "/".join(parts), query, body))
        return parts, query, body

    @staticmethod
    def _tfjobs(parts: list[str]) -> bool:
        return parts[:3] == ["apis", "kubeflow.org", "v1"] and parts[5:6] == ["tfjobs"]

    # -- verbs --

    def do_POST(self) -> None:  # noqa: N802
        parts, query, body = self._record("POST")
        if batch_api.is_batch(parts):
            return batch_api.handle(self, "POST", parts, query, body)
        if cluster_api.is_cluster(parts):
            return cluster_api.handle(self, "POST", parts, body)
        if not self._tfjobs(parts) or len(parts) != 6:
            return self._send_json(404, status_object(404, "NotFound", "no such resource"))
        ns, name = parts[4], body["metadata"]["name"]
        cluster = self.kube.cluster
        with cluster.cond:
            if (ns, name) in cluster.tfjobs:
                msg = f'tfjobs.kubeflow.org "{name}" already exists'
                return self._send_json(409, status_object(409, "AlreadyExists", msg, name))
            body["metadata"]["namespace"] = ns
            job = copy.deepcopy(cluster.add_job(body))
        self.kube.play()
        self._send_json(201, job)

    def do_PATCH(self) -> None:  # noqa: N802
        parts, _, body = self._record("PATCH")
        if self.kube.unavailable_patches > 0:  # as do_GET's 503: refused before the handler
            self.kube.unavailable_patches -= 1
            return self._send_json(503, status_object(503, "ServiceUnavailable", "try again"))
        kind = self.headers.get("Content-Type", "")
        if not self._tfjobs(parts) or len(parts) != 7 or kind != "application/merge-patch+json":
            return self._send_json(415, status_object(415, "UnsupportedMediaType", kind))
        cluster = self.kube.cluster
        with cluster.cond:
            if (parts[4], parts[6]) not in cluster.tfjobs:
                return self._send_json(404, _not_found("tfjobs.kubeflow.org", parts[6]))
            job = copy.deepcopy(cluster.patch_job((parts[4], parts[6]), body))
        self._send_json(200, job)

    def do_DELETE(self) -> None:  # noqa: N802
        parts, query, body = self._record("DELETE")
        if self.kube.unavailable_deletes > 0:  # as do_GET's 503, for deletes
            self.kube.unavailable_deletes -= 1
            return self._send_json(503, status_object(503, "ServiceUnavailable", "try again"))
        if batch_api.is_batch(parts):
            return batch_api.handle(self, "DELETE", parts, query, body)
        policy = query.get("propagationPolicy") or (body or {}).get("propagationPolicy")
        cluster = self.kube.cluster
        with cluster.cond:
            if self._tfjobs(parts) and len(parts) == 7:
                if (parts[4], parts[6]) not in cluster.tfjobs:
                    return self._send_json(404, _not_found("tfjobs.kubeflow.org", parts[6]))
                job = cluster.delete_job((parts[4], parts[6]), policy or "Background")
                return self._send_json(200, job)
            if parts[:2] == ["api", "v1"] and parts[4:5] == ["pods"] and len(parts) == 6:
                pod = cluster.pods.get((parts[3], parts[5]))
                if pod is None:
                    return self._send_json(404, _not_found("pods", parts[5]))
                cluster.delete_pod(pod)
                return self._send_json(200, copy.deepcopy(pod))
        self._send_json(404, status_object(404, "NotFound", f"no route {self.path}"))

    def do_GET(self) -> None:  # noqa: N802
        parts, query, _ = self._record("GET")
        if self.kube.unavailable > 0:
            # An apiserver shutting down answers 503 with a Status body, reason
            # ServiceUnavailable (k8s.io/apiserver pkg/server/filters/waitgroup.go
            # waitGroupWriteRetryAfterToResponse; maxinflight.go answers 429 the same way).
            self.kube.unavailable -= 1
            return self._send_json(503, status_object(503, "ServiceUnavailable", "try again"))
        if batch_api.is_batch(parts):
            return batch_api.handle(self, "GET", parts, query, None)
        if cluster_api.is_cluster(parts):
            return cluster_api.handle(self, "GET", parts, None)
        if self._tfjobs(parts):
            if len(parts) == 7:
                return self._get(self.kube.cluster.tfjobs, parts[4], parts[6], "tfjobs")
            if _true(query.get("watch")):
                return self._watch_jobs(parts[4], query)
            return self._list("TFJobList", self.kube.cluster.tfjobs, parts[4], query)
        if parts[:2] == ["api", "v1"] and parts[4:5] == ["pods"]:
            if len(parts) == 5:
                return self._list("PodList", self.kube.cluster.pods, parts[3], query)
            if len(parts) == 6:
                return self._get(self.kube.cluster.pods, parts[3], parts[5], "pods")
            if len(parts) == 7 and parts[6] == "log":
                return self._pod_log(parts[3], parts[5], query)
        if parts[:2] == ["api", "v1"] and parts[4:] == ["events"]:
            return self._list_events(parts[3], query)
        self._send_json(404, status_object(404, "NotFound", f"no route {self.path}"))

    # -- resources --

    def _get(self, store: Objects, ns: str, name: str, kind: str) -> None:
        with self.kube.cluster.cond:
            obj = copy.deepcopy(store.get((ns, name)))
        if obj is None:
            return self._send_json(404, _not_found(kind, name))
        self._send_json(200, obj)

    def _list(self, kind: str, store: Objects, ns: str, query: dict[str, str]) -> None:
        cluster = self.kube.cluster
        selector = query.get("labelSelector", "")
        with cluster.cond:
            items = [
                copy.deepcopy(obj)
                for (n, _), obj in store.items()
                if n == ns and _matches(obj["metadata"].get("labels") or {}, selector)
            ]
            rv = str(cluster.rv)
            if kind == "PodList":  # read under the lock: later than any pod made before
                self.kube.pod_listings.append(selector)
        api_version = "v1" if kind == "PodList" else "kubeflow.org/v1"
        meta = {"resourceVersion": rv}
        self._send_json(
            200, {"apiVersion": api_version, "kind": kind, "metadata": meta, "items": items}
        )

    def _list_events(self, ns: str, query: dict[str, str]) -> None:
        """GET /api/v1/namespaces/{ns}/events?fieldSelector=...: an EventList."""
        if self.kube.forbid_events:  # no rule of the Role grants the verb
            return self._send_json(403, forbidden("list", "events", ns))
        selector = query.get("fieldSelector", "")
        if bad := unsupported_event_field(selector):
            message = f"field label not supported: {bad}"
            return self._send_json(400, status_object(400, "BadRequest", message))
        cluster = self.kube.cluster
        with cluster.cond:
            items = [
                copy.deepcopy(e)
                for (n, _), e in cluster.kube_events.items()
                if n == ns and event_matches(e, selector)
            ]
            rv = str(cluster.rv)
        body = {"apiVersion": "v1", "kind": "EventList", "metadata": {"resourceVersion": rv}}
        self._send_json(200, {**body, "items": items})

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
                    if self.kube.cut_watches > 0:
                        # An apiserver that crashes, or a proxy between, breaks an open watch
                        # mid-stream: no terminating chunk, the client reads a broken response
                        # (one shutting down gracefully ends it like a timeout: handlers/
                        # watch.go serveHTTPSelect returns on ServerShuttingDownCh).
                        self.kube.cut_watches -= 1
                        self.close_connection = True
                        return
                    for rv, kind, obj in cluster.events:
                        meta = obj["metadata"]
                        tfjob = obj.get("apiVersion", "").startswith("kubeflow.org/")
                        if (
                            rv > since
                            and tfjob
                            and meta["namespace"] == ns
                            and meta["name"] == name
                        ):
                            line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
                            self._chunk(line)
                        since = max(since, rv)
                    cluster.cond.wait(timeout=max(0.0, min(0.2, until - time.monotonic())))
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _pod_log(self, ns: str, name: str, query: dict[str, str]) -> None:
        cluster = self.kube.cluster
        with cluster.cond:
            pod = cluster.pods.get((ns, name))
            if pod is None:
                return self._send_json(404, _not_found("pods", name))
            uid = pod["metadata"]["uid"]
            if self.kube.forbid_logs:  # RBAC without `get` on pods/log
                return self._send_json(403, forbidden("get", "pods/log", ns, name))
            accept = self.headers.get("Accept") or "*/*"
            if not any(t in accept for t in _LOG_MEDIA_TYPES):
                return self._send_json(406, _not_acceptable(accept))
            if not _true(query.get("follow")):
                log = cluster.logs.get(uid) or PodLog()
                first = 0
                if "tailLines" in query:
                    first = max(0, len(log) - int(query["tailLines"]))
                body = "".join(_log_lines(log, first, _log_since(query), query)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return None
        self._follow_log(ns, name, uid, query)

    def _follow_log(self, ns: str, name: str, uid: str, query: dict[str, str]) -> None:
        cluster = self.kube.cluster
        since = _log_since(query)  # once, at the request (NewLogOptions(apiOpts, now))
        self._start_stream("text/plain")
        sent = 0
        cut = self.kube.cut_follows > 0
        end = not cut and self.kube.end_follows > 0
        at = None if cut or end or not self.kube.end_follows_at else self.kube.end_follows_at[0]
        if cut:
            self.kube.cut_follows -= 1
        elif end:
            self.kube.end_follows -= 1
        elif at is not None:
            self.kube.end_follows_at.pop(0)
        try:
            with cluster.cond:
                while not cluster.closed:
                    log = cluster.logs.get(uid) or PodLog()
                    lines = _log_lines(log, sent, since, query)
                    if at is not None and lines:
                        # The leg to the kubelet broke in the middle of a record, or between
                        # two: the API server ends the response cleanly all the same (`end`).
                        if piece := "".join(lines)[:at]:  # (an empty chunk ends the body)
                            self._chunk(piece.encode())
                        break
                    for line in lines:
                        self._chunk(line.encode())
                    sent = len(log)
                    if cut and sent:
                        # A proxy's idle timeout: the connection closes without the last chunk
                        # while the container runs on.
                        self.close_connection = True
                        return
                    if end and sent:
                        # The API server's leg to the kubelet broke (or the kubelet's 4-hour
                        # write timeout): it ends the response with its last chunk all the same
                        # (apiserver handlers/responsewriters/writers.go, StreamObject).
                        break
                    pod = cluster.pods.get((ns, name))
                    if pod is None or pod["metadata"]["uid"] != uid or _ended(pod):
                        break
                    cluster.cond.wait(timeout=0.2)
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


# What the API server serves a pod's log as: it negotiates Accept against these before it
# streams (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/negotiation/negotiate.go,
# NegotiateOutputMediaType), so text/plain alone gets 406 (kubernetes/kubernetes#61450).
_LOG_MEDIA_TYPES = (
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
    "*/*",
)


def _not_acceptable(accept: str) -> dict[str, Any]:
    return status_object(
        406,
        "NotAcceptable",
        f"only the following media types are accepted: {', '.join(_LOG_MEDIA_TYPES[:3])} "
        f"(asked: {accept})",
    )


def _log_since(query: dict[str, str]) -> int:
    """The earliest stamp (ns) a log request wants: `sinceSeconds` before now, or `sinceTime`
    (RFC 3339) if later (pkg/kubelet/kuberuntime/logs/logs.go, `NewLogOptions`)."""
    since = 0
    if "sinceSeconds" in query:
        since = time.time_ns() - int(query["sinceSeconds"]) * 1_000_000_000
    if "sinceTime" in query:
        when = datetime.fromisoformat(query["sinceTime"].replace("Z", "+00:00"))
        since = max(since, int(when.timestamp()) * 1_000_000_000 + when.microsecond * 1000)
    return since


def _log_lines(log: PodLog, first: int, since: int, query: dict[str, str]) -> list[str]:
    """`log[first:]` as the kubelet writes it (logs.go, `logWriter.write`): records stamped
    before `since` skipped, each prefixed with its time in RFC3339NanoFixed and a space under
    `timestamps=true`, a partial one without the newline (`parseCRILog` trims it)."""
    stamped = _true(query.get("timestamps"))
    lines = []
    rows = zip(log[first:], log.stamps[first:], log.partial[first:], strict=True)
    for line, stamp, partial in rows:
        if stamp < since:
            continue
        prefix = f"{_rfc3339_nano_fixed(stamp)} " if stamped else ""
        lines.append(f"{prefix}{line}" + ("" if partial else "\n"))
    return lines


def _rfc3339_nano_fixed(ns: int) -> str:
    """pkg/kubelet/types/constants.go `RFC3339NanoFixed`, "2006-01-02T15:04:05.000000000Z07:00",
    in UTC."""
    seconds, nanos = divmod(ns, 1_000_000_000)
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{whole}.{nanos:09d}Z"


def _ended(pod: dict[str, Any]) -> bool:
    statuses = pod["status"].get("containerStatuses") or [{}]
    return "terminated" in (statuses[0].get("state") or {})


class FakeKube:
    """The double: an HTTP server on a free localhost port, plus the operator behind it."""

    def __init__(self, steps: list[Step] | None = None, *, existing: dict[str, Any] | None = None):
        self.cluster = Cluster()
        self.steps = list(steps or [])
        self.requests: list[Request] = []
        self.pod_listings: list[str] = []  # each pod list answered, by its labelSelector
        self.output = ""  # a test may keep the launcher's output here
        self.unavailable = 0  # the next this-many GETs answer 503 (a transient apiserver fault)
        self.unavailable_patches = 0  # and the next this-many PATCHes
        self.unavailable_deletes = 0  # and DELETEs
        self.cut_watches = 0  # the next this-many TFJob watch streams break off, unfinished
        self.cut_follows = 0  # the next this-many log follow streams drop after their first lines
        self.end_follows = 0  # then this many end cleanly after them, the container running on
        # then one stream each ends cleanly after so many characters of its first lines
        # (negative: short of their end)
        self.end_follows_at: list[int] = []
        self.forbid_logs = False  # pod logs answer 403 (RBAC)
        self.forbid_events = False  # event lists answer 403 (RBAC)
        self.access = cluster_api.Access()  # RBAC reviews, discovery, nodes (gptpipe doctor)
        self.operator: TrainingOperator | None = None
        self.job_controller: JobController | None = None
        self.kubelet: Kubelet | None = None
        self.network: ServiceNetwork | None = None  # the Services, with the kubelet
        self._player: threading.Thread | None = None
        self._existing = existing
        handler = type("Handler", (_Handler,), {"kube": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.host = f"http://127.0.0.1:{self.server.server_address[1]}"
        # A short poll: shutdown() waits for the loop to look, 0.5 s by default, at every exit.
        self._serve = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)

    @classmethod
    def running(
        cls,
        root: Path,
        image_env: Mapping[str, str],
        *,
        grace_seconds: int = 30,
        existing: dict[str, Any] | None = None,
        pod_failure_backoff: float = 10.0,
    ) -> FakeKube:
        """The double with the Training Operator, the Job controller, and a kubelet that runs
        pods as processes.

        `image_env` is the image's environment (PATH, PYTHONPATH...); pods' working folders go
        under `root`; `grace_seconds` is the terminationGracePeriodSeconds of pods that set
        none (Kubernetes: 30); `pod_failure_backoff` the Job controller's first delay before
        it recreates a failed pod (Kubernetes: 10 s; tests shorten it).
        """
        kube = cls(existing=existing)
        kube.cluster.default_grace_seconds = grace_seconds
        kube.network = ServiceNetwork(kube.cluster)
        kube.operator = TrainingOperator(kube.cluster, kube.network)
        kube.job_controller = JobController(kube.cluster, backoff_seconds=pod_failure_backoff)
        kube.kubelet = Kubelet(
            kube.cluster, root, image_env, kube.network, image_digest=IMAGE_DIGEST
        )
        return kube

    def __enter__(self) -> FakeKube:
        self._serve.start()
        if self.kubelet is not None and self.operator is not None:
            self.kubelet.start()
            self.operator.start()
        if self.job_controller is not None:
            self.job_controller.start()
        if self._existing is not None:  # a job a previous launcher attempt created
            with self.cluster.cond:
                self.cluster.add_job(self._existing)
            self.play()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.operator is not None:
            self.operator.stop()
        if self.job_controller is not None:
            self.job_controller.stop()
        if self.kubelet is not None:
            self.kubelet.stop()
        if self.network is not None:
            self.network.close()
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
        """Start playing the scenario (once): the scripted operator reacting to a new TFJob."""
        if self._player is None and self.steps:
            self._player = threading.Thread(target=self._play, daemon=True)
            self._player.start()

    def _play(self) -> None:
        script = Script(self.cluster, self.pod_listings)
        for step in self.steps:
            time.sleep(STEP_SECONDS)
            if self.cluster.closed or self.cluster.job_key not in self.cluster.tfjobs:
                return
            step(script)

    def calls(self, method: str, suffix: str = "") -> list[Request]:
        """The recorded requests with this method whose path ends with `suffix`."""
        return [r for r in self.requests if r.method == method and r.path.endswith(suffix)]

    def wait_for(self, predicate: Any, timeout: float) -> bool:
        """Wait (holding the lock between checks) until predicate(cluster) is true."""
        until = time.monotonic() + timeout
        with self.cluster.cond:
            while not predicate(self.cluster):
                left = until - time.monotonic()
                if left <= 0:
                    return False
                self.cluster.cond.wait(min(left, 0.2))
        return True
