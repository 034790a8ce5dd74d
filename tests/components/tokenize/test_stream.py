"""The tokenize step streams: chunks that depend on the bytes alone, EOS after each document,
the same bytes whatever the number of parts, a tokenizer sample with a hard bound, shards
serialized as protobuf and TensorFlow's record writer do, and memory that does not grow with
the corpus."""

import hashlib
import io
import json
import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

from components import storage
from components.tokenize import bpe, corpus, encode, executor, parts, shards
from contracts import process
from contracts.artifacts import EVAL_TEXT
from contracts.errors import UserError
from contracts.eval_text import read_pieces
from contracts.examples import SplitStats

REPO = Path(__file__).resolve().parents[3]
SHAKESPEARE = REPO / "data" / "tinyshakespeare.txt"
VOCAB = 340  # the smallest vocabulary a Shakespeare slice trains (see test_tokenize.py)
SEQ_LEN = 32
MIXED = (
    "ROMEO:\nBut soft, what light through yonder window breaks?\n\n"
    "Écoute, 漢字 et l'été\n  two  spaces,\ttab.\n" + "x" * 300 + "\n"
) * 20 + "the last line has no newline"


def _write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def _chunks(path: Path, chunk_bytes: int, eval_fraction: float = 0.1) -> list[corpus.Chunk]:
    source = storage.list_files(str(path))[0]
    return list(corpus.read_chunks(source, eval_fraction, chunk_bytes))


