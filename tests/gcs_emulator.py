"""pytest fixtures: a real GCS JSON API server (gcp-storage-emulator) on a free localhost port.

Register in a test module with `pytest_plugins = ["gcs_emulator"]` (tests/ is on sys.path).

- `gcs_server` (session): the emulator, in memory, started once; yields its base URL.
- `gcs` (function): a fresh bucket, STORAGE_EMULATOR_HOST pointing at the server, and
  `components.storage` using a client for it. Yields a `Gcs` (client, bucket, `uri(...)`).
- `gcs_faults` (function): the same bucket behind `FaultProxy`, a localhost HTTP proxy that
  answers chosen requests with a real GCS error response (403, 429, 503) and forwards the
  rest. The emulator never sends these, so this is how tests reach that code over HTTP.

Nothing here contacts the network beyond localhost, and google-cloud-storage is not mocked.
"""

from __future__ import annotations

import http.client
import http.server
import json
import logging
import re
import secrets
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

import pytest
from gcp_storage_emulator.server import create_server
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage as gcs_lib

from components import storage

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


@dataclass
class Fault:
    """Answer requests matching `method` and `path` (a regex) with `status`, `times` times."""

    method: str
    path: str
    status: int
    times: int = 1_000_000
    hits: int = 0


@dataclass
class FaultProxy:
    """A localhost HTTP proxy in front of the emulator that injects GCS error responses."""

    upstream: str
    faults: list[Fault] = field(default_factory=list)
    log: list[tuple[str, str]] = field(default_factory=list)  # (method, path) of every request
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fail(self, method: str, path: str, status: int, times: int = 1_000_000) -> Fault:
        fault = Fault(method, path, status, times)
        with self.lock:
            self.faults.append(fault)
        return fault

    def match(self, method: str, path: str) -> Fault | None:
        with self.lock:
            self.log.append((method, path))
            for fault in self.faults:
                if (
                    fault.method == method
                    and re.search(fault.path, path)
                    and fault.hits < fault.times
                ):
                    fault.hits += 1
                    return fault
        return None


def _error_body(status: int) -> bytes:
    reason = {403: "forbidden", 429: "rateLimitExceeded", 503: "backendError"}.get(status, "error")
    message = {
        403: "anonymous caller does not have storage.objects.list access to the bucket.",
        429: "The rate of change requests to the object is too high.",
        503: "Backend Error",
    }.get(status, "error")
    error = {
        "code": status,
        "message": message,
        "errors": [{"message": message, "domain": "global", "reason": reason}],
    }
    return json.dumps({"error": error}).encode()


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    upstream = urlparse(proxy.upstream)

    class Handler(BaseHTTPRequestHandler):
        def _relay(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            fault = proxy.match(self.command, self.path)
            if fault:
                data = _error_body(fault.status)
                self.send_response(fault.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            conn = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
            conn.request(self.command, self.path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
            self.send_response(response.status)
            for key, value in response.getheaders():
                if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            conn.close()

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _relay

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def gcs_faults(gcs: Gcs) -> Iterator[tuple[Gcs, FaultProxy]]:
    proxy = FaultProxy(gcs.endpoint)
    server = ThreadingHTTPServer(("localhost", free_port()), _handler(proxy))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://localhost:{server.server_address[1]}"
    client = make_client(endpoint)
    storage.set_client(client)
    try:
        yield Gcs(client, client.bucket(gcs.bucket.name), endpoint), proxy
    finally:
        storage.set_client(gcs.client)
        server.shutdown()
        server.server_close()
