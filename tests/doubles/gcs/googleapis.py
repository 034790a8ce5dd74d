"""GCS's public HTTPS hosts, for TensorFlow's own GCS file system, served by the emulator.

TensorFlow 2.19 registers its core `gs://` file system (tsl's gcs_file_system.cc; the
tensorflow-io-gcs-filesystem plugin fails to register beside it). Its endpoints are constants,
with no override: `https://www.googleapis.com/storage/v1/` for the JSON API,
`https://www.googleapis.com/upload/storage/v1/` for uploads, `https://storage.googleapis.com/`
for reads (gcs_file_system.cc lines 70-73, google/tsl 5db465f, moved unchanged to
xla/tsl/platform/cloud/ in TF 2.19). It ignores STORAGE_EMULATOR_HOST. What it does honour:

- libcurl's `https_proxy`: curl_http_request.cc sets no CURLOPT_PROXY, so libcurl takes the proxy
  from the environment and tunnels each request with CONNECT <host>:443;
- `CURL_CA_BUNDLE` (curl_http_request.cc lines 126-136): the CA file it verifies hosts with;
- `GOOGLE_AUTH_TOKEN_FOR_TESTING` (google_auth_provider.cc lines 45 and 151): a fixed bearer
  token, so it looks for no credentials file and no metadata server.

`serving(upstream, folder)` starts `GoogleApis`: an HTTPS proxy on localhost that answers
CONNECT for those two hosts only (any other is refused: nothing reaches the network),
terminates TLS with a certificate for both, signed by a CA made for the test, and relays each
request to `upstream` (the emulator, or proxy.py's FaultProxy in front of it). `env` is what a
TensorFlow process needs to reach it. What the relay changes, each for a gap of the emulator
that real GCS does not have (pinned in tests/doubles/gcs/test_googleapis.py):

- a body sent with `Transfer-Encoding: chunked` (TF's uploads also carry a Content-Length) is
  decoded, as HTTP/1.1 says; the emulator reads Content-Length bytes of the raw chunks;
- a media upload of an empty object (`CreateDir`'s `<dir>/` marker) crashes the emulator, so
  it goes as the equivalent multipart upload, the request google-cloud-storage makes;
- the emulator names itself after the request's `Host` in the links it stores (`mediaLink`,
  which google-cloud-storage downloads from) and in a resumable upload's `Location`: it is
  sent its own address, and the `Location` is given back as `https://<the host TensorFlow
  asked>`, so the upload's PUTs come back through this proxy.

Everything a request asks of GCS is the emulator's to answer. The requests are logged in order
(`log`: method and path), so a test can see what TensorFlow asked for and when.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from socketserver import ThreadingTCPServer
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.doubles.gcs.gate import forward

# gcs_file_system.cc's kGcsUriBase and kGcsUploadUriBase, and its kStorageHost.
HOSTS = ("www.googleapis.com", "storage.googleapis.com")
TOKEN = "emulator"  # the bearer token TensorFlow sends; the emulator checks none
_HOP_BY_HOP = ("connection", "content-length", "transfer-encoding", "keep-alive")
_BOUNDARY = "gptpipe-googleapis"


@dataclass
class GoogleApis:
    """The running proxy: its address, the CA that TensorFlow must trust, the requests seen."""

    proxy_url: str  # http://127.0.0.1:<port>, for https_proxy
    ca_file: Path  # PEM: the CA that signed the hosts' certificate
    log: list[tuple[str, str]] = field(default_factory=list)  # (method, path), in order

    @property
    def env(self) -> dict[str, str]:
        """The environment a TensorFlow process needs to use `gs://` through this proxy.

        `no_proxy` keeps localhost direct: the workers' gRPC honours `https_proxy` too.
        """
        return {
            "https_proxy": self.proxy_url,
            "no_proxy": "localhost,127.0.0.1",
            "CURL_CA_BUNDLE": str(self.ca_file),
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": TOKEN,
        }


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[str, Any], ca: bool
) -> x509.Certificate:
    """A certificate for `subject` valid for a day, signed by `issuer` (its name and key)."""
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer[0]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    if ca:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=0), True)
    else:
        names = x509.SubjectAlternativeName([x509.DNSName(h) for h in HOSTS])
        builder = builder.add_extension(names, False)
    return builder.sign(issuer[1], hashes.SHA256())


def make_certificates(folder: Path) -> tuple[Path, Path]:
    """Write a throwaway CA and a certificate for `HOSTS` it signed; return (CA file, the
    hosts' certificate and key in one PEM file)."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, host_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    ca_name = "gptpipe test CA"
    ca = _certificate(ca_name, ca_key, (ca_name, ca_key), ca=True)
    host = _certificate(HOSTS[0], host_key, (ca_name, ca_key), ca=False)
    pem = serialization.Encoding.PEM
    ca_file, host_file = folder / "ca.pem", folder / "googleapis.pem"
    ca_file.write_bytes(ca.public_bytes(pem))
    key = host_key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    host_file.write_bytes(host.public_bytes(pem) + key)
    host_file.chmod(0o600)
    return ca_file, host_file


def read_body(handler: BaseHTTPRequestHandler) -> bytes | None:
    """The request body: chunked transfer decoded (it wins over a Content-Length), else
    Content-Length bytes; None when there is none."""
    if (handler.headers.get("Transfer-Encoding") or "").lower() == "chunked":
        parts = []
        while size := int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16):
            parts.append(handler.rfile.read(size))
            handler.rfile.readline()  # the CRLF after each chunk
        while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass  # trailers
        return b"".join(parts) or None
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length) if length else None