def _tree(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# ---- chunks and the split ------------------------------------------------------------------


@pytest.mark.parametrize("block", [1, 7, 100, 4096])
def test_chunks_depend_on_the_bytes_not_on_how_they_are_read(tmp_path, monkeypatch, block):
    path = _write(tmp_path / "mixed.txt", MIXED)
    expected = _chunks(path, 200)
    monkeypatch.setattr(corpus, "READ_CHUNK_BYTES", block)
    assert _chunks(path, 200) == expected


def test_chunks_are_whole_lines_cut_after_each_chunk_bytes_and_at_the_split(tmp_path):
    data = MIXED.encode("utf-8")
    chunks = _chunks(_write(tmp_path / "mixed.txt", data), 200)
    # The eval part starts at the first line start at or after 90% of the bytes.
    target = round(len(data) * 0.9)
    cut = data.index(b"\n", target - 1) + 1
    train = [c for c in chunks if c.split == "train"]
    assert [c.split for c in chunks] == ["train"] * len(train) + ["eval"] * (
        len(chunks) - len(train)
    )
    assert sum(c.size for c in train) == cut and sum(c.size for c in chunks) == len(data)
    assert "".join(c.text for c in train) == data[:cut].decode("utf-8")
    assert "".join(c.text for c in chunks[len(train) :]) == data[cut:].decode("utf-8") + "\n"
    for part in (train, chunks[len(train) :]):
        for chunk in part[:-1]:  # every chunk but a part's last: the first lines reaching 200
            body = chunk.text.encode("utf-8")
            assert body.endswith(b"\n") and len(body) >= 200
            assert body.rfind(b"\n", 0, len(body) - 1) < 199  # the line before ends short of it
    assert corpus.split_corpus([MIXED], 0.1, "x") == {
        "train": data[:cut].decode("utf-8"),
        "eval": data[cut:].decode("utf-8") + "\n",
    }


def test_a_file_with_no_line_start_after_the_target_is_cut_at_a_character(tmp_path):
    text = "é" * 20  # 40 bytes, no newline: 90% is byte 36, the start of a character
    assert corpus.split_corpus([text], 0.1, "x") == {"train": "é" * 18 + "\n", "eval": "éé\n"}
    odd = "a" + "é" * 20  # 41 bytes: byte 37 is inside a character; cut before it
    assert corpus.split_corpus([odd], 0.1, "x") == {"train": odd[:19] + "\n", "eval": "éé\n"}
    one_line = "hello world\n"  # its only line start after the target is the end of the file
    assert corpus.split_corpus([one_line], 0.1, "x") == {"train": "hello world\n", "eval": "\n"}


def test_a_byte_that_is_not_utf8_in_a_later_chunk_is_named_by_offset_and_line(tmp_path):
    lines = [f"line {i}\n".encode() for i in range(300)]
    offset = sum(map(len, lines[:250])) + 3
    lines[250] = b"lin\xe9 250\n"
    path = _write(tmp_path / "latin1.txt", b"".join(lines))
    with pytest.raises(UserError, match=f"byte 0xe9 at offset {offset} \\(line 251\\)"):
        _chunks(path, 64)


# ---- workers ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model() -> bytes:
    text = SHAKESPEARE.read_text(encoding="utf-8")[:12_000]
    return bpe.train(text, VOCAB, "slice", lambda line: None)


def test_pieces_encode_as_each_text_alone_with_eos_after_a_document_end(model):
    processor = spm.SentencePieceProcessor(model_proto=model)
    text = SHAKESPEARE.read_text(encoding="utf-8")[:5_000]
    texts = [text[:1000], text[1000:4000] + "\n", "one line", "", "a\n\nb", "\n"]
    ends = [False, True, True, True, False, True]
    eos = processor.eos_id()
    expected = []
    for piece, end in zip(texts, ends, strict=True):
        expected += processor.encode(piece) + ([eos] if end else [])
    assert encode.encode_pieces(processor, texts, ends, eos).tolist() == expected
    assert encode.encode_pieces(processor, [], [], eos).tolist() == []


@pytest.mark.slow
def test_one_two_and_four_parts_write_the_same_bytes(tmp_path, capsys):
    text = SHAKESPEARE.read_text(encoding="utf-8")[:120_000]
    for i in range(60):  # documents of 2 kB, a tenth of them eval by their names' hash
        _write(tmp_path / "docs" / f"{i:02d}.txt", text[i * 2_000 : (i + 1) * 2_000])
    options = {"vocab_size": VOCAB, "seq_len": SEQ_LEN, "shard_windows": 300, "chunk_bytes": 4096}
    options["unit_bytes"] = 20_000  # a unit per file
    runs = {}
    for count in (1, 2, 4):
        runs[count] = executor.run(
            str(tmp_path / "docs"), str(tmp_path / f"p{count}"), parts=count, **options
        )
        assert f"in 6 units, on {count} part" in capsys.readouterr().err
    assert len({m.dataset_version for m in runs.values()}) == 1
    assert len(runs[1].splits["train"].shards) > 1
    assert _tree(tmp_path / "p1") == _tree(tmp_path / "p2") == _tree(tmp_path / "p4")
    assert not list(tmp_path.glob(".*work"))  # the work folders went with the merge


@pytest.mark.parametrize(
    "files, cpus",
    [
        ({"cpu.max": "250000 100000\n"}, 2.5),  # cgroup v2: a pod limited to 2.5 CPUs
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "400000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 4.0),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),
    ],
)
def test_the_default_worker_count_follows_a_cgroup_cpu_limit(tmp_path, files, cpus):
    for name, text in files.items():
        _write(tmp_path / name, text)
    assert encode.cpu_quota(tmp_path) == cpus


# ---- the tokenizer's sample ------------------------------------------------------------------


def test_the_sample_has_a_hard_byte_bound_drawn_evenly_by_key():
    chunks = ["".join(f"chunk {c} line {i}\n" for i in range(100)) for c in range(1000)]
    sample = bpe.Sample(budget=50_000, fraction=0.01)  # far more lines than the bound holds
    for c, chunk in enumerate(chunks):
        sample.add(chunk, key=(c * 0x9E3779B97F4A7C15) % 2**64)
    kept = sample.text()
    assert len(kept.encode()) <= 50_000 and sample.bytes == len(kept.encode())
    firsts = [int(m) for m in re.findall(r"chunk (\d+) line 0\n", kept)]
    assert firsts == sorted(firsts)  # in the order they came
    assert min(firsts) < 100 and max(firsts) > 900  # from all of the corpus, not its start
    everything = bpe.Sample(budget=10**7, fraction=1.0)
    for c, chunk in enumerate(chunks[:10]):
        everything.add(chunk, key=c)
    assert everything.text() == "".join(chunks[:10])


def test_a_bounded_sample_trains_the_same_tokenizer_from_the_same_bytes(tmp_path):
    path = _write(
        tmp_path / "corpus" / "text.txt", SHAKESPEARE.read_text(encoding="utf-8")[:60_000]
    )
    options = {"vocab_size": VOCAB, "seq_len": SEQ_LEN, "progress": False, "chunk_bytes": 2048}
    small = executor.run(str(path), str(tmp_path / "a"), tokenizer_sample_bytes=20_000, **options)
    executor.run(str(path), str(tmp_path / "b"), tokenizer_sample_bytes=20_000, **options)
    whole = executor.run(str(path), str(tmp_path / "c"), **options)
    assert _tree(tmp_path / "a") == _tree(tmp_path / "b")
    assert small.tokenizer.sha256 != whole.tokenizer.sha256
    assert small.dataset_version != whole.dataset_version
    assert small.parameters.tokenizer_sample_bytes == 20_000


# ---- shards ----------------------------------------------------------------------------------


@pytest.mark.parametrize("high", [2, 128, 512, 16_384, 2**21 + 3, 2**31 - 1])
def test_records_are_byte_for_byte_tf_train_examples(high):
    rng = np.random.default_rng(high)
    for shape in ((40, 65), (3, 2)):
        windows = rng.integers(0, high, shape)
        windows[0, 0] = high - 1
        expected = [
            tf.train.Example(
                features=tf.train.Features(
                    feature={"input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=w))}
                )
            ).SerializeToString()
            for w in windows.tolist()
        ]
        assert shards.serialize(windows) == expected


def test_shards_are_tfrecords_written_as_they_fill(tmp_path):
    writer = shards.SplitWriter(tmp_path, "train", seq_len=4, shard_windows=3)
    stream = np.arange(1, 46, dtype=np.int32)  # 11 windows
    for part in np.array_split(stream, 7):
        writer.add(part)
    written = sorted(p.name for p in (tmp_path / "Split-train").iterdir())
    assert written == [f"part-{i:05d}.gz" for i in range(4)]  # 3 full, 1 open
    stats = writer.finish(chars=90)
    windows = (len(stream) - 1) // 4
    assert stats == SplitStats(
        tuple(f"Split-train/part-{i:05d}.gz" for i in range(4)),
        windows,
        len(stream),
        90,
        (3, 3, 3, 2),
    )
    files = [str(tmp_path / name) for name in stats.shards]
    spec = {"input_ids": tf.io.FixedLenFeature([5], tf.int64)}
    rows = [
        tf.io.parse_single_example(r, spec)["input_ids"].numpy().tolist()
        for r in tf.data.TFRecordDataset(files, compression_type="GZIP")
    ]
    assert rows == [stream[4 * w : 4 * w + 5].tolist() for w in range(windows)]


# ---- memory ----------------------------------------------------------------------------------

# A fresh wrapper per corpus size runs the step in its own child and waits for it, and the step
# waits for its workers: the wrapper's RUSAGE_CHILDREN then holds the largest peak of them all.
_WRAPPER = """
import json, resource, subprocess, sys
step = '''
import sys
from components.tokenize import executor
executor.run(sys.argv[1], sys.argv[2], vocab_size=512, seq_len=64, progress=False,
             parts=2, tokenizer_sample_bytes=1 << 20)
'''
subprocess.run([sys.executable, "-c", step, *sys.argv[1:]], check=True)
print(json.dumps(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss >> 10))
"""


def _shuffled_lines(path: Path, mb: int) -> Path:
    lines = SHAKESPEARE.read_text(encoding="utf-8").split("\n")
    rng = random.Random(0)
    with path.open("w", encoding="utf-8") as f:
        for _ in range(mb * 10**6 // 1_115_000):
            rng.shuffle(lines)
            f.write("\n".join(lines) + "\n")
    return path


def _peak_mb(corpus_path: Path, out: Path) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _WRAPPER, str(corpus_path), str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_the_corpus(tmp_path):
    small = _peak_mb(_shuffled_lines(tmp_path / "small.txt", 5), tmp_path / "small")
    large = _peak_mb(_shuffled_lines(tmp_path / "large.txt", 35), tmp_path / "large")
    manifest = json.loads((tmp_path / "large" / "manifest.json").read_text())
    assert manifest["splits"]["train"]["windows"] > 250_000  # the large one is 7 times larger
    print(f"peak RSS: {small} MiB at 5 MB of text, {large} MiB at 35 MB")
    assert large - small < 48, f"peak RSS {small} MiB at 5 MB of text, {large} MiB at 35 MB"
    assert large < 1024


# ---- documents ------------------------------------------------------------------------------


def _jsonl_corpus(folder: Path, documents: int, empty_every: int = 0) -> Path:
    text = SHAKESPEARE.read_text(encoding="utf-8")
    rng = random.Random(1)
    lines = []
    for i in range(documents):
        start = rng.randrange(0, len(text) - 3000)
        body = "" if empty_every and i % empty_every == 0 else text[start : start + 300 + i % 900]
        lines.append(json.dumps({"id": i, "body": body}))
    return _write(folder / "docs.jsonl", "\n".join(lines) + "\n")


def test_a_jsonl_corpus_is_documents_each_ended_by_eos_and_split_whole(tmp_path):
    corpus_path = _jsonl_corpus(tmp_path / "in", 400, empty_every=50)
    manifest = executor.run(
        str(corpus_path),
        str(tmp_path / "out"),
        vocab_size=VOCAB,
        seq_len=SEQ_LEN,
        text_field="body",
        progress=False,
    )
    assert manifest.parameters.split_method == "document-hash-v1"
    assert manifest.empty_documents == 8 and manifest.formats == {"jsonl": 1}
    assert manifest.documents["train"] + manifest.documents["eval"] == 392
    assert 15 < manifest.documents["eval"] < 70  # about a tenth, by hash
    processor = spm.SentencePieceProcessor(model_file=str(tmp_path / "out" / "tokenizer.model"))
    pieces = list(read_pieces((tmp_path / "out" / EVAL_TEXT).open("rb"), "eval"))
    assert sum(p.end for p in pieces) == manifest.documents["eval"]
    bodies = {json.loads(line)["body"] for line in corpus_path.read_text().splitlines()}
    assert all(p.text in bodies for p in pieces)  # whole documents, never cut between splits
    ids = tf.data.TFRecordDataset(
        [str(tmp_path / "out" / s) for s in manifest.splits["train"].shards],
        compression_type="GZIP",
    )
    spec = {"input_ids": tf.io.FixedLenFeature([SEQ_LEN + 1], tf.int64)}
    tokens = np.concatenate(
        [tf.io.parse_single_example(r, spec)["input_ids"].numpy()[1:] for r in ids]
    )
    eos = int((tokens == processor.eos_id()).sum())
    assert manifest.documents["train"] - 2 <= eos <= manifest.documents["train"]


def test_the_eval_split_is_capped_by_eval_max_bytes(tmp_path):
    corpus_path = _jsonl_corpus(tmp_path / "in", 400)
    options = {"vocab_size": VOCAB, "seq_len": SEQ_LEN, "text_field": "body", "progress": False}
    free = executor.run(str(corpus_path), str(tmp_path / "a"), eval_max_bytes=0, **options)
    capped = executor.run(str(corpus_path), str(tmp_path / "b"), eval_max_bytes=8_000, **options)
    assert free.splits["eval"].chars > 8_000 >= capped.splits["eval"].chars > 0
    assert capped.documents["eval"] < free.documents["eval"]
    assert free.dataset_version != capped.dataset_version


@pytest.mark.bad_input("a corpus whose documents are all empty")
def test_a_corpus_of_empty_documents_is_refused_naming_the_field(tmp_path):
    corpus_path = _write(tmp_path / "in" / "e.jsonl", '{"text": ""}\n{"text": "  "}\n')
    with pytest.raises(UserError, match=r"all 2 of its documents are empty.*text_field \('text'\)"):
        executor.run(str(corpus_path), str(tmp_path / "out"), vocab_size=VOCAB, seq_len=SEQ_LEN)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".*work"))


def test_a_killed_run_resumes_from_the_units_it_finished(tmp_path, monkeypatch):
    text = SHAKESPEARE.read_text(encoding="utf-8")[:120_000]
    for i in range(60):
        _write(tmp_path / "docs" / f"{i:02d}.txt", text[i * 2_000 : (i + 1) * 2_000])
    options = {"vocab_size": VOCAB, "seq_len": SEQ_LEN, "unit_bytes": 20_000, "parts": 1}
    done: list[int] = []
    encode_unit = parts.encode_unit

    def killed_after_three(plan, work, unit, rule, model):
        if len(done) == 3:
            raise KeyboardInterrupt  # what SIGINT or a lost pod looks like to the step
        encode_unit(plan, work, unit, rule, model)
        done.append(unit)

    monkeypatch.setattr(parts, "encode_unit", killed_after_three)
    with pytest.raises(KeyboardInterrupt):
        executor.run(str(tmp_path / "docs"), str(tmp_path / "out"), progress=False, **options)
    assert done == [0, 1, 2] and not (tmp_path / "out").exists()
    monkeypatch.setattr(parts, "encode_unit", lambda *a: (done.append(a[2]), encode_unit(*a)))
    resumed = executor.run(str(tmp_path / "docs"), str(tmp_path / "out"), progress=False, **options)
    assert done == [0, 1, 2, 3, 4, 5]  # only the other three units, on the second run
    fresh = executor.run(str(tmp_path / "docs"), str(tmp_path / "fresh"), progress=False, **options)
    assert _tree(tmp_path / "out") == _tree(tmp_path / "fresh")
    assert resumed == fresh


def test_a_document_that_starts_with_a_newline_gets_it_after_the_last_ones_eos(model):
    # Three ids may share a place: the first text's trailing newline, its EOS, and the newline
    # the next text starts with; they go in in the texts' order.
    processor = spm.SentencePieceProcessor(model_proto=model)
    eos = processor.eos_id()
    texts, ends = ["ab\n", "\ncd", "\n", "ef"], [True, True, True, False]
    expected = [
        i for t, e in zip(texts, ends, strict=True) for i in processor.encode(t) + [eos] * e
    ]
    assert encode.encode_pieces(processor, texts, ends, eos).tolist() == expected
    assert encode.Encoder(processor, eos).encode(texts, ends).tolist() == expected


# Characters the word cache must treat as SentencePiece does: runs of spaces at either end,
# tabs, "\u2581" itself (a space to SentencePiece), the ideographic space, combining and
# compatibility characters, and pieces the model lacks (byte fallback).
_TRICKY = list("ab Z.,;") + ["  ", "\t", "\n", "\n\n", "\u3000", "\u00b4", "e\u0301", "\u6f22"]
_TRICKY += ["\U0001f600", "\u00c9", "\ufb01", "   ", "\u2581", "\u2581 ", " \u2581\u2581"]


@pytest.fixture(scope="module")
def spaced_model() -> bytes:
    """A model of our options trained on indented text, so that it has whitespace-only
    pieces ("\u2581\u2581", ...): how runs of spaces group into words then changes the ids."""
    lines = SHAKESPEARE.read_text(encoding="utf-8")[:12_000].split("\n")
    text = "\n".join(
        " " * (i % 9) + line.replace(" ", "  " if i % 3 else " ") for i, line in enumerate(lines)
    )
    model = bpe.train(text, 400, "indented slice", lambda line: None)
    processor = spm.SentencePieceProcessor(model_proto=model)
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    assert sum(1 for p in pieces if len(p) > 1 and not p.strip("\u2581")) >= 3
    return model


@pytest.mark.parametrize("which", ["model", "spaced_model"])
def test_the_word_cache_gives_the_ids_of_each_text_encoded_whole(which, request, monkeypatch):
    processor = spm.SentencePieceProcessor(model_proto=request.getfixturevalue(which))
    eos = processor.eos_id()
    encoder = encode.Encoder(processor, eos)
    assert encoder.by_words  # our models allow it
    rng = random.Random(7)
    shakespeare = SHAKESPEARE.read_text(encoding="utf-8")
    for round_ in range(40):
        if round_ == 20:  # a cache that fills starts again, and still gives the same ids
            monkeypatch.setattr(encode, "CACHE_BYTES", 4000)
        texts = ["".join(rng.choices(_TRICKY, k=rng.randint(0, 60))) for _ in range(5)]
        start = rng.randrange(len(shakespeare) - 3000)
        texts.append(shakespeare[start : start + rng.randint(0, 3000)])
        ends = [rng.random() < 0.5 for _ in texts]
        expected = [
            i for t, e in zip(texts, ends, strict=True) for i in processor.encode(t) + [eos] * e
        ]
        got = encoder.encode(texts, ends)
        assert got.dtype == np.int32 and got.tolist() == expected, texts
        assert encoder._bytes <= encode.CACHE_BYTES  # past it, it started again


def test_a_model_that_normalizes_is_encoded_by_lines(model):
    # NFKC makes the ideographic space a space, beside a space the text has: a word split
    # before normalizing would differ, so a given tokenizer that normalizes keeps to lines.
    text = SHAKESPEARE.read_text(encoding="utf-8")[:12_000]
    for change in ({"normalization_rule_name": "nfkc"}, {"add_dummy_prefix": True}):
        options = {**bpe.SENTENCEPIECE_TRAINER_OPTIONS, **change}
        proto = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(text.split("\n")), model_writer=proto, vocab_size=400, **options
        )
        processor = spm.SentencePieceProcessor(model_proto=proto.getvalue())
        encoder = encode.Encoder(processor, processor.eos_id())
        assert not encoder.by_words, change
        texts = ["a\u3000 b", "a\u3000  b c"]
        expected = [i for t in texts for i in processor.encode(t) + [processor.eos_id()]]
        assert encoder.encode(texts, [True, True]).tolist() == expected
    assert encode.Encoder(spm.SentencePieceProcessor(model_proto=model), 2).by_words


