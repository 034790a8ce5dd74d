"""The storage layer on gs://, over HTTP against gcp-storage-emulator (no mocks of the client).

Emulator gaps (gcp-storage-emulator 2024.x, checked in its handlers; pinned by
`test_emulator_gaps_are_as_documented`, so an upgrade that closes one fails it and tells us
to test the real behaviour instead):

1. Preconditions are ignored: `ifGenerationMatch` (upload, copy, get, download) never
   returns 412. Real GCS answers 412, which the storage layer relies on (create-only claims
   and copies, ObjectChangedError on reads). The `gcs_strict` and `gcs_faults` fixtures put
   tests/doubles/gcs/gate.py's PreconditionGate in front of the emulator, which enforces them as GCS
   does (tests/faults/test_gcs_proxy.py pins it); tests here on the raw `gcs` fixture check
   the end-of-read checks (live generation and crc32c) that work even without 412s.
2. Reading `?generation=N` returns the live object, whatever N (real GCS: 404 once the
   generation is gone). Same fallback as 1.
3. No IAM and no throttling: it never answers 403, 429 or 5xx. Tested through FaultProxy,
   which answers chosen requests with GCS's own error body and forwards the rest.
4. One request at a time (http.server.HTTPServer, not threading): parallel transfers cannot
   overlap on the server, so the benchmark's parallel speed-up understates real GCS.

What it does support and these tests use: generations (a new one on every write), crc32c and
md5 computed by the server, chunked resumable uploads (308 Resume Incomplete), ranged
downloads, copyTo, prefix/delimiter/matchGlob listing, 404 for a missing bucket.
"""

from __future__ import annotations

import errno
import inspect
import os
from pathlib import Path

import pytest
from gcp_storage_emulator.server import APIThread
from google.api_core import exceptions as gexc
from google.cloud.storage.retry import DEFAULT_RETRY

from components import serving, storage
from components.storage import gcs as storage_gcs
from contracts.errors import UserError


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


FILES = {
    "a.txt": b"alpha\n",
    "sub/b.txt": b"bravo\n" * 100,
    "sub/deeper/c.bin": os.urandom(3000),
    "empty.txt": b"",
}


# ---- what the emulator does and does not do ------------------------------------------------


def test_emulator_gaps_are_as_documented(gcs):
    first = gcs.put("gap.txt", b"one")
    # 1: a precondition that real GCS rejects with 412 is accepted.
    gcs.bucket.blob("gap.txt").upload_from_string(b"two", if_generation_match=first.generation)
    gcs.bucket.blob("gap.txt").upload_from_string(b"three", if_generation_match=0)
    # 2: reading an old generation returns the live bytes.
    assert gcs.bucket.blob("gap.txt", generation=first.generation).download_as_bytes() == b"three"
    # 3: no IAM: an anonymous client may do anything, where real GCS answers 403.
    assert gcs.client.bucket(gcs.bucket.name).test_iam_permissions(["storage.objects.get"])
    # 4: the server handles one request at a time.
    assert "server.HTTPServer(" in inspect.getsource(APIThread.run)


def test_generation_changes_on_every_write_and_crc32c_is_the_servers(gcs, tmp_path):
    first = gcs.put("x.txt", b"same bytes")
    second = gcs.put("x.txt", b"same bytes")
    assert second.generation != first.generation
    assert second.crc32c == first.crc32c
    local = _tree(tmp_path, {"x.txt": b"same bytes"}) / "x.txt"
    assert storage.crc32c_file(local) == first.crc32c


def test_large_object_goes_up_in_resumable_chunks(gcs, tmp_path, monkeypatch):
    monkeypatch.setattr(storage_gcs, "RESUMABLE_THRESHOLD", 256 * 1024)
    monkeypatch.setattr(storage_gcs, "UPLOAD_CHUNK_BYTES", 256 * 1024)
    data = os.urandom(1024 * 1024 + 17)  # 5 chunks, the last one short
    path = _tree(tmp_path, {"big.bin": data}) / "big.bin"
    info = storage.upload_file(path, gcs.uri("big.bin"))
    assert info.size == len(data) and info.crc32c == storage.crc32c_file(path)
    assert gcs.get("big.bin") == data


