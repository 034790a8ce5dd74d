"""Fault-matrix rows for the storage layer on gs://: GCS failing, then the result checked whole.

Each test drives `components.storage` through `gcs_faults` (the emulator behind a proxy that
injects the fault and enforces preconditions as GCS does), then reads back every object and
compares its crc32c with the source file's. Retries are shortened (the same policy, smaller
delays) and the resumable chunk smaller, so a test takes about a second.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from google.cloud.storage.retry import DEFAULT_RETRY

from components import storage
from components.storage import gcs as storage_gcs

CHUNK = 3 << 20  # resumable chunk: a multiple of 256 KiB, as GCS requires
# Over google-cloud-storage's multipart limit (blob.py `_MAX_MULTIPART_SIZE`, 8 MiB), which the
# storage layer's RESUMABLE_THRESHOLD equals: uploaded resumable, in three chunks.
LARGE = (8 << 20) + 12_345
UPLOADS = r"^/upload/storage/v1/b/"


@pytest.fixture(autouse=True)
def _fast(monkeypatch):
    monkeypatch.setattr(storage_gcs, "retry", lambda: DEFAULT_RETRY.with_delay(0.01, 0.05, 2.0))
    monkeypatch.setattr(storage_gcs, "UPLOAD_CHUNK_BYTES", CHUNK)


def _model(root: Path) -> dict[str, str]:
    """A small model folder: many small files and one resumable one; {name: crc32c}."""
    files = {f"variables/shard-{i:02d}": os.urandom(1000 + 97 * i) for i in range(10)}
    files["variables/big.bin"] = os.urandom(LARGE)
    files["saved_model.pb"] = os.urandom(3000)
    files["manifest.json"] = b'{"ok": true}'
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return {name: storage.crc32c_file(root / name) for name in files}


def _whole(expected: dict[str, str], found: dict[str, str]) -> int:
    """How many expected objects are there with the expected crc32c."""
    return sum(found.get(name) == crc for name, crc in expected.items())


@pytest.mark.fault("a GCS 503 storm followed by recovery")
def test_upload_and_publish_survive_a_503_storm(gcs_faults, tmp_path, ledger):
    gcs, proxy = gcs_faults
    expected = _model(tmp_path)
    storm = [
        proxy.fail("POST", UPLOADS, 503, times=15),  # multipart uploads, resumable starts
        proxy.fail("PUT", UPLOADS, 503, times=3),  # resumable chunks
        proxy.fail("GET", r"/o\?", 503, times=6),  # listings
        proxy.fail("POST", r"/copyTo/", 503, times=10),  # the publish's server-side copies
        proxy.fail("DELETE", r"/o/", 503, times=6),  # the staging folder's clean-up
    ]

    uploaded = storage.upload_dir(tmp_path, gcs.uri("uploaded"))
    storage.publish_dir(tmp_path, gcs.uri("models/1"), ready="manifest.json")

    assert [fault.hits for fault in storm] == [fault.times for fault in storm]  # it did storm
    assert {name: info.crc32c for name, info in uploaded.items()} == expected
    for folder in ("uploaded", "models/1"):
        found = storage.tree_crc32c(gcs.uri(folder))
        ledger("gcs objects", len(expected), _whole(expected, found))
        assert found == expected
    assert gcs.names("models/") == [f"models/1/{name}" for name in sorted(expected)]


@pytest.mark.fault("a GCS connection reset in the middle of an upload")
@pytest.mark.parametrize(
    "size, method, skip",
    [
        pytest.param(100_000, "POST", 0, id="small-multipart"),
        pytest.param(LARGE, "PUT", 1, id="large-second-chunk"),
        pytest.param(LARGE, "PUT", 2, id="large-last-chunk"),
    ],
)
def test_upload_survives_a_connection_reset_mid_body(
    gcs_faults, tmp_path, ledger, size, method, skip
):
    gcs, proxy = gcs_faults
    source = tmp_path / "blob.bin"
    source.write_bytes(os.urandom(size))
    reset = proxy.reset(method, UPLOADS, after_bytes=min(size, CHUNK) // 2, skip=skip)
    assert (size > storage_gcs.RESUMABLE_THRESHOLD) == (method == "PUT")

    info = storage.upload_file(source, gcs.uri("blob.bin"))

    assert reset.hits == 1
    whole = gcs.get("blob.bin") == source.read_bytes()
    ledger("gcs objects", 1, int(whole))
    assert whole and info.crc32c == storage.crc32c_file(source)
    assert storage.tree_crc32c(gcs.uri()) == {"blob.bin": storage.crc32c_file(source)}


@pytest.mark.fault("a GCS reply lost after a create-only write landed")
def test_create_only_writes_whose_reply_is_lost_count_as_done(gcs_faults, tmp_path, ledger):
    """The retry of a landed create-only write meets its own object (412); it must not read
    that as someone else's: the publish's `ready` copy, and `create_exclusive`."""
    gcs, proxy = gcs_faults
    expected = _model(tmp_path)
    ready = proxy.lose_reply("POST", r"/copyTo/.*manifest\.json")
    storage.publish_dir(tmp_path, gcs.uri("models/1"), ready="manifest.json")
    claim = proxy.lose_reply("POST", r"/upload/")
    created = storage.create_exclusive(gcs.uri("claims/1"), b"token-a")

    assert (ready.hits, claim.hits) == (1, 1)
    assert [status for *_, status in proxy.gate.refused] == [412, 412]  # each retry met itself
    found = storage.tree_crc32c(gcs.uri("models/1"))
    ledger("gcs objects", len(expected) + 1, _whole(expected, found) + int(created))
    assert found == expected and created and gcs.get("claims/1") == b"token-a"
    assert not storage.create_exclusive(gcs.uri("claims/1"), b"token-b")
