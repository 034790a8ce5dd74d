"""The HTTP server under the REST API: reading bodies within a limit, writing replies, and
turning what escapes the API into a 500.

It is the standard library's ThreadingHTTPServer: one thread per connection, HTTP/1.1 with
keep-alive. The work of a request is TensorFlow's (which runs its ops on its own threads and
releases the GIL meanwhile), so a thread per connection serves the few concurrent clients one
machine has as well as an event loop would, with nothing to install; nothing in the venv
(Werkzeug is there only as TensorBoard's dependency) would add more than a dependency.

What it adds to TF Serving's server (tensorflow_serving/model_servers/http_server.cc over
libevent, which reads any body whole): a body over `max_body_bytes` is answered 400 with a
JSON error before it is read (from its Content-Length, or as its chunks or its gzip stream
pass the limit), and the connection is then closed; the rest of the body is drained, not
kept, so the client reads the answer rather than a reset. As TF Serving does, it takes a
chunked body and a gzip one (`Content-Encoding: gzip`; one that does not inflate is empty, as
there). Every reply is JSON (`Content-Type: application/json`), the server's own errors (a
malformed request line, an unknown method) too. An exception the API did not turn into a
status is a 500 with a one-line JSON error; its traceback goes to the server's log only.
"""

from __future__ import annotations

import logging
import re
import socket
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from server.rest import Reply
from server.status import error_body

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 16 << 20  # the largest request body read, by default
IDLE_TIMEOUT_S = 120.0  # a connection that sends nothing for this long is closed
DRAIN_BYTES = 64 << 20  # at most this much of a refused body is read and dropped
DRAIN_TIMEOUT_S = 1.0  # ... waiting at most this long for each piece of it

# method, path, body, Origin header -> the reply (`RestApi.handle`)
Api = Callable[[str, str, bytes, str], Reply]


class BodyTooLarge(Exception):
    """A request body over the server's limit."""


class RestServer(ThreadingHTTPServer):
    """A threading HTTP server that answers every request through `api`."""

    daemon_threads = True  # a request under way does not hold up the process's exit

    def __init__(self, address: tuple[str, int], api: Api, max_body_bytes: int) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.api = api
        self.max_body_bytes = max_body_bytes
        super().__init__(address, _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed outside a request (the client went away): one log line."""
        log.debug("connection from %s ended with an error", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a client reuses its connection
    timeout = IDLE_TIMEOUT_S
    server: RestServer

    def setup(self) -> None:
        super().setup()
        # A reply is written as headers, then body: without this, Nagle's algorithm holds the
        # body until the client acknowledges the headers, which its delayed ACK puts off by
        # up to 40 ms, on every request of a kept connection.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self) -> None:
        self._serve()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = do_GET

    def _serve(self) -> None:
        try:
            body = self._read_body()
        except BodyTooLarge as err:
            self._reply(Reply(400, error_body(str(err))), close=True)
            self._drain()
            return
        except ValueError as err:  # a Content-Length or chunk size that is not a number
            self._reply(Reply(400, error_body(str(err))), close=True)
            return
        path = urlsplit(self.path).path
        try:
            reply = self.server.api(self.command, path, body, self.headers.get("Origin", ""))
        except Exception as err:  # a bug, not the request's fault: a 500, its traceback logged
            log.exception("internal error answering %s %s", self.command, path)
            message = f"Internal error ({type(err).__name__}); the server's log has the details"
            reply = Reply(500, error_body(message))
        self._reply(reply)

    # ---- the body ---------------------------------------------------------------------------

    def _read_body(self) -> bytes:
        limit = self.server.max_body_bytes
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = self._read_chunks(limit)
        else:
            length = self._content_length()
            if length > limit:
                raise BodyTooLarge(_too_large(length, limit))
            body = self.rfile.read(length) if length else b""
        if "gzip" in self.headers.get("Content-Encoding", "").lower():
            body = _gunzip(body, limit)
        return body

    def _content_length(self) -> int:
        text = self.headers.get("Content-Length", "0").strip() or "0"
        if not text.isdigit():
            raise ValueError(f"Content-Length {text!r} is not a number of bytes")
        return int(text)

    def _read_chunks(self, limit: int) -> bytes:
        """A chunked body (RFC 9112, section 7.1), refused once it passes `limit`."""
        parts: list[bytes] = []
        size = 0
        while True:
            line = self.rfile.readline(1024).split(b";", 1)[0].strip()
            # Hex digits only: int(, 16) also takes "-1", "+ff" and "f_f", and a negative size
            # would lower the running total under the limit and read to the end of the stream.
            if not re.fullmatch(rb"[0-9A-Fa-f]{1,16}", line):
                raise ValueError(f"chunk size {line[:20]!r} is not a hexadecimal number")
            chunk = int(line, 16)
            if chunk == 0:
                while self.rfile.readline(1024).strip():  # trailer fields, then the blank line
                    pass
                return b"".join(parts)
            size += chunk
            if size > limit:
                raise BodyTooLarge(_too_large(size, limit, "at least "))
            parts.append(self.rfile.read(chunk))
            self.rfile.readline(16)  # the CRLF after the chunk

    def _drain(self) -> None:
        """Read and drop what the client still sends of a refused body, for a while, so that
        closing the socket does not reset the connection before the client reads the 400."""
        try:
            self.connection.settimeout(DRAIN_TIMEOUT_S)
            dropped = 0
            while dropped < DRAIN_BYTES and (piece := self.connection.recv(1 << 16)):
                dropped += len(piece)
        except OSError:
            pass

    def handle_expect_100(self) -> bool:
        """`Expect: 100-continue` (curl sends it for bodies over 1 KiB): refuse a body over the
        limit before the client sends it, rather than inviting it."""
        try:
            length = self._content_length()
        except ValueError:
            length = 0
        if length > self.server.max_body_bytes:
            self._reply(
                Reply(400, error_body(_too_large(length, self.server.max_body_bytes))), close=True
            )
            return False
        return super().handle_expect_100()

    # ---- the reply --------------------------------------------------------------------------

    def _reply(self, reply: Reply, close: bool = False) -> None:
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply.body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(reply.body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own errors (a malformed request line, a header too long) as JSON."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # an unparsed request line: answer as HTTP/1.x
            self.request_version = "HTTP/1.0"
        text = message or self.responses.get(code, ("error",))[0]
        self._reply(Reply(code, error_body(text)), close=True)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


def _too_large(size: int, limit: int, prefix: str = "") -> str:
    return (
        f"the request body is {prefix}{size} bytes, over this server's limit of {limit} "
        "(gptpipe serve --max-body-bytes)"
    )


def _gunzip(body: bytes, limit: int) -> bytes:
    """A gzip body inflated, at most `limit` bytes of it; one that does not inflate is empty,
    as TF Serving's UncompressGzipBody leaves it (evhttp_request.cc)."""
    inflate = zlib.decompressobj(wbits=31)
    try:
        out = inflate.decompress(body, limit + 1)
    except zlib.error:
        return b""
    if len(out) > limit:
        raise BodyTooLarge(_too_large(len(out), limit, "at least "))
    return out