# ---- list, read, write, copy, folders -------------------------------------------------------


def test_list_gives_fingerprints_without_downloading(gcs_faults, tmp_path):
    gcs, proxy = gcs_faults
    for rel, data in FILES.items():
        gcs.put(f"corpus/{rel}", data)
    gcs.put("corpus/.hidden.txt", b"never listed")
    gcs.put("corpus/.tmp/x.txt", b"never listed")
    gcs.put("corpus2/other.txt", b"not under corpus/")
    proxy.log.clear()

    folder = storage.list_files(gcs.uri("corpus"))
    assert [f.uri for f in folder] == [gcs.uri("corpus", rel) for rel in sorted(FILES)]
    for info in folder:
        blob = gcs.bucket.get_blob(info.uri.split("/", 3)[3])
        assert (info.size, info.generation, info.crc32c, info.md5, info.sha256) == (
            blob.size,
            blob.generation,
            blob.crc32c,
            blob.md5_hash,
            "",
        )
    assert storage.list_files(gcs.uri("corpus/")) == folder
    assert [f.uri for f in storage.list_files(gcs.uri("corpus/*.txt"))] == [
        gcs.uri("corpus/a.txt"),
        gcs.uri("corpus/empty.txt"),
    ]
    assert [f.uri for f in storage.list_files(gcs.uri("corpus/**/*.txt"))] == [
        gcs.uri("corpus/sub/b.txt")
    ]
    assert [f.uri for f in storage.list_files(gcs.uri("corpus/a.txt"))] == [gcs.uri("corpus/a.txt")]
    assert storage.list_files(gcs.uri("corpus/*.md")) == []
    # An object named exactly is taken as it is, whatever its name holds; a pattern that
    # names no object is still a glob.
    gcs.put("named/notes[1].txt", b"bracketed")
    gcs.put("named/notes1.txt", b"what the glob would match")
    [exact] = storage.list_files(gcs.uri("named/notes[1].txt"))
    assert exact.uri == gcs.uri("named/notes[1].txt") and exact.size == len(b"bracketed")
    globbed = storage.list_files(gcs.uri("named/notes[12].txt"))
    assert [f.uri for f in globbed] == [gcs.uri("named/notes1.txt")]
    assert not [path for method, path in proxy.log if "alt=media" in path or "/download/" in path]
    # A folder made in the Cloud Console has a zero-byte placeholder object "corpus/": it is
    # not the file "corpus/" names, nor one of the folder's files.
    gcs.put("corpus/", b"")
    assert storage.list_files(gcs.uri("corpus/")) == storage.list_files(gcs.uri("corpus")) == folder


def test_write_then_streamed_read(gcs, monkeypatch):
    monkeypatch.setattr(storage_gcs, "READ_CHUNK_BYTES", 1000)  # many ranged GETs
    data = os.urandom(5500)
    storage.write_bytes(gcs.uri("r/data.bin"), data)
    [info] = storage.list_files(gcs.uri("r/data.bin"))
    with storage.open_read(info.uri, expect=info) as f:
        parts = [f.read(700) for _ in range(3)]
        parts.append(f.read())
    assert b"".join(parts) == data
    storage.write_text_atomic(gcs.uri("r/note.txt"), "héllo\n")
    assert storage.read_bytes(gcs.uri("r/note.txt")) == "héllo\n".encode()


def test_upload_and_download_folder_round_trip(gcs, tmp_path):
    source = _tree(tmp_path / "src", FILES)
    uploaded = storage.upload_dir(source, gcs.uri("tree"), workers=4)
    assert sorted(uploaded) == sorted(FILES)
    assert gcs.names("tree/") == sorted(f"tree/{rel}" for rel in FILES)
    assert storage.download_dir(gcs.uri("tree"), tmp_path / "back", workers=4) == len(FILES)
    for rel, data in FILES.items():
        assert (tmp_path / "back" / rel).read_bytes() == data
    assert storage.same_files(str(source), gcs.uri("tree"))


