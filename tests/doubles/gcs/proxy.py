"""A localhost HTTP proxy in front of the GCS emulator: preconditions as GCS enforces them
(gate.py's `PreconditionGate`), and faults on chosen requests: a real GCS error response such
as 403, 429, 503 (`fail`), the connection reset in the middle of the request body (`reset`),
or the request done and the connection reset before the reply (`lose_reply`). The emulator
does none of this; tests/conftest.py's `gcs_strict` and `gcs_faults` fixtures put a bucket
behind it, and tests/faults/test_gcs_proxy.py pins what it adds.
"""

from __future__ import annotations

import contextlib
import re
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from components import storage
from tests.doubles.gcs.emulator import Gcs, free_port, make_client
from tests.doubles.gcs.gate import PreconditionGate, Reply, error_reply, forward


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
def behind(gcs: Gcs, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gcs]:
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
