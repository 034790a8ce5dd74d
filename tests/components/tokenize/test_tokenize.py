"""The tokenize step: corpus in, Examples artifact (docs/design.md) out."""

import hashlib
import io
import re
import shutil
from dataclasses import replace
from pathlib import Path
from unittest.mock import ANY

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

from components import overlap
from components.tokenize import encode, executor
from contracts.artifacts import EVAL_TEXT, TRAIN_TEXT_SKETCH
from contracts.errors import UserError
from contracts.eval_text import EvalPiece, read_pieces
from contracts.examples import (
    ExamplesManifest,
    LocalSource,
    TokenizerRecord,
    manifest_json,
    parse_manifest,
)

SHAKESPEARE = Path(__file__).resolve().parents[3] / "data" / "tinyshakespeare.txt"
VOCAB = 340  # 256 byte pieces + 4 special + the slice's ~55 characters + a few merges
SEQ_LEN = 32


def _slice(chars: int) -> str:
    text = SHAKESPEARE.read_text(encoding="utf-8")[:chars]
    return text[: text.rindex("\n") + 1]


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _run(corpus: Path | str, out: Path, **kwargs):
    args = {"vocab_size": VOCAB, "seq_len": SEQ_LEN, "progress": False, **kwargs}
    return executor.run(str(corpus), str(out), **args)


def _windows(out: Path, manifest: ExamplesManifest, split: str) -> np.ndarray:
    files = [str(out / shard) for shard in manifest.splits[split].shards]
    records = tf.data.TFRecordDataset(files, compression_type="GZIP")
    spec = {"input_ids": tf.io.VarLenFeature(tf.int64)}
    rows = [
        tf.sparse.to_dense(tf.io.parse_single_example(r, spec)["input_ids"]).numpy()
        for r in records
    ]
    return np.stack(rows)  # (windows, seq_len + 1)


def _tree_bytes(out: Path) -> dict[str, str]:
    return {
        p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }


def _eval_pieces(out: Path) -> list[EvalPiece]:
    with (out / EVAL_TEXT).open("rb") as f:
        return list(read_pieces(f, "eval"))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("built")
    corpus = _write(root / "corpus" / "shakespeare.txt", _slice(12_000))
    out = root / "examples"
    manifest = _run(corpus, out, shard_windows=100)
    return corpus, out, manifest


def test_same_bytes_same_version_and_shards_one_byte_changes_version(built, tmp_path):
    corpus, out, manifest = built
    moved = _write(tmp_path / "renamed_root" / corpus.name, corpus.read_text(encoding="utf-8"))
    again = _run(moved.parent, tmp_path / "again", shard_windows=100, parts=1)
    assert again.dataset_version == manifest.dataset_version
    assert _tree_bytes(tmp_path / "again") == _tree_bytes(out)

    changed = corpus.read_bytes().replace(b"Citizen", b"Citizan", 1)
    (tmp_path / "changed").mkdir()
    (tmp_path / "changed" / corpus.name).write_bytes(changed)
    other = _run(tmp_path / "changed", tmp_path / "other", shard_windows=100)
    assert other.dataset_version != manifest.dataset_version


def test_manifest_counts_match_the_tfrecords(built):
    corpus, out, manifest = built
    assert manifest.seq_len == SEQ_LEN and manifest.vocab_size == VOCAB
    for split in ("train", "eval"):
        stats = manifest.splits[split]
        windows = _windows(out, manifest, split)
        assert windows.shape == (stats.windows, SEQ_LEN + 1)
        assert stats.windows == (stats.tokens - 1) // SEQ_LEN
        np.testing.assert_array_equal(windows[1:, 0], windows[:-1, -1])  # overlap by one token
        n = len(stats.shards)
        assert stats.shards == tuple(
            f"Split-{split}/data_tfrecord-{i:05d}-of-{n:05d}.gz" for i in range(n)
        )
        assert sorted(p.name for p in (out / f"Split-{split}").iterdir()) == [
            Path(s).name for s in stats.shards
        ]
    assert len(manifest.splits["train"].shards) > 1  # shard_windows=100
    text = corpus.read_text(encoding="utf-8")
    assert manifest.splits["train"].chars + manifest.splits["eval"].chars == len(text)
    assert manifest.tokenizer == TokenizerRecord(
        file="tokenizer.model",
        sha256=hashlib.sha256((out / "tokenizer.model").read_bytes()).hexdigest(),
        vocab_size=VOCAB,
        trained=True,
    )
    assert manifest.sources == (
        LocalSource(
            str(corpus), corpus.stat().st_size, hashlib.sha256(corpus.read_bytes()).hexdigest()
        ),
    )
    written = (out / "manifest.json").read_text()
    assert parse_manifest(written, "manifest.json") == manifest


