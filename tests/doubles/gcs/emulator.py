"""pytest fixtures: a real GCS JSON API server (gcp-storage-emulator) on a free localhost port.

Register in a test module with `pytest_plugins = ["tests.doubles.gcs.emulator"]`.

- `gcs_server` (session): the emulator, in memory, started once; yields its base URL.
- `gcs` (function): a fresh bucket, STORAGE_EMULATOR_HOST pointing at the server, and
  `components.storage` using a client for it. Yields a `Gcs` (client, bucket, `uri(...)`).
  The emulator ignores preconditions (`ifGenerationMatch` and the rest): this is the raw one.
- `gcs_strict` (function): the same bucket behind `FaultProxy` with no faults, which enforces
  preconditions as GCS does (`PreconditionGate`). STORAGE_EMULATOR_HOST names the proxy, so
  subprocesses that make a default client go through it too. Yields a `Gcs`.
- `gcs_faults` (function): as `gcs_strict`, and yields `(Gcs, FaultProxy)` so a test can make
  chosen requests fail (`fail`: a real GCS error response such as 403, 429, 503; `reset`: the
  connection reset in the middle of the request body; `lose_reply`: the request done, then the
  connection reset before the reply). The emulator does none of this, so this is how tests
  reach that code. `proxy.gate.refused` lists the requests refused for a precondition.

Nothing here contacts the network beyond localhost, and google-cloud-storage is not mocked.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import logging
import re
import secrets
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from gcp_storage_emulator.server import create_server
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage as gcs_lib

from components import storage
from tests.doubles.gcs.gate import PreconditionGate, Reply, error_reply, forward

PROJECT = "gptpipe-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@dataclass
class Gcs:
    """A bucket on the emulator and the client that reaches it."""

    client: gcs_lib.Client
    bucket: gcs_lib.Bucket
    endpoint: str  # base URL the client talks to

    def uri(self, *parts: str) -> str:
        return "/".join([f"gs://{self.bucket.name}", *parts])

    def put(self, key: str, data: bytes) -> gcs_lib.Blob:
        blob = self.bucket.blob(key)
        blob.upload_from_string(data)
        return blob

    def get(self, key: str) -> bytes:
        return self.bucket.blob(key).download_as_bytes()

    def names(self, prefix: str = "") -> list[str]:
        return sorted(b.name for b in self.client.list_blobs(self.bucket.name, prefix=prefix))


def make_client(endpoint: str) -> gcs_lib.Client:
    return gcs_lib.Client(
        project=PROJECT,
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": endpoint},
    )


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[str]:
    logging.getLogger("gcp_storage_emulator").setLevel(logging.ERROR)
    logging.getLogger("api.object").setLevel(logging.ERROR)
    logging.getLogger("api.bucket").setLevel(logging.ERROR)
    # The emulator's HTTPServer keeps socketserver's listen backlog of 5; the thread pools
    # here connect more at once, and dropped connects would wait out 1 s SYN retransmits.
    backlog = http.server.HTTPServer.request_queue_size
    http.server.HTTPServer.request_queue_size = 128
    port = free_port()
    server = create_server("localhost", port, in_memory=True)
    server.start()
    try:
        yield f"http://localhost:{port}"
    finally:
        server.stop()
        http.server.HTTPServer.request_queue_size = backlog


@pytest.fixture
def gcs(gcs_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gcs]:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server)
    client = make_client(gcs_server)
    bucket = client.create_bucket(f"test-{secrets.token_hex(6)}")
    storage.set_client(client)
    try:
        yield Gcs(client, bucket, gcs_server)
    finally:
        storage.set_client(None)


# ---- faults -----------------------------------------------------------------------------------


@dataclass
class Fault:
    """Answer requests matching `method` and `path` (a regex) with `status`, `times` times.

    Instead of answering, the fault may reset the TCP connection (RST, SO_LINGER 0): with
    `reset_after` set, after reading that many bytes of the request body (or all of a shorter
    one), a connection that dies in the middle of an upload; with `lose_reply`, after the
    request has reached the emulator, so a write lands but its client cannot know it did. The
    first `skip` matching requests pass untouched (to hit the second chunk of an upload, say).
    """

    method: str
    path: str
    status: int
    times: int = 1_000_000
    hits: int = 0
    reset_after: int | None = None
    lose_reply: bool = False
    skip: int = 0


@dataclass
class FaultProxy:
    """A localhost HTTP proxy in front of the emulator: injects faults, enforces preconditions.

    With `enforce` (the default), requests pass through a `PreconditionGate`; without it they
    reach the emulator as they are.
    """

    upstream: str
    faults: list[Fault] = field(default_factory=list)
    log: list[tuple[str, str]] = field(default_factory=list)  # (method, path) of every request
    lock: threading.Lock = field(default_factory=threading.Lock)
    enforce: bool = True
    gate: PreconditionGate | None = None

    def __post_init__(self) -> None:
        if self.enforce and self.gate is None:
            self.gate = PreconditionGate(self.upstream)

    def fail(self, method: str, path: str, status: int, times: int = 1_000_000) -> Fault:
        fault = Fault(method, path, status, times)
        with self.lock:
            self.faults.append(fault)
        return fault

    def reset(
        self, method: str, path: str, after_bytes: int = 64 << 10, times: int = 1, skip: int = 0
    ) -> Fault:
        """Reset the connection of matching requests after reading `after_bytes` of the body."""
        fault = Fault(method, path, 0, times, reset_after=after_bytes, skip=skip)
        with self.lock:
            self.faults.append(fault)
        return fault

    def lose_reply(self, method: str, path: str, times: int = 1, skip: int = 0) -> Fault:
        """Forward matching requests, then reset the connection instead of replying."""
        fault = Fault(method, path, 0, times, lose_reply=True, skip=skip)
        with self.lock:
            self.faults.append(fault)
        return fault

    def match(self, method: str, path: str) -> Fault | None:
        with self.lock:
            self.log.append((method, path))
            for fault in self.faults:
                if fault.method != method or not re.search(fault.path, path):
                    continue
                if fault.skip > 0:
                    fault.skip -= 1
                    continue
                if fault.hits < fault.times:
                    fault.hits += 1
                    return fault
        return None

    def relay(self, method: str, path: str, headers: dict[str, str], body: bytes | None) -> Reply:
        if self.gate is not None:
            return self.gate.relay(method, path, headers, body)
        return forward(self.upstream, method, path, headers, body)


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _relay(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            fault = proxy.match(self.command, self.path)
            if fault and fault.reset_after is not None:
                self._reset(min(fault.reset_after, length))
                return
            body = self.rfile.read(length) if length else None
            if fault and not fault.lose_reply:
                self._reply(*error_reply(fault.status))
                return
            headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
            reply = proxy.relay(self.command, self.path, headers, body)
            if fault:
                self._reset(0)
                return
            self._reply(*reply)

        def _reply(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
            self.send_response(status)
            for key, value in headers:
                if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(key, value)
            if status != 304:
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _reset(self, read: int) -> None:
            """Read `read` bytes of the body, then close with an RST instead of a FIN."""
            if read:
                self.rfile.read(read)
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _relay

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@contextlib.contextmanager
def serve(proxy: FaultProxy) -> Iterator[str]:
    """Run `proxy` on a free localhost port; yield its base URL."""
    server = ThreadingHTTPServer(("localhost", free_port()), _handler(proxy))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def _behind(gcs: Gcs, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gcs]:
    """The `gcs` bucket reached through `proxy`, by this process and by its subprocesses."""
    with serve(proxy) as endpoint:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
        client = make_client(endpoint)
        storage.set_client(client)
        try:
            yield Gcs(client, client.bucket(gcs.bucket.name), endpoint)
        finally:
            storage.set_client(gcs.client)
            monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint)


@pytest.fixture
def gcs_strict(gcs: Gcs, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gcs]:
    with _behind(gcs, FaultProxy(gcs.endpoint), monkeypatch) as strict:
        yield strict


@pytest.fixture
def gcs_faults(gcs: Gcs, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Gcs, FaultProxy]]:
    proxy = FaultProxy(gcs.endpoint)
    with _behind(gcs, proxy, monkeypatch) as faulty:
        yield faulty, proxy