def test_copy_in_every_direction(gcs, tmp_path):
    local = _tree(tmp_path, {"one.txt": b"one"}) / "one.txt"
    storage.copy(str(local), gcs.uri("c/one.txt"))
    storage.copy(gcs.uri("c/one.txt"), gcs.uri("c/two.txt"))
    storage.copy(gcs.uri("c/two.txt"), str(tmp_path / "back" / "two.txt"))
    assert (tmp_path / "back" / "two.txt").read_bytes() == b"one"
    assert gcs.get("c/two.txt") == b"one"


def test_publish_copies_ready_last_verifies_and_removes_staging(gcs, tmp_path, monkeypatch):
    source = _tree(tmp_path / "model", {**FILES, "saved_model.pb": b"graph"})
    order = []
    real_copy = storage_gcs.copy_object
    monkeypatch.setattr(
        storage_gcs, "copy_object", lambda s, d, **kw: order.append(d) or real_copy(s, d, **kw)
    )
    storage.publish_dir(source, gcs.uri("serving/1"), ready="saved_model.pb")
    assert order[-1] == gcs.uri("serving/1/saved_model.pb") and len(order) == len(FILES) + 1
    assert gcs.names("serving/") == sorted(f"serving/1/{r}" for r in [*FILES, "saved_model.pb"])
    assert serving.serving_versions(gcs.uri("serving")) == [1]
    with pytest.raises(FileExistsError):
        storage.publish_dir(source, gcs.uri("serving/1"), ready="saved_model.pb")


@pytest.mark.fault("a push's staging folder promoted meanwhile by another push (gs://)")
def test_a_publish_whose_staging_another_step_finished_meanwhile_succeeds(
    gcs_strict, tmp_path, monkeypatch
):
    """Both succeed: the publisher finds its staging gone and the folder complete.

    Another push found the staging complete (its manifest written), promoted it through
    serving.finish_interrupted and deleted it, while its publisher was promoting it."""
    from components.storage import publish

    source = _tree(tmp_path / "model", {**FILES, "saved_model.pb": b"graph"})
    real_promote, finished = publish._promote, {}

    def promote_after_another_step_did(*args):
        # The other step runs between this publisher's manifest and its first copy.
        monkeypatch.setattr(publish, "_promote", real_promote)
        finished.update(storage.finish_publishes(gcs_strict.uri("serving"), "saved_model.pb"))
        return real_promote(*args)

    monkeypatch.setattr(publish, "_promote", promote_after_another_step_did)
    storage.publish_dir(source, gcs_strict.uri("serving/1"), ready="saved_model.pb")
    assert finished == {gcs_strict.uri("serving/1"): "finished"}
    names = [*FILES, "saved_model.pb"]
    assert gcs_strict.names("serving/") == sorted(f"serving/1/{r}" for r in names)


@pytest.mark.fault("a staging folder finished by another step while this one reads it (gs://)")
def test_finishing_publishes_skips_a_staging_that_goes_while_it_is_read(
    gcs_strict, tmp_path, monkeypatch
):
    from components.storage import publish

    class Killed(Exception):
        pass

    def die(*args):
        raise Killed

    source = _tree(tmp_path / "model", {"a.txt": b"alpha", "saved_model.pb": b"graph"})
    real_promote = publish._promote
    monkeypatch.setattr(publish, "_promote", die)  # the publisher dies after its manifest
    with pytest.raises(Killed):
        storage.publish_dir(source, gcs_strict.uri("serving/1"), ready="saved_model.pb")
    monkeypatch.setattr(publish, "_promote", real_promote)
    real_read = publish.read_bytes

    def read_after_another_step_finished(uri):
        # Another step's call promotes the staging (and deletes it) right before this read.
        monkeypatch.setattr(publish, "read_bytes", real_read)
        other = storage.finish_publishes(gcs_strict.uri("serving"), "saved_model.pb")
        assert other == {gcs_strict.uri("serving/1"): "finished"}
        return real_read(uri)

    monkeypatch.setattr(publish, "read_bytes", read_after_another_step_finished)
    assert storage.finish_publishes(gcs_strict.uri("serving"), "saved_model.pb") == {}
    assert gcs_strict.names("serving/") == ["serving/1/a.txt", "serving/1/saved_model.pb"]