def test_eval_is_the_tail_and_its_windows_decode_to_eval_text(built):
    corpus, out, manifest = built
    text = corpus.read_text(encoding="utf-8")
    pieces = _eval_pieces(out)
    eval_text = "".join(p.text for p in pieces)
    assert [p.end for p in pieces] == [False] * (len(pieces) - 1) + [True]  # one document
    assert len(eval_text) == manifest.splits["eval"].chars
    assert text.endswith(eval_text) and abs(len(eval_text) - 0.1 * len(text)) < 100
    windows = _windows(out, manifest, "eval")
    ids = np.concatenate([windows[0], windows[1:, 1:].ravel()]).tolist()
    sp = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))
    decoded = sp.decode(ids)
    assert len(decoded) > len(eval_text) // 2 and eval_text.startswith(decoded)


def test_tokenizer_round_trips_newlines_and_spaces(built):
    sp = spm.SentencePieceProcessor(model_file=str(built[1] / "tokenizer.model"))
    text = "ROMEO:\n\n  Two  households,\tboth alike   in dignity.\n\nÉcoute, 漢字\n"
    assert sp.decode(sp.encode(text)) == text
    assert sp.encode("a\nb").count(sp.piece_to_id("\n")) == 1


def test_encoding_line_by_line_equals_encoding_whole(built):
    model = (built[1] / "tokenizer.model").read_bytes()
    text = built[0].read_text(encoding="utf-8") + "Écoute, 漢字\n\n  spaces  \tand no newline"
    processor = spm.SentencePieceProcessor(model_proto=model)
    whole = processor.encode(text)
    assert encode.encode_text(processor, text).tolist() == whole
    pieces = [text[i : i + 500] for i in range(0, len(text), 500)]  # cut anywhere, even mid-line
    ids = encode.encode_pieces(processor, pieces, [False] * len(pieces), processor.eos_id())
    assert ids.dtype == np.int32
    assert ids.tolist() == [i for piece in pieces for i in processor.encode(piece)]


def test_the_eval_split_ends_in_eos_and_the_train_split_does_not(built):
    _, out, manifest = built
    eos = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model")).eos_id()
    train, evals = (_windows(out, manifest, split) for split in ("train", "eval"))
    assert eos not in train  # the one document of a .txt corpus ends in its eval part
    assert (evals == eos).sum() <= 1  # the last id, if the last window reaches it


def test_reuses_a_given_tokenizer(built, tmp_path):
    corpus, out, manifest = built
    given = _run(corpus, tmp_path / "given", shard_windows=100, tokenizer=out / "tokenizer.model")
    assert given.tokenizer.trained is False
    assert given.tokenizer.sha256 == manifest.tokenizer.sha256
    assert given.parameters.given_tokenizer_sha256 == manifest.tokenizer.sha256
    assert given.dataset_version != manifest.dataset_version
    assert _tree_bytes(tmp_path / "given") == _tree_bytes(out)


