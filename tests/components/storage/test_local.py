"""The storage layer on local paths: the same functions the gs:// tests use, on disk."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components import serving, storage
from components.storage import gcs as storage_gcs
from components.storage import local
from contracts.errors import UserError
from tests.processes import REPO


def _tree(root, files):
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def test_list_files_fingerprints_are_sha256_and_hidden_files_skipped(tmp_path):
    _tree(tmp_path / "c", {"a.txt": b"a", "sub/b.txt": b"b", ".hidden": b"h"})
    files = storage.list_files(str(tmp_path / "c"))
    assert [f.uri for f in files] == [str(tmp_path / "c" / "a.txt"), str(tmp_path / "c/sub/b.txt")]
    assert files[0].sha256 == files[0].fingerprint == hashlib.sha256(b"a").hexdigest()
    assert files[0].generation is None and files[0].crc32c == ""
    with pytest.raises(UserError, match="nope"):
        storage.list_files(str(tmp_path / "nope"))


def test_read_write_copy_and_streamed_read(tmp_path):
    storage.write_text_atomic(tmp_path / "x" / "note.txt", "héllo\n")
    with storage.open_read(str(tmp_path / "x" / "note.txt")) as f:
        assert f.read(3) == b"h\xc3\xa9"[:3] and f.read() == b"llo\n"
    storage.copy(str(tmp_path / "x" / "note.txt"), str(tmp_path / "y" / "copy.txt"))
    assert storage.read_bytes(str(tmp_path / "y" / "copy.txt")) == "héllo\n".encode()
    assert [p.name for p in (tmp_path / "x").iterdir()] == ["note.txt"]  # no temporaries left


def test_publish_dir_is_atomic_and_refuses_to_overwrite(tmp_path):
    source = _tree(tmp_path / "src", {"saved_model.pb": b"g", "variables/v": b"v"})
    storage.publish_dir(source, tmp_path / "serving" / "1", ready="saved_model.pb")
    assert storage.same_files(str(source), str(tmp_path / "serving" / "1"))
    with pytest.raises(FileExistsError):
        storage.publish_dir(source, tmp_path / "serving" / "1")
    assert [p.name for p in (tmp_path / "serving").iterdir()] == ["1"]
    assert storage.finish_publishes(str(tmp_path / "serving")) == {}


def test_folder_checks(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    assert storage.has_content(str(tmp_path / "file"))
    assert not storage.has_content(str(tmp_path / "empty"))
    assert not storage.has_content(str(tmp_path / "missing"))
    with pytest.raises(UserError, match="destination is not a folder"):
        storage.check_folder(str(tmp_path / "file"), "destination")
    storage.check_folder(str(tmp_path / "empty"), "destination")


def test_versions_and_rollback_on_disk(tmp_path):
    dest = tmp_path / "serving"
    for version, graph in ((1, b"one"), (2, b"two")):
        _tree(dest / str(version), {"saved_model.pb": graph, "variables/v": graph})
    (dest / "5").mkdir()  # incomplete: never a version, never reused
    assert serving.serving_versions(dest) == [1, 2] and serving.next_serving_version(dest) == 6
    assert serving.rollback(str(dest), 1) == 6
    assert (dest / "6" / "saved_model.pb").read_bytes() == b"one"
    assert serving.serving_versions(dest) == [1, 2, 6]
    with pytest.raises(UserError, match=r"version 5: .*complete versions are \[1, 2, 6\]"):
        serving.rollback(str(dest), 5)


def test_uri_helpers():
    assert storage.is_gcs("gs://b/k") and not storage.is_gcs("/tmp/gs://")
    assert storage.split_gcs("gs://b/a/b.txt") == ("b", "a/b.txt")
    assert storage.join("gs://b/a/", "1", "saved_model.pb") == "gs://b/a/1/saved_model.pb"
    assert storage.staging_uri("gs://b/serving/3") == "gs://b/serving/.staging-3"
    with pytest.raises(UserError, match="names no bucket"):
        storage.split_gcs("gs:///x")
    regex = storage_gcs._glob_regex("c/*.txt")
    assert regex.match("c/a.txt") and not regex.match("c/d/a.txt")
    assert storage_gcs._glob_regex("c/**/[ab].txt").match("c/d/e/b.txt")


def test_a_path_that_exists_is_taken_as_written_not_as_a_glob(tmp_path):
    (tmp_path / "notes[1].txt").write_text("bracketed")
    (tmp_path / "notes1.txt").write_text("what the glob would match")
    (tmp_path / ".corpus.txt").write_text("hidden, but named exactly")
    [exact] = storage.list_files(str(tmp_path / "notes[1].txt"))
    assert exact.uri == str(tmp_path / "notes[1].txt")
    [hidden] = storage.list_files(str(tmp_path / ".corpus.txt"))
    assert hidden.uri == str(tmp_path / ".corpus.txt")
    globbed = storage.list_files(str(tmp_path / "notes[12].txt"))  # names no file: a glob
    assert [f.uri for f in globbed] == [str(tmp_path / "notes1.txt")]
    # a folder whose name holds a wildcard character is a folder too
    (tmp_path / "books [draft]").mkdir()
    (tmp_path / "books [draft]" / "a.txt").write_text("a")
    listed = storage.list_files(str(tmp_path / "books [draft]"))
    assert [f.uri for f in listed] == [str(tmp_path / "books [draft]" / "a.txt")]


def test_files_under_hidden_folders_are_not_corpus(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / ".git" / "objects").mkdir(parents=True)
    (corpus / ".git" / "objects" / "blob").write_text("not text")
    (corpus / "books").mkdir()
    (corpus / "books" / "a.txt").write_text("a")
    (corpus / ".notes.txt").write_text("hidden")
    listed = [Path(f.uri).relative_to(corpus.resolve()) for f in storage.list_files(str(corpus))]
    assert listed == [Path("books/a.txt")]
    globbed = storage.list_files(str(corpus / "**" / "*"))
    assert [Path(f.uri).name for f in globbed] == ["a.txt"]


@pytest.mark.parametrize("publish", ["atomic_dir", "publish_dir"])
def test_a_dead_writers_temporary_is_removed_once_stale_and_a_live_ones_kept(tmp_path, publish):
    final = tmp_path / "datasets" / "v2"
    final.parent.mkdir()
    # killed writers of this name and of another (a run started again after a killed one
    # writes its name once), and a live writer whose top folder is old but whose shards are not
    dead, other = final.parent / ".v2.tmp-dead0000", final.parent / ".v1.tmp-dead1111"
    live = final.parent / ".v3.tmp-live0000"
    old = time.time() - local.STALE_TEMP_S - 60
    for folder in (dead, other, live):
        (folder / "Split-train").mkdir(parents=True)
        (folder / "Split-train" / "shard-0").write_bytes(b"half")
        for path in (folder / "Split-train" / "shard-0", folder / "Split-train", folder):
            if folder != live or path == folder:
                os.utime(path, (old, old))
    killed_file = final.parent / ".manifest.json.tmp-dead2222"  # a write_bytes killed mid-way
    killed_file.write_bytes(b"{")
    os.utime(killed_file, (old, old))
    if publish == "atomic_dir":
        with storage.atomic_dir(final) as tmp:
            (tmp / "manifest.json").write_text("{}")
    else:
        source = tmp_path / "model"
        source.mkdir()
        (source / "manifest.json").write_text("{}")
        local.publish_dir(source, final)
    assert not dead.exists() and not other.exists() and not killed_file.exists()
    assert live.is_dir()
    assert (final / "manifest.json").is_file()


def test_list_tree_skips_what_another_process_removed_after_listing(tmp_path, monkeypatch):
    """A claim's temporary file renamed away between the listing and the stat (another push's
    `create_exclusive`, seen in CI as FileNotFoundError in a racing rollback) is not in the tree."""
    _tree(tmp_path / "claims", {"3": b"{}", ".3.tmp-x": b"{}", "gone/4": b"{}"})
    real_walk = os.walk

    def walk_then_remove(root, *args, **kwargs):
        for folder, dirs, names in real_walk(root, *args, **kwargs):
            for name in names:
                if name != "3":
                    os.remove(os.path.join(folder, name))  # listed, then gone
            yield folder, dirs, names

    monkeypatch.setattr(local.os, "walk", walk_then_remove)
    assert list(local.list_tree(str(tmp_path / "claims"))) == ["3"]


def test_local_work_never_loads_the_google_cloud_client(tmp_path):
    """google-cloud-storage and google-api-core cost a process 0.2 s to import: a tokenize
    part, a step and a command that touch no gs:// URI never load them."""
    script = (
        "import sys; from components import storage; from components.tokenize import parts; "
        f"storage.write_bytes({str(tmp_path / 'x')!r}, b'1'); "
        f"storage.list_tree({str(tmp_path)!r}); "
        "print(sorted(m for m in sys.modules if m.startswith(('google.cloud', 'google.api_core'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert done.stdout.strip() == "[]", done.stdout