def as_multipart(path: str, headers: dict[str, str]) -> tuple[str, dict[str, str], bytes]:
    """An empty media upload (`uploadType=media&name=N`) as the multipart upload of the same
    empty object, with the request's other parameters (`ifGenerationMatch`) kept."""
    parts = urlsplit(path)
    query = dict(parse_qsl(parts.query))
    query["uploadType"] = "multipart"
    metadata = json.dumps({"name": query["name"]})
    body = (
        f"--{_BOUNDARY}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{metadata}\r\n"
        f"--{_BOUNDARY}\r\nContent-Type: application/octet-stream\r\n\r\n\r\n--{_BOUNDARY}--\r\n"
    ).encode()
    kept = {k: v for k, v in headers.items() if k.lower() != "content-type"}
    kept["Content-Type"] = f"multipart/related; boundary={_BOUNDARY}"
    return f"{parts.path}?{urlencode(query)}", kept, body


def _tunnel_handler(front: GoogleApis, upstream: str) -> type[BaseHTTPRequestHandler]:
    class Tunnel(BaseHTTPRequestHandler):
        """The HTTP/1.1 requests inside one CONNECT tunnel, after its TLS handshake."""

        protocol_version = "HTTP/1.1"  # keep-alive, as libcurl expects

        def _relay(self) -> None:
            body = read_body(self)
            path = self.path
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            if body is None and "uploadType=media" in path:
                path, headers, body = as_multipart(path, headers)
            if body is not None:
                headers["Content-Length"] = str(len(body))
            host = headers.pop("Host", HOSTS[0])
            headers["Host"] = urlsplit(upstream).netloc  # the emulator's links name itself
            front.log.append((self.command, path))
            status, reply_headers, data = forward(upstream, self.command, path, headers, body)
            self.send_response(status)
            for name, value in reply_headers:
                if name.lower() in _HOP_BY_HOP:
                    continue
                if name.lower() == "location" and value.startswith(upstream):
                    value = f"https://{host}{value[len(upstream) :]}"
                self.send_header(name, value)
            if status != 304:
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _relay

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Tunnel


def _proxy_handler(
    front: GoogleApis, upstream: str, context: ssl.SSLContext
) -> type[BaseHTTPRequestHandler]:
    tunnel = _tunnel_handler(front, upstream)

    class Proxy(BaseHTTPRequestHandler):
        """CONNECT to GCS's hosts: a TLS tunnel whose requests go to the emulator."""

        def do_CONNECT(self) -> None:
            host, _, port = self.path.rpartition(":")
            if host not in HOSTS or port != "443":
                self.send_error(403, f"only {', '.join(HOSTS)} are served here")
                return
            self.send_response(200, "Connection established")
            self.end_headers()
            self.close_connection = True  # the tunnel owns the socket from here
            try:
                secure = context.wrap_socket(self.connection, server_side=True)
            except (ssl.SSLError, OSError):
                return  # a client that does not trust the CA: it reports the failure
            with secure:
                tunnel(secure, self.client_address, self.server)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Proxy


class _Server(ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64


@contextlib.contextmanager
def serving(upstream: str, folder: Path) -> Iterator[GoogleApis]:
    """Run the proxy for GCS's hosts in front of `upstream` (a base URL); certificates go
    into `folder`. Yields the running `GoogleApis`."""
    ca_file, host_file = make_certificates(folder)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(host_file)
    server = _Server(("127.0.0.1", 0), None)  # type: ignore[arg-type]
    front = GoogleApis(f"http://127.0.0.1:{server.server_address[1]}", ca_file)
    server.RequestHandlerClass = _proxy_handler(front, upstream, context)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield front
    finally:
        server.shutdown()
        server.server_close()
