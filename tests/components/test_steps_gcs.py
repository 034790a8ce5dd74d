"""The steps on gs://: tokenize, push, rollback and the evaluate baseline, against the emulator.

See test_storage_gcs.py for the emulator's gaps; the tests here only use what it supports.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from components import serving, storage
from components.evaluate import executor as evaluate
from components.push import executor as push
from components.storage import gcs as storage_gcs
from components.storage.publish import STAGING_PREFIX
from components.tokenize import executor as tokenize
from contracts.artifacts import MODEL_COMPLETE, RETIRED_FILE
from contracts.errors import UserError
from contracts.eval_text import EvalPiece, piece_line
from contracts.examples import GcsSource, parse_manifest
from tests.tiny import saved_model_graph

SHAKESPEARE = Path(__file__).resolve().parents[2] / "data" / "tinyshakespeare.txt"
VOCAB = 340  # the smallest vocabulary a Shakespeare slice trains (see test_tokenize.py)
SEQ_LEN = 32


@pytest.fixture(scope="module")
def corpus_text() -> str:
    text = SHAKESPEARE.read_text(encoding="utf-8")[:12_000]
    return text[: text.rindex("\n") + 1]


def _tokenize(corpus: str, out: str):
    return tokenize.run(corpus, out, vocab_size=VOCAB, seq_len=SEQ_LEN, progress=False)


def _shards_and_model(root: str) -> dict[str, str]:
    return {rel: crc for rel, crc in storage.tree_crc32c(root).items() if rel != "manifest.json"}


# ---- tokenize -------------------------------------------------------------------------------


def test_tokenize_reads_gcs_writes_gcs_and_matches_a_local_run(gcs, tmp_path, corpus_text):
    # documents, a file each, whole to train or to eval: a.txt and 30 in sub/
    documents = {"a.txt": corpus_text[:400]}
    documents.update(
        {f"sub/{i:02d}.txt": corpus_text[400 + 380 * i : 780 + 380 * i] for i in range(30)}
    )
    for name, text in documents.items():
        gcs.put(f"corpus/{name}", text.encode())
    gcs.put("corpus/.staging-x/ignored.txt", b"hidden: never read")
    manifest = _tokenize(gcs.uri("corpus"), gcs.uri("examples"))

    names = gcs.names("examples/")
    assert "examples/manifest.json" in names and not [n for n in names if "/." in n]
    assert parse_manifest(gcs.get("examples/manifest.json"), "manifest.json") == manifest
    assert [s.uri for s in manifest.sources] == [gcs.uri(f"corpus/{n}") for n in documents]
    blob = gcs.bucket.get_blob("corpus/a.txt")
    assert manifest.sources[0] == GcsSource(
        uri=gcs.uri("corpus/a.txt"),
        size=blob.size,
        crc32c=blob.crc32c,
        md5=blob.md5_hash,
        generation=blob.generation,
    )
    (tmp_path / "docs" / "sub").mkdir(parents=True)
    for name, text in documents.items():
        (tmp_path / "docs" / name).write_text(text, encoding="utf-8")
    local = _tokenize(str(tmp_path / "docs"), str(tmp_path / "examples"))
    # The same shards, but only gs:// lists each one's crc32c free, so only there is it kept:
    # GCS's, of the same bytes as the local shard's.
    for split, stats in manifest.splits.items():
        assert local.splits[split] == dataclasses.replace(stats, shard_crc32c=())
        files = [tmp_path / "examples" / name for name in stats.shards]
        assert stats.shard_crc32c == tuple(storage.crc32c_file(f) for f in files)
    assert _shards_and_model(gcs.uri("examples")) == _shards_and_model(str(tmp_path / "examples"))


@pytest.mark.bad_input("a given tokenizer that is missing, a folder, or a missing gs:// object")
def test_a_given_tokenizer_that_cannot_be_read_is_named_with_why(gcs, tmp_path):
    from components.tokenize import bpe

    cases = {
        str(tmp_path / "nope.model"): "not found; give a SentencePiece .model file",
        str(tmp_path): "is a folder; give the SentencePiece .model file in it",
        gcs.uri("tok/nope.model"): "not found; give a SentencePiece .model file",
    }
    for path, says in cases.items():
        with pytest.raises(UserError, match=f"tokenizer '{re.escape(path)}' {says}"):
            bpe.read_given(path, vocab_size=512)


def test_dataset_version_follows_bytes_not_generation(gcs, corpus_text):
    """Documented choice (tokenize.run): same bytes re-uploaded keep the version."""
    gcs.put("c/text.txt", corpus_text.encode())
    first = _tokenize(gcs.uri("c/text.txt"), gcs.uri("out1"))
    gcs.put("c/text.txt", corpus_text.encode())  # same bytes: a new generation
    again = _tokenize(gcs.uri("c"), gcs.uri("out2"))  # the folder holding only that file
    assert again.sources[0].generation != first.sources[0].generation
    assert again.dataset_version == first.dataset_version
    gcs.put("c/text.txt", corpus_text.replace("Citizen", "Citizan", 1).encode())
    changed = _tokenize(gcs.uri("c/*.txt"), gcs.uri("out3"))
    assert changed.dataset_version != first.dataset_version


def test_tokenize_stops_when_an_object_changes_during_the_run(gcs, corpus_text, monkeypatch):
    gcs.put("c/text.txt", corpus_text.encode())
    real_list = storage.list_files

    def list_then_overwrite(pattern):
        listed = real_list(pattern)
        gcs.put("c/text.txt", corpus_text.encode())  # another writer, mid-run
        return listed

    monkeypatch.setattr(storage, "list_files", list_then_overwrite)
    with pytest.raises(UserError, match=f"{gcs.uri('c/text.txt')}' changed while it was read"):
        _tokenize(gcs.uri("c"), gcs.uri("out"))
    assert gcs.names("out") == []


@pytest.mark.parametrize(
    "corpus, message",
    [
        ("gs://no-such-bucket-gptpipe/c", "bucket 'no-such-bucket-gptpipe' does not exist"),
        ("{bucket}/empty/", r"nothing at gs://.*/empty/: bucket"),
        ("{bucket}/c/*.md", r"\*\.md.*no files"),
    ],
)
def test_tokenize_bad_gcs_corpus_is_one_user_error(gcs, corpus, message):
    gcs.put("c/text.txt", b"some text\n")
    with pytest.raises(UserError, match=message):
        _tokenize(corpus.format(bucket=gcs.uri()), gcs.uri("out"))
    assert gcs.names("out") == []


class PodKilled(BaseException):
    """A killed process: like SIGKILL, it skips every `except Exception` clean-up on its way."""


def die_after_two_copies(monkeypatch):
    """Make the process 'die' (PodKilled) after two object copies into a final folder (the
    promotion); copies into a staging folder, and tokenize's parts' own publishes into its work
    folder, all land. Return the real copy."""
    real_copy = storage_gcs.copy_object
    copies = []

    def copy_then_die(source, destination, **kwargs):
        if STAGING_PREFIX not in destination and ".work/" not in destination:
            if len(copies) == 2:
                raise PodKilled("pod evicted")
            copies.append(destination)
        return real_copy(source, destination, **kwargs)

    monkeypatch.setattr(storage_gcs, "copy_object", copy_then_die)
    monkeypatch.setattr(storage_gcs, "WORKERS", 1)  # deterministic: exactly two copies land
    return real_copy


@pytest.mark.fault("tokenize killed while promoting its dataset to gs://")
def test_a_dataset_publish_killed_midway_is_finished_by_the_next_run(gcs, corpus_text, monkeypatch):
    gcs.put("corpus/shakespeare.txt", corpus_text.encode("utf-8"))
    corpus, root = gcs.uri("corpus/"), gcs.uri("datasets")
    options = {"vocab_size": VOCAB, "seq_len": SEQ_LEN, "progress": False}
    real_copy = die_after_two_copies(monkeypatch)
    with pytest.raises(PodKilled):
        tokenize.run_content_addressed(corpus, root, **options)
    # Part of the version's folder is in place, without its manifest: not a dataset yet.
    assert any(".staging-" in n for n in gcs.names("datasets/"))
    monkeypatch.setattr(storage_gcs, "copy_object", real_copy)
    again = tokenize.run_content_addressed(corpus, root, **options)
    assert again.reused  # the interrupted copy was finished, not refused as "already exists"
    assert gcs.names(f"datasets/{again.manifest.dataset_version}/manifest.json")
    assert not [n for n in gcs.names("datasets/") if ".staging-" in n]


def test_tokenize_refuses_a_gcs_output_with_content(gcs, corpus_text):
    gcs.put("c/text.txt", corpus_text.encode())
    gcs.put("out/old.txt", b"x")
    with pytest.raises(UserError, match="out.*not empty"):
        _tokenize(gcs.uri("c"), gcs.uri("out"))


# ---- push and rollback ----------------------------------------------------------------------


def _model(tmp_path: Path, name: str, label: str = "graph") -> str:
    saved = tmp_path / name / "Format-Serving"
    (saved / "variables").mkdir(parents=True)
    (saved / "saved_model.pb").write_bytes(saved_model_graph(label))
    (saved / "variables" / "variables.index").write_bytes(f"index {label}".encode())
    (saved / "variables" / "variables.data-00000-of-00001").write_bytes(f"data {label}".encode())
    (saved / "fingerprint.pb").write_bytes(f"fp {label}".encode())
    (tmp_path / name / MODEL_COMPLETE).write_text("")
    return str(tmp_path / name)


def _blessing(tmp_path: Path, name: str = "blessing") -> str:
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    (folder / "BLESSED").write_text("")
    return str(folder)


def _push(tmp_path: Path, model: str, dest: str, name: str):
    return push.run(model, _blessing(tmp_path), dest, str(tmp_path / name))


def test_push_to_gcs_publishes_increasing_complete_versions(gcs, tmp_path):
    dest = gcs.uri("serving/gpt")
    first = _push(tmp_path, _model(tmp_path, "m1", "one"), dest, "p1")
    second = _push(tmp_path, _model(tmp_path, "m2", "two"), dest, "p2")
    assert (first.pushed_version, second.pushed_version) == ("1", "2")
    assert serving.serving_versions(dest) == [1, 2]
    assert gcs.get("serving/gpt/2/saved_model.pb") == saved_model_graph("two")
    assert storage.same_files(str(tmp_path / "m2" / "Format-Serving"), f"{dest}/2")
    assert not [n for n in gcs.names() if ".staging-" in n]


@pytest.mark.fault("a push killed between objects on gs://")
def test_push_interrupted_between_copies_never_exposes_a_version_and_rerun_finishes(
    gcs, tmp_path, monkeypatch
):
    dest = gcs.uri("serving")
    model = _model(tmp_path, "m")
    real_copy = die_after_two_copies(monkeypatch)
    with pytest.raises(PodKilled):
        _push(tmp_path, model, dest, "p1")
    left = gcs.names("serving/")
    assert (
        "serving/1/saved_model.pb" not in left
        and len([n for n in left if n.startswith("serving/1/")]) == 2
    )
    assert (
        [n for n in left if n.endswith("/.publish.json")]
        == [n for n in left if n.startswith("serving/.staging-1~") and n.endswith("/.publish.json")]
        != []
    )
    assert serving.serving_versions(dest) == []

    monkeypatch.setattr(storage_gcs, "copy_object", real_copy)
    again = _push(tmp_path, model, dest, "p2")
    assert again.pushed_version == "1"  # the interrupted push of the same model, finished
    assert serving.serving_versions(dest) == [1]
    assert storage.same_files(str(Path(model) / "Format-Serving"), f"{dest}/1")
    assert [n for n in gcs.names("serving/") if not n.startswith("serving/1/")] == [
        "serving/.claims/1"
    ]


@pytest.mark.fault("a push killed while uploading to gs://")
def test_push_interrupted_while_uploading_is_cleaned_once_stale(gcs, tmp_path, monkeypatch):
    dest = gcs.uri("serving")
    model = _model(tmp_path, "m")
    real_upload = storage_gcs.upload_file
    uploads = []

    def upload_then_die(path, uri):
        if len(uploads) == 1:
            raise PodKilled("pod evicted")
        uploads.append(uri)
        return real_upload(path, uri)

    monkeypatch.setattr(storage_gcs, "upload_file", upload_then_die)
    monkeypatch.setattr(storage_gcs, "WORKERS", 1)
    with pytest.raises(PodKilled):
        _push(tmp_path, model, dest, "p1")
    assert gcs.names("serving/") == ["serving/.claims/1", uploads[0].split("/", 3)[3]]
    monkeypatch.setattr(storage_gcs, "upload_file", real_upload)

    young = _push(tmp_path, model, dest, "p2")  # another pusher may still be uploading
    assert young.pushed_version == "2"
    assert storage.finish_publishes(dest, ready="saved_model.pb", stale_after_s=0) == {
        f"{dest}/1": "cleaned"
    }
    assert serving.serving_versions(dest) == [2]
    assert [n for n in gcs.names("serving/") if not n.startswith("serving/2/")] == [
        "serving/.claims/1",  # its publisher died: the number stays skipped
        "serving/.claims/2",
    ]


def test_rollback_republishes_an_earlier_version_as_the_newest(gcs, tmp_path):
    dest = gcs.uri("serving")
    _push(tmp_path, _model(tmp_path, "m1", "one"), dest, "p1")
    _push(tmp_path, _model(tmp_path, "m2", "two"), dest, "p2")
    assert serving.rollback(dest, 1) == 3
    assert serving.serving_versions(dest) == [1, 2, 3]
    assert storage.same_files(f"{dest}/1", f"{dest}/3")
    assert serving.latest_version_uri(dest) == f"{dest}/3"
    with pytest.raises(UserError, match=r"version 7: .*complete versions are \[1, 2, 3\]"):
        serving.rollback(dest, 7)


@pytest.mark.fault("a rollback while a push killed after its upload waits to be finished")
def test_a_rollback_retires_an_interrupted_push_it_finishes(gcs, tmp_path, monkeypatch):
    dest = gcs.uri("serving")
    _push(tmp_path, _model(tmp_path, "x", "x"), dest, "p1")
    _push(tmp_path, _model(tmp_path, "y", "y"), dest, "p2")
    z = _model(tmp_path, "z", "z")
    real_copy = die_after_two_copies(monkeypatch)
    with pytest.raises(PodKilled):  # uploaded, then killed copying into 3/
        _push(tmp_path, z, dest, "p3")
    monkeypatch.setattr(storage_gcs, "copy_object", real_copy)

    assert serving.rollback(dest, 1) == 4  # finishes z as 3, then retires it with y
    assert serving.serving_versions(dest) == [1, 2, 3, 4]
    assert storage.same_files(f"{dest}/1", f"{dest}/4")
    assert sorted(json.loads(gcs.get(f"serving/{RETIRED_FILE}"))) == ["2", "3"]
    again = _push(tmp_path, z, dest, "p4")  # z from a cached train step: refused
    assert again.pushed == 0 and "rolled back from version 3" in again.reason


def test_push_to_a_gcs_object_is_a_user_error(gcs, tmp_path):
    gcs.put("serving", b"a file")
    with pytest.raises(UserError, match=f"push destination is not a folder: {gcs.uri('serving')}"):
        _push(tmp_path, _model(tmp_path, "m"), gcs.uri("serving"), "p")
    assert not (tmp_path / "p").exists()


# ---- evaluate: the baseline in service ------------------------------------------------------


def test_evaluate_scores_the_highest_complete_gcs_version(gcs, tmp_path):
    import tensorflow as tf

    class Scorer(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def score(self, text):
            chars = tf.strings.length(text, unit="UTF8_CHAR")
            nats = tf.cast(chars, tf.float32) * 0.5
            return {"nats": nats, "tokens": chars, "chars": chars}

    module = Scorer()
    tf.saved_model.save(module, str(tmp_path / "sm"), signatures={"score": module.score})
    storage.publish_dir(tmp_path / "sm", gcs.uri("serving/4"), ready="saved_model.pb")
    gcs.put("serving/9/variables/variables.index", b"half-copied: no saved_model.pb")
    gcs.put("serving/.staging-10/saved_model.pb", b"staged, not published")

    baseline = serving.latest_version_uri(gcs.uri("serving"))
    assert baseline == gcs.uri("serving/4")
    # The eval text is streamed from gs:// too: two documents, the first in two pieces.
    texts = [("some eval text\n", False), ("second line\n", True), ("third\n", True)]
    pieces = [EvalPiece(text, end) for text, end in texts]
    gcs.put("examples/raw/eval.jsonl", b"".join(piece_line(p) for p in pieces))
    scores = evaluate._score_baseline(baseline, gcs.uri("examples/raw/eval.jsonl"))
    assert scores.nats_per_char == pytest.approx(0.5) and scores.chars == 33
    assert serving.latest_version_uri(gcs.uri("empty")) is None
