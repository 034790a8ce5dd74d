"""gcp-storage-emulator, the real GCS JSON API server, run in this process on a localhost port.

`running()` starts it (in memory) and yields its base URL; `Gcs` is a bucket on it with the
client that reaches it. tests/conftest.py makes these the `gcs_server` and `gcs` fixtures.
The emulator ignores preconditions (`ifGenerationMatch` and the rest); proxy.py's `FaultProxy`
enforces them as GCS does and injects faults. Nothing here contacts the network beyond
localhost, and google-cloud-storage is not mocked.
"""

from __future__ import annotations

import contextlib
import http.server
import logging
import secrets
import socket
from collections.abc import Iterator
from dataclasses import dataclass

from gcp_storage_emulator.server import create_server
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage as gcs_lib

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


@contextlib.contextmanager
def running() -> Iterator[str]:
    """The emulator, in memory, on a free localhost port; yields its base URL."""
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


def new_bucket(endpoint: str) -> Gcs:
    """A fresh bucket on the emulator at `endpoint`."""
    client = make_client(endpoint)
    return Gcs(client, client.create_bucket(f"test-{secrets.token_hex(6)}"), endpoint)
