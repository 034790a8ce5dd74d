"""Storage layer throughput against gcp-storage-emulator on loopback (one run, in-process).

Reports, for the same bytes:
- upload and download MB/s of `components.storage` (upload_file / download_file, which add
  resumable chunks, crc32c checks and retries) as a ratio to the bare client's single-object
  transfer (`upload_from_filename` / `download_to_filename`, no chunking, no checksum);
- the speed-up of the parallel folder upload (`upload_dir`, `storage.gcs.WORKERS` threads) over a
  sequential one (workers=1), on many small objects.

The emulator serves one request at a time (http.server.HTTPServer), so the parallel speed-up
here only shows client-side overlap; against real GCS, which serves objects independently,
it is larger. Numbers on a shared machine vary by tens of percent: compare within one run.
"""

from __future__ import annotations

import http.server
import logging
import os
import secrets
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.results import Figure

OBJECT_MB = 32  # one large object: above RESUMABLE_THRESHOLD, so the layer uploads in chunks
FOLDER_FILES = 64  # many small objects for the parallel folder upload
FOLDER_FILE_KB = 128


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _best_of(repeats: int, fn: Callable[[], object]) -> float:
    """Fastest wall time of `repeats` runs, in seconds (the least disturbed by other load)."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


TIER = "quick"


def figures(full: bool) -> list[Figure]:
    """The layer's transfer speed over the bare client's, and the parallel folder speed-up."""
    m = main()
    inputs = {"object_MB": m["object_MB"], "folder": m["folder"], "workers": m["workers"]}
    rows = (
        (
            f"storage layer upload / bare client upload ({OBJECT_MB} MB, emulator)",
            "upload_ratio_layer_vs_bare",
        ),
        (
            f"storage layer download / bare client download ({OBJECT_MB} MB, emulator)",
            "download_ratio_layer_vs_bare",
        ),
        ("storage parallel folder upload / sequential (emulator)", "folder_parallel_speedup"),
    )
    return [Figure(name=name, value=float(m[key]), inputs=inputs, details=m) for name, key in rows]


def main() -> dict[str, float | int | str]:
    from gcp_storage_emulator.server import create_server
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage as gcs

    from components import storage

    logging.getLogger("gcp_storage_emulator").setLevel(logging.ERROR)
    logging.getLogger("api.object").setLevel(logging.ERROR)
    # The emulator's HTTPServer keeps socketserver's listen backlog of 5: more concurrent
    # connects are dropped and wait out a 1 s SYN retransmit, which would time the kernel,
    # not the storage layer.
    http.server.HTTPServer.request_queue_size = 128
    port = _free_port()
    server = create_server("localhost", port, in_memory=True)
    server.start()
    endpoint = f"http://localhost:{port}"
    client = gcs.Client(
        project="bench",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": endpoint},
    )
    bucket = client.create_bucket(f"bench-{secrets.token_hex(4)}")
    storage.set_client(client)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            return _measure(storage, bucket, Path(tmp))
    finally:
        storage.set_client(None)
        server.stop()


def _measure(storage, bucket, tmp: Path) -> dict[str, float | int | str]:
    big = tmp / "big.bin"
    big.write_bytes(os.urandom(OBJECT_MB << 20))
    uri = f"gs://{bucket.name}"
    mb = OBJECT_MB

    bare_up = _best_of(
        2, lambda: bucket.blob("bare.bin").upload_from_filename(str(big), checksum=None)
    )
    layer_up = _best_of(2, lambda: storage.upload_file(big, f"{uri}/layer.bin"))
    bare_down = _best_of(
        2, lambda: bucket.blob("bare.bin").download_to_filename(str(tmp / "d1"), checksum=None)
    )
    layer_down = _best_of(2, lambda: storage.download_file(f"{uri}/layer.bin", tmp / "d2"))
    assert (tmp / "d2").read_bytes() == big.read_bytes()

    folder = tmp / "folder"
    for i in range(FOLDER_FILES):
        (folder / f"{i % 8}").mkdir(parents=True, exist_ok=True)
        (folder / f"{i % 8}" / f"f{i}.bin").write_bytes(os.urandom(FOLDER_FILE_KB << 10))
    sequential = _best_of(2, lambda: storage.upload_dir(folder, f"{uri}/seq", workers=1))
    parallel = _best_of(
        2, lambda: storage.upload_dir(folder, f"{uri}/par", workers=storage.gcs.WORKERS)
    )
    folder_mb = FOLDER_FILES * FOLDER_FILE_KB / 1024
    return {
        "object_MB": mb,
        "bare_upload_MBps": mb / bare_up,
        "layer_upload_MBps": mb / layer_up,
        "upload_ratio_layer_vs_bare": bare_up / layer_up,
        "bare_download_MBps": mb / bare_down,
        "layer_download_MBps": mb / layer_down,
        "download_ratio_layer_vs_bare": bare_down / layer_down,
        "folder": f"{FOLDER_FILES} x {FOLDER_FILE_KB} KiB",
        "folder_sequential_MBps": folder_mb / sequential,
        "folder_parallel_MBps": folder_mb / parallel,
        "folder_parallel_speedup": sequential / parallel,
        "workers": storage.gcs.WORKERS,
    }


if __name__ == "__main__":
    for key, value in main().items():
        print(f"{key}: {value}")