@pytest.mark.fault("the local disk fills while a step builds a gs:// artifact")
def test_a_full_local_disk_under_a_gcs_artifact_is_one_line_naming_both(gcs):
    with pytest.raises(UserError) as raised, storage.atomic_dir(gcs.uri("out")) as tmp:
        (tmp / "part.txt").write_text("half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp / "part.txt"))
    message = str(raised.value)
    assert f"(the local copy of {gcs.uri('out')}): No space left on device" in message
    assert "\n" not in message and str(tmp) in message
    assert gcs.names() == [] and not tmp.exists()


def test_atomic_dir_publishes_to_gcs_only_on_success(gcs):
    with pytest.raises(RuntimeError, match="boom"), storage.atomic_dir(gcs.uri("out")) as tmp:
        (tmp / "part.txt").write_text("half")
        raise RuntimeError("boom")
    assert gcs.names() == []
    with storage.atomic_dir(gcs.uri("out"), ready="manifest.json") as tmp:
        (tmp / "data.txt").write_text("data")
        (tmp / "manifest.json").write_text("{}")
    assert gcs.names() == ["out/data.txt", "out/manifest.json"]
    assert storage.has_content(gcs.uri("out")) and not storage.has_content(gcs.uri("ou"))


def test_retries_429_and_503_with_backoff(gcs_faults, monkeypatch):
    gcs, proxy = gcs_faults
    monkeypatch.setattr(storage_gcs, "retry", lambda: DEFAULT_RETRY.with_delay(0.01, 0.05, 2.0))
    upload = proxy.fail("POST", r"/upload/storage/v1/b/.*/o\?", 503, times=2)
    listing = proxy.fail("GET", r"/storage/v1/b/[^/]+/o\?", 429, times=2)
    storage.write_bytes(gcs.uri("retry.txt"), b"made it")
    assert [f.uri for f in storage.list_files(gcs.uri("retry.txt"))] == [gcs.uri("retry.txt")]
    assert (upload.hits, listing.hits) == (2, 2)
    assert gcs.get("retry.txt") == b"made it"


# ---- bad input: one UserError naming the bucket or object -----------------------------------


def test_missing_bucket_is_named(gcs, tmp_path):
    missing = "gs://no-such-bucket-gptpipe/corpus"
    for call in (
        lambda: storage.list_files(missing),
        lambda: storage.read_bytes(f"{missing}/a.txt"),
        lambda: storage.write_bytes(f"{missing}/a.txt", b"x"),
        lambda: storage.upload_dir(_tree(tmp_path, {"a": b"a"}), missing),
    ):
        with pytest.raises(UserError, match="bucket 'no-such-bucket-gptpipe' does not exist"):
            call()


def test_permission_denied_is_named(gcs_faults):
    gcs, proxy = gcs_faults
    proxy.fail("GET", r"/o\?", 403)
    with pytest.raises(
        UserError, match=rf"permission denied \(403\) on {gcs.uri('x')}.*bucket '{gcs.bucket.name}'"
    ):
        storage.list_files(gcs.uri("x"))


def test_object_replaced_between_listing_and_read_is_named(gcs):
    gcs.put("in/a.txt", b"version one")
    [info] = storage.list_files(gcs.uri("in/a.txt"))
    gcs.put("in/a.txt", b"version one")  # same bytes, new generation
    with pytest.raises(
        storage.ObjectChangedError, match=rf"{info.uri} changed during the run.*generation"
    ):
        storage.read_bytes(info.uri, expect=info)


def test_object_replaced_mid_stream_is_named(gcs, monkeypatch):
    monkeypatch.setattr(storage_gcs, "READ_CHUNK_BYTES", 1000)
    gcs.put("in/big.txt", b"a" * 5000)
    [info] = storage.list_files(gcs.uri("in/big.txt"))
    changed = pytest.raises(storage.ObjectChangedError, match="in/big.txt changed during the run")
    with changed, storage.open_read(info.uri, expect=info) as f:
        f.read(1500)
        gcs.put("in/big.txt", b"b" * 5000)
        f.read()


def test_empty_prefix_is_named(gcs):
    gcs.put("elsewhere/a.txt", b"a")
    with pytest.raises(
        UserError, match=rf"nothing at {gcs.uri('corpus')}.*bucket '{gcs.bucket.name}'"
    ):
        storage.list_files(gcs.uri("corpus"))
    with pytest.raises(UserError, match=f"no objects under {gcs.uri('corpus')}"):
        storage.download_dir(gcs.uri("corpus"), "/nonexistent-never-written")


def test_destination_that_is_an_object_is_named(gcs):
    gcs.put("serving/model", b"a file where a folder should be")
    with pytest.raises(
        UserError, match=f"push destination is not a folder: {gcs.uri('serving/model')}"
    ):
        storage.check_folder(gcs.uri("serving/model"), "push destination")
    storage.check_folder(gcs.uri("serving"), "push destination")


def test_missing_object_is_named(gcs):
    with pytest.raises(UserError, match=f"object {gcs.uri('nope.txt')} not found"):
        storage.read_bytes(gcs.uri("nope.txt"))
    with pytest.raises(gexc.NotFound):  # the client itself, for contrast: no bucket, no object
        gcs.bucket.blob("nope.txt").download_as_bytes()


def test_folder_markers_are_deleted_and_nothing_else(gcs):
    # What TensorFlow's GCS file system leaves (tf.io.gfile.makedirs writes "<folder>/"), and
    # what KFP's launcher would download as files where the Model's folders go.
    for name in ("model/", "model/Format-Serving/", "model/Format-Serving/variables/"):
        gcs.put(name, b"")
    gcs.put("model/Format-Serving/saved_model.pb", b"graph")
    gcs.put("model/Format-Serving/variables/variables.index", b"index")
    gcs.put("other/", b"")
    assert storage.delete_folder_markers(gcs.uri("model")) == 3
    assert sorted(gcs.names("model")) == [
        "model/Format-Serving/saved_model.pb",
        "model/Format-Serving/variables/variables.index",
    ]
    assert gcs.names("other/") == ["other/"]
    assert storage.delete_folder_markers(gcs.uri("model")) == 0


def test_deleting_a_tree_deletes_its_folder_markers_too(gcs):
    # A backup TensorFlow wrote: left behind, its markers would still make the folder exist.
    for name in ("work/backup/", "work/backup/chief/", "work/backup/chief/ckpt.index"):
        gcs.put(name, b"" if name.endswith("/") else b"index")
    gcs.put("work/backups-other/kept", b"x")
    storage.delete_tree(gcs.uri("work/backup"))
    assert gcs.names("work/") == ["work/backups-other/kept"]


@pytest.mark.slow
def test_no_credentials_is_one_user_error_saying_how_to_provide_them(monkeypatch, tmp_path):
    from components.storage import gcs as storage_gcs_module

    # No emulator, no key file, no gcloud config, no metadata server: what a laptop has.
    for name in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")  # nothing listens: not on GCE
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    storage_gcs_module.set_client(None)
    try:
        with pytest.raises(UserError, match="gcloud auth application-default login"):
            storage.list_files("gs://bucket/corpus/")
    finally:
        storage_gcs_module.set_client(None)
