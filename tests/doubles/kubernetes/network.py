"""Headless Services for the Kubernetes double: a Service's name reaches only its Ready pods.

The Training Operator gives each TFJob replica a headless Service `<job>-worker-<i>` (ClusterIP
None) selecting that replica's pod by the operator's labels, and without
`publishNotReadyAddresses` (training-operator v1.9.0 pkg/controller.v1/common/service.go
`CreateNewService`). Kubernetes publishes such a Service's DNS records only for endpoints that
are ready, where
- a pod is an endpoint while it is not terminal and has an IP (staging/src/k8s.io/endpointslice/
  util/controller_utils.go `ShouldPodBeInEndpoints`);
- it is ready when its Ready condition is True and it is not terminating, unless the Service
  sets publishNotReadyAddresses (staging/src/k8s.io/endpointslice/utils.go `podToEndpoint`);
- the cluster DNS answers a headless Service's name with the addresses of ready endpoints only
  (coredns/coredns plugin/kubernetes/object/endpoint.go `EndpointSliceToEndpoints`).

Here a pod's "IP" is a port of its own on 127.0.0.1 (`pod_port`), where its process listens, and
a Service's name is another port (`port_of`) that stands for the name's resolution: each
connection to it is passed to the pod port of the Service's ready endpoint at that moment, or,
with none, reset at once, as a peer whose name does not resolve is unreachable. A connection
passed on lasts as long as the two ends keep it, as a TCP connection to a pod IP outlives the
DNS record it was looked up by.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.doubles.kubernetes.store import Cluster

HOST = "127.0.0.1"


def free_port() -> int:
    """A port nothing on 127.0.0.1 listens on now."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def is_ready(pod: Mapping[str, Any]) -> bool:
    """endpointslice `podToEndpoint`'s `ready` for a Service without publishNotReadyAddresses:
    an endpoint (`ShouldPodBeInEndpoints`: not Succeeded or Failed, with an IP) whose Ready
    condition is True and which is not terminating."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed") or not status.get("podIP"):
        return False
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


@dataclass
class _Service:
    namespace: str
    selector: dict[str, str]
    listener: socket.socket
    connections: list[socket.socket] = field(default_factory=list)


class ServiceNetwork:
    """The headless Services of one double, and its pods' ports."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._services: dict[str, _Service] = {}  # `<name>.<namespace>` -> the Service
        self._pod_ports: dict[str, int] = {}  # pod uid -> the port its process listens on
        self._lock = threading.Lock()
        self._closed = False

    def ensure(self, name: str, namespace: str, selector: Mapping[str, str]) -> bool:
        """Create the Service `name` selecting pods by `selector`, unless it exists; True if
        this created it."""
        key = f"{name}.{namespace}"
        with self._lock:
            if key in self._services or self._closed:
                return False
            listener = socket.socket()
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((HOST, 0))
            listener.listen(64)
            service = _Service(namespace, dict(selector), listener)
            self._services[key] = service
        threading.Thread(target=self._accept, args=(service,), name=key, daemon=True).start()
        return True

    def port_of(self, dns_name: str) -> int:
        """The port standing for Service `<name>.<namespace>`'s name."""
        with self._lock:
            return int(self._services[dns_name].listener.getsockname()[1])

    def pod_port(self, uid: str) -> int:
        """The port pod `uid`'s process listens on: its own, as a pod has its own IP."""
        with self._lock:
            if uid not in self._pod_ports:
                self._pod_ports[uid] = free_port()
            return self._pod_ports[uid]

    def endpoint(self, service: _Service) -> int | None:
        """The pod port of the Service's ready endpoint, None if it has none."""
        with self.cluster.cond:
            for (namespace, _), pod in self.cluster.pods.items():
                labels = pod["metadata"].get("labels") or {}
                selected = all(labels.get(k) == v for k, v in service.selector.items())
                if namespace == service.namespace and selected and is_ready(pod):
                    with self._lock:
                        return self._pod_ports.get(pod["metadata"]["uid"])
        return None

    def close(self) -> None:
        """Stop every Service: no new connections, and those passed on are cut."""
        with self._lock:
            self._closed = True
            services = list(self._services.values())
        for service in services:
            with contextlib.suppress(OSError):
                service.listener.shutdown(socket.SHUT_RDWR)
            service.listener.close()
            for conn in list(service.connections):
                _reset(conn)

    def _accept(self, service: _Service) -> None:
        while True:
            try:
                conn, _ = service.listener.accept()
            except OSError:
                return  # closed
            port = self.endpoint(service)
            upstream = None
            if port is not None:
                with contextlib.suppress(OSError):
                    upstream = socket.create_connection((HOST, port), timeout=5)
            if upstream is None:  # no ready endpoint: the name does not resolve
                _reset(conn)
                continue
            upstream.settimeout(None)
            _Pipe(conn, upstream, service).start()


class _Pipe:
    """One connection passed on: bytes copied both ways until either end closes or resets
    it; then both are closed."""

    def __init__(self, client: socket.socket, pod: socket.socket, service: _Service) -> None:
        self.ends, self.service = (client, pod), service
        self._running = 2
        self._lock = threading.Lock()
        service.connections += [client, pod]

    def start(self) -> None:
        client, pod = self.ends
        for source, sink in ((client, pod), (pod, client)):
            threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for end in self.ends:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
        with self._lock:
            self._running -= 1
            last = self._running == 0
        if last:
            for end in self.ends:
                with contextlib.suppress(ValueError):
                    self.service.connections.remove(end)
                end.close()


def _reset(conn: socket.socket) -> None:
    """Close `conn` with a reset, not an orderly end."""
    with contextlib.suppress(OSError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()