def test_folder_and_glob_inputs(tmp_path, capsys):
    text = _slice(60_000)
    for i in range(40):  # documents: a file each, whole to train or to eval
        sub = "sub/" if i >= 30 else ""
        _write(tmp_path / "docs" / f"{sub}{i:02d}.txt", text[i * 1500 : (i + 1) * 1500])
    _write(tmp_path / "docs" / ".hidden.txt", "never read\n")
    folder = _run(tmp_path / "docs", tmp_path / "from_folder", progress=True)
    assert re.search(r"tokenize: encode: 100% of \d+\.\d kB\n", capsys.readouterr().err)
    assert [Path(s.uri).name for s in folder.sources] == [f"{i:02d}.txt" for i in range(40)]
    assert folder.documents["train"] + folder.documents["eval"] == 40

    glob = _run(f"{tmp_path}/docs/*.txt", tmp_path / "from_glob")
    assert [Path(s.uri).name for s in glob.sources] == [f"{i:02d}.txt" for i in range(30)]
    assert glob.dataset_version != folder.dataset_version
    assert executor.artifact_properties(folder)["dataset_version"] == folder.dataset_version


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[str, dict, str]]:
    """name -> (corpus, run kwargs, regex the message must match)."""
    good = str(_write(tmp_path / "good.txt", _slice(12_000)))
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"good line\ncaf\xe9\n" * 50)
    small = _write(tmp_path / "small.txt", _slice(4_000))
    return {
        "missing": (str(tmp_path / "nope.txt"), {}, "nope.txt"),
        "empty": (str(_write(tmp_path / "empty.txt", "")), {}, "empty.txt.*empty"),
        "whitespace": (str(_write(tmp_path / "ws.txt", " \n\n \t\n")), {}, "ws.txt.*whitespace"),
        "no_glob_match": (f"{tmp_path}/*.md", {}, r"\*\.md.*no files"),
        "not_utf8": (str(latin1), {}, f"{re.escape(str(latin1))}.*0xe9 at offset 13"),
        "eval_fraction_zero": (good, {"eval_fraction": 0.0}, "eval_fraction"),
        "eval_fraction_big": (good, {"eval_fraction": 0.6}, "eval_fraction"),
        "smaller_than_a_window": (
            str(small),
            {"seq_len": 1000},
            r"small.txt.*eval split has \d+ tokens.*1001.*seq_len",
        ),
        "vocab_too_small": (good, {"vocab_size": 100}, "good.txt.*vocab_size >= 3"),
        "vocab_too_big": (good, {"vocab_size": 5000}, "good.txt.*vocab_size <="),
        "missing_tokenizer": (good, {"tokenizer": str(tmp_path / "x.model")}, "x.model"),
    }


BAD_INPUTS = [
    "missing",
    "empty",
    "whitespace",
    "no_glob_match",
    "not_utf8",
    "eval_fraction_zero",
    "eval_fraction_big",
    "smaller_than_a_window",
    "vocab_too_small",
    "vocab_too_big",
    "missing_tokenizer",
]


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_a_user_error_and_leaves_nothing(tmp_path, case):
    corpus, kwargs, message = _bad_inputs(tmp_path / "in")[case]
    out = tmp_path / "out" / "examples"
    with pytest.raises(UserError, match=message):
        _run(corpus, out, **kwargs)
    assert not out.exists()
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_given_tokenizer_with_another_vocab_size_is_a_user_error(built, tmp_path):
    model = built[1] / "tokenizer.model"
    with pytest.raises(UserError, match=f"{re.escape(str(model))}.*{VOCAB} pieces.*vocab_size"):
        _run(built[0], tmp_path / "out", tokenizer=model, vocab_size=VOCAB + 1)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.bad_input("a tokenizer whose newline is no piece of its own, or with a dummy prefix")
@pytest.mark.parametrize(
    "change",
    [
        {"user_defined_symbols": []},  # "\n" only as the byte piece <0x0A>
        {"add_dummy_prefix": True},  # a "▁" before every line the step encodes alone
    ],
)
def test_given_tokenizer_the_line_by_line_encode_would_not_match_is_a_user_error(
    built, tmp_path, change
):
    from components.tokenize import bpe

    options = {**bpe.SENTENCEPIECE_TRAINER_OPTIONS, **change}
    text = built[0].read_text(encoding="utf-8")
    model = tmp_path / "given.model"
    sentences = [line for line in text.split("\n") if line]
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=proto, vocab_size=VOCAB, **options
    )
    model.write_bytes(proto.getvalue())
    processor = spm.SentencePieceProcessor(model_proto=proto.getvalue())
    probe = bpe.ROUND_TRIP_PROBE
    assert processor.decode(processor.encode(probe)) == probe  # it passes the round trip
    assert encode.encode_text(processor, probe).tolist() != processor.encode(probe)
    with pytest.raises(UserError, match="does not keep newlines as a piece of their own"):
        _run(built[0], tmp_path / "out", tokenizer=model)
    assert not (tmp_path / "out").exists()


