"""What the precondition-enforcing proxy (`gcs_strict`, `gcs_faults`) adds to the emulator.

gcp-storage-emulator ignores `ifGenerationMatch` and its kin; `PreconditionGate` in
tests/doubles/gcs/gate.py enforces them as GCS does. Each test here pins one behaviour through
the real google-cloud-storage client, and `test_raw_emulator_ignores_preconditions` pins that the
emulator alone does not, so these tests prove the proxy, not the emulator, is what enforces.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from google.api_core import exceptions as gexc
from google.cloud import storage as gcs_lib

CHUNK = 256 << 10  # the smallest resumable chunk GCS accepts


def _create_only(bucket, name: str, data: bytes) -> None:
    bucket.blob(name).upload_from_string(data, if_generation_match=0)


def test_raw_emulator_ignores_preconditions(gcs):
    """Without the proxy, a second create-only upload overwrites: nothing would be tested."""
    _create_only(gcs.bucket, "once.txt", b"first")
    _create_only(gcs.bucket, "once.txt", b"second")
    first = gcs.bucket.get_blob("once.txt").generation
    gcs.bucket.blob("once.txt").delete(if_generation_match=first + 1)  # stale: still deleted
    assert gcs.names() == []


def test_create_only_upload_succeeds_once(gcs_strict):
    _create_only(gcs_strict.bucket, "once.txt", b"first")
    # A default client (as a subprocess makes) finds the proxy through STORAGE_EMULATOR_HOST.
    default = gcs_lib.Client().bucket(gcs_strict.bucket.name)
    with pytest.raises(gexc.PreconditionFailed) as refused:
        _create_only(default, "once.txt", b"second")
    assert refused.value.code == 412
    [error] = refused.value.response.json()["error"]["errors"]
    assert error["reason"] == "conditionNotMet"
    assert gcs_strict.get("once.txt") == b"first"


def test_upload_matching_the_live_generation_replaces_it(gcs_strict):
    live = gcs_strict.put("x.txt", b"v1").generation
    with pytest.raises(gexc.PreconditionFailed):
        gcs_strict.bucket.blob("x.txt").upload_from_string(b"v2", if_generation_match=live + 1)
    gcs_strict.bucket.blob("x.txt").upload_from_string(b"v2", if_generation_match=live)
    assert gcs_strict.get("x.txt") == b"v2"


def test_copy_and_rewrite_are_create_only_on_the_destination(gcs_strict):
    bucket = gcs_strict.bucket
    source = gcs_strict.put("src.txt", b"payload")
    bucket.copy_blob(source, bucket, "copy.txt", if_generation_match=0)
    with pytest.raises(gexc.PreconditionFailed):
        bucket.copy_blob(source, bucket, "copy.txt", if_generation_match=0)

    bucket.blob("rewritten.txt").rewrite(source, if_generation_match=0)
    with pytest.raises(gexc.PreconditionFailed):
        bucket.blob("rewritten.txt").rewrite(source, if_generation_match=0)

    with pytest.raises(gexc.PreconditionFailed):  # ifSourceGenerationMatch names the source
        bucket.copy_blob(
            source, bucket, "other.txt", if_source_generation_match=source.generation + 1
        )
    assert gcs_strict.names() == ["copy.txt", "rewritten.txt", "src.txt"]
    assert gcs_strict.get("copy.txt") == gcs_strict.get("rewritten.txt") == b"payload"


def test_a_copy_from_a_missing_source_is_404_before_the_destinations_condition(gcs_strict):
    # The source is looked up first (storage-testbench rest_server.py objects_copy): onto an
    # existing destination, create-only, a gone source is 404, not the destination's 412.
    bucket = gcs_strict.bucket
    source = gcs_strict.put("src.txt", b"payload")
    bucket.copy_blob(source, bucket, "copy.txt", if_generation_match=0)
    source.delete()
    with pytest.raises(gexc.NotFound):
        bucket.copy_blob(source, bucket, "copy.txt", if_generation_match=0)
    with pytest.raises(gexc.NotFound):
        bucket.blob("copy.txt").rewrite(source, if_generation_match=0)


def test_delete_with_a_stale_generation_is_refused(gcs_strict):
    old = gcs_strict.put("x.txt", b"v1").generation
    new = gcs_strict.put("x.txt", b"v2").generation
    with pytest.raises(gexc.PreconditionFailed):
        gcs_strict.bucket.blob("x.txt").delete(if_generation_match=old)
    assert gcs_strict.get("x.txt") == b"v2"
    gcs_strict.bucket.blob("x.txt").delete(if_generation_match=new)
    assert gcs_strict.names() == []


def test_reads_and_patches_check_generation_and_metageneration(gcs_strict):
    blob = gcs_strict.put("x.txt", b"data")
    live, meta = blob.generation, blob.metageneration
    with pytest.raises(gexc.PreconditionFailed):
        gcs_strict.bucket.blob("x.txt").download_as_bytes(if_generation_match=live + 1)
    with pytest.raises(gexc.PreconditionFailed):
        gcs_strict.bucket.blob("x.txt").reload(if_generation_match=live + 1)
    with pytest.raises(gexc.NotModified):  # a failed *NotMatch is 304
        gcs_strict.bucket.blob("x.txt").reload(if_generation_not_match=live)
    assert gcs_strict.bucket.blob("x.txt").download_as_bytes(if_generation_match=live) == b"data"

    blob.metadata = {"k": "v"}
    with pytest.raises(gexc.PreconditionFailed):
        blob.patch(if_metageneration_match=meta + 1)
    blob.patch(if_metageneration_match=meta)
    assert gcs_strict.bucket.get_blob("x.txt").metadata == {"k": "v"}

    with pytest.raises(gexc.NotFound):  # a missing object is 404 before any condition
        gcs_strict.bucket.blob("gone.txt").download_as_bytes(if_generation_match=live)


def _put_chunk(session: str, data: bytes, start: int, total: int) -> requests.Response:
    end = start + len(data) - 1
    return requests.put(
        session, data=data, headers={"Content-Range": f"bytes {start}-{end}/{total}"}, timeout=30
    )


def test_resumable_upload_checks_its_condition_when_it_completes(gcs_strict, gcs):
    data = os.urandom(CHUNK + 1000)
    blob = gcs_strict.bucket.blob("big.bin")
    session = blob.create_resumable_upload_session(size=len(data), if_generation_match=0)
    assert _put_chunk(session, data[:CHUNK], 0, len(data)).status_code == 308
    gcs.put("big.bin", b"someone else")  # created while the upload runs
    last = _put_chunk(session, data[CHUNK:], CHUNK, len(data))
    assert last.status_code == 412 and "conditionNotMet" in last.text
    assert gcs_strict.get("big.bin") == b"someone else"

    # Checked at completion, not at the start: an object deleted meanwhile may be created.
    session = blob.create_resumable_upload_session(size=len(data), if_generation_match=0)
    gcs_strict.bucket.blob("big.bin").delete()
    assert _put_chunk(session, data[:CHUNK], 0, len(data)).status_code == 308
    assert _put_chunk(session, data[CHUNK:], CHUNK, len(data)).status_code == 200
    assert gcs_strict.get("big.bin") == data


def test_resumable_create_only_upload_through_the_client(gcs_faults):
    gcs, proxy = gcs_faults
    data = os.urandom((8 << 20) + 10)  # over the client's 8 MiB multipart limit: resumable
    gcs.bucket.blob("big.bin", chunk_size=16 * CHUNK).upload_from_string(
        data, if_generation_match=0
    )
    with pytest.raises(gexc.PreconditionFailed):
        gcs.bucket.blob("big.bin", chunk_size=16 * CHUNK).upload_from_string(
            b"x" * len(data), if_generation_match=0
        )
    assert gcs.get("big.bin") == data
    chunks = [method for method, path in proxy.log if "upload_id=" in path]
    assert chunks == ["PUT"] * 6  # two uploads of three chunks; the very last one refused
    assert proxy.gate.refused == [("PUT", f"{gcs.bucket.name}/big.bin", 412)]


RACER = """
import os, sys, time
from pathlib import Path
from google.api_core.exceptions import PreconditionFailed
from google.cloud import storage