def test_a_model_whose_pieces_cross_spaces_is_encoded_by_lines(model):
    # A given tokenizer trained without split_by_whitespace may hold "a\u2581b": its words do
    # not encode alone as within a line, so the encoder keeps to lines.
    text = SHAKESPEARE.read_text(encoding="utf-8")[:12_000]
    options = {**bpe.SENTENCEPIECE_TRAINER_OPTIONS, "split_by_whitespace": False}
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text.split("\n")), model_writer=proto, vocab_size=500, **options
    )
    processor = spm.SentencePieceProcessor(model_proto=proto.getvalue())
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    assert any("\u2581" in p[1:] and p.strip("\u2581") for p in pieces)
    encoder = encode.Encoder(processor, processor.eos_id())
    assert not encoder.by_words
    texts = [text[:700], text[700:2000]]
    expected = [i for t in texts for i in processor.encode(t) + [processor.eos_id()]]
    assert encoder.encode(texts, [True, True]).tolist() == expected


class _Stopped(Exception):
    pass


@pytest.mark.fault("the step is told to stop while SentencePiece trains its tokenizer")
def test_a_stop_while_the_tokenizer_trains_is_the_stop_not_a_corpus_error():
    """The step raises the stop, not "cannot train a tokenizer".

    SentencePiece's trainer reads the sample through a Python generator and turns the stop
    raised there into its own RuntimeError."""
    text = SHAKESPEARE.read_text(encoding="utf-8")[:12_000]

    class Sample(list):
        reads = 0  # the step counts the characters first; SentencePiece reads second

        def __iter__(self):
            Sample.reads += 1
            for i, piece in enumerate(super().__iter__()):
                if i == 3 and Sample.reads == 2:
                    os.kill(os.getpid(), signal.SIGTERM)
                yield piece

    sample = Sample(text[i : i + 1000] for i in range(0, len(text), 1000))
    with pytest.raises(_Stopped, match="received SIGTERM"), process.raise_on_stop(_Stopped):
        bpe.train(sample, VOCAB, "slice", lambda line: None)
    assert Sample.reads == 2 and process.pending_stop() is None  # the block is over