def test_output_folder_with_content_is_a_user_error(built, tmp_path):
    shutil.copytree(built[1], tmp_path / "out")
    with pytest.raises(UserError, match="out.*not empty"):
        _run(built[0], tmp_path / "out")


def test_content_addressed_store_tokenizes_each_version_once(tmp_path):
    corpus = _write(tmp_path / "corpus" / "text.txt", _slice(12_000))
    store = tmp_path / "datasets"
    options = {"vocab_size": VOCAB, "seq_len": SEQ_LEN, "progress": False}
    version, _ = executor.dataset_version_of(str(corpus), vocab_size=VOCAB, seq_len=SEQ_LEN)
    first = executor.run_content_addressed(str(corpus), str(store), **options)
    assert (first.uri, first.reused) == (str(store / version), False)
    assert first.manifest.dataset_version == version
    shards = _tree_bytes(Path(first.uri))

    moved = _write(tmp_path / "elsewhere" / "text.txt", corpus.read_text(encoding="utf-8"))
    again = executor.run_content_addressed(str(moved), str(store), **options)
    assert (again.uri, again.reused) == (first.uri, True)
    assert _tree_bytes(Path(again.uri)) == shards
    assert again.manifest.sources[0].uri == str(moved.resolve())  # this run's sources

    corpus.write_text(corpus.read_text(encoding="utf-8") + "One more line.\n", encoding="utf-8")
    changed = executor.run_content_addressed(str(corpus), str(store), **options)
    assert not changed.reused and changed.uri != first.uri
    assert sorted(p.name for p in store.iterdir()) == sorted(
        [version, changed.manifest.dataset_version]
    )


def test_a_corpus_that_changes_during_the_run_never_fills_a_version_folder(tmp_path, monkeypatch):
    corpus = _write(tmp_path / "corpus" / "text.txt", _slice(12_000))
    store = tmp_path / "datasets"
    options = {"vocab_size": VOCAB, "seq_len": SEQ_LEN, "progress": False}
    listed = executor.dataset_version_of

    def list_then_change(*args, **kwargs):
        found = listed(*args, **kwargs)
        corpus.write_text(corpus.read_text(encoding="utf-8") + "Edited.\n", encoding="utf-8")
        return found

    monkeypatch.setattr(executor, "dataset_version_of", list_then_change)
    with pytest.raises(UserError, match="changed while the run was reading it"):
        executor.run_content_addressed(str(corpus), str(store), **options)
    assert not store.exists() or list(store.iterdir()) == []


def test_a_version_folder_holding_another_version_is_refused(tmp_path):
    corpus = _write(tmp_path / "corpus" / "text.txt", _slice(12_000))
    store = tmp_path / "datasets"
    options = {"vocab_size": VOCAB, "seq_len": SEQ_LEN, "progress": False}
    first = executor.run_content_addressed(str(corpus), str(store), **options)
    manifest = Path(first.uri) / "manifest.json"
    manifest.write_text(manifest_json(replace(first.manifest, dataset_version="0" * 64)))
    with pytest.raises(UserError, match="not the one it is named for"):
        executor.run_content_addressed(str(corpus), str(store), **options)


def test_the_examples_carry_a_sketch_of_their_train_text_alone(built):
    """What evaluate measures a model's sight of the eval text with (components/overlap.py)."""
    corpus, out, _ = built
    eval_text = "".join(p.text for p in _eval_pieces(out)).encode("utf-8")
    train_text = corpus.read_bytes()[: -len(eval_text)]
    sketch = (out / TRAIN_TEXT_SKETCH).read_bytes()
    assert overlap.seen_share(sketch, train_text).share == 1.0
    assert overlap.seen_share(sketch, eval_text) == overlap.Seen(0.0, ANY, exact=True)