bucket, name, folder, me = sys.argv[1:]
blob = storage.Client().bucket(bucket).blob(name)  # STORAGE_EMULATOR_HOST: the proxy
Path(folder, f"ready-{me}").touch()
while not Path(folder, "go").exists():
    time.sleep(0.002)
try:
    blob.upload_from_string(me.encode(), if_generation_match=0)
except PreconditionFailed:
    print("lost")
else:
    print("won")
"""


def test_parallel_processes_creating_one_object_one_wins(gcs_faults, tmp_path, monkeypatch):
    gcs, proxy = gcs_faults
    racers = 4
    read_live = proxy.gate._live

    def slow_check(key):  # widen the window between the check and the write
        live = read_live(key)
        time.sleep(0.1)
        return live

    monkeypatch.setattr(proxy.gate, "_live", slow_check)
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, gcs.bucket.name, "prize.txt", tmp_path, str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(racers)
    ]
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("ready-*"))) < racers and time.monotonic() < deadline:
        time.sleep(0.01)
    Path(tmp_path, "go").touch()
    outcomes = []
    for process in processes:
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        outcomes.append(out.strip())
    assert sorted(outcomes) == ["lost"] * (racers - 1) + ["won"]
    winner = outcomes.index("won")
    assert gcs.get("prize.txt") == str(winner).encode()


def test_reset_fault_drops_the_connection_mid_body(gcs_faults):
    gcs, proxy = gcs_faults
    fault = proxy.reset("POST", r"/upload/", after_bytes=1000)
    body = b"x" * 200_000
    url = f"{gcs.endpoint}/upload/storage/v1/b/{gcs.bucket.name}/o?uploadType=media&name=r.bin"
    with pytest.raises(requests.ConnectionError):
        requests.post(url, data=body, timeout=30)
    assert fault.hits == 1 and gcs.names() == []
    assert requests.post(url, data=body, timeout=30).status_code == 200  # once only
    assert gcs.get("r.bin") == body


def test_lost_reply_fault_lands_the_write_and_the_retry_meets_it(gcs_faults):
    """A create-only upload whose reply is lost is retried by the client and refused: 412."""
    gcs, proxy = gcs_faults
    lost = proxy.lose_reply("POST", r"/upload/")
    with pytest.raises(gexc.PreconditionFailed):
        _create_only(gcs.bucket, "once.txt", b"mine")  # the client retries on the reset
    assert lost.hits == 1 and gcs.get("once.txt") == b"mine"
