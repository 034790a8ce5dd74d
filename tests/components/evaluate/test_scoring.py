"""Evaluate's streamed scoring: strings of whole lines within one document, in bounded memory."""

import random
import tracemalloc

import pytest

from components import overlap
from components.evaluate import scoring
from contracts.errors import UserError
from contracts.eval_text import EvalPiece
from tests.tiny import write_eval_text


class Recorder:
    """A ScoreBatch that scores each char 0.5 nats and each string's chars as its tokens, and
    keeps what it was given: every string, and the most characters one batch held."""

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self.strings: list[str] = []
        self.most_chars = 0

    def __call__(self, batch: list[str]) -> tuple[float, int, int]:
        chars = sum(len(s) for s in batch)
        self.most_chars = max(self.most_chars, chars)
        if self.keep:
            self.strings.extend(batch)
        return 0.5 * chars, chars, chars


def _document(rng: random.Random, name: str, lines: int) -> str:
    return "".join(f"{name} {i} " + "x" * rng.randint(0, 300) + "\n" for i in range(lines))


def test_strings_are_whole_lines_of_one_document_and_lose_nothing(tmp_path):
    rng = random.Random(0)
    # The second document's last line has no newline: it must not run into the third's first.
    documents = [_document(rng, "alpha", 40), _document(rng, "beta", 3)[:-1], "gamma\n"]
    path = tmp_path / "eval.jsonl"
    write_eval_text(path, documents, piece_lines=5)
    scorer = Recorder()
    scores = scoring.score_eval_text(scorer, str(path))
    assert "".join(scorer.strings) == "".join(documents)
    assert scores.chars == len("".join(documents)) and scores.nats_per_char == 0.5
    for string in scorer.strings:
        assert len({line.split(" ")[0] for line in string.splitlines()}) == 1, string
        assert len(string) <= scoring.CHUNK_CHARS
    assert scorer.strings[-1] == "gamma\n" and scorer.strings[-2].endswith("x")


def test_a_document_end_ends_its_string_and_pieces_join_within_one():
    pieces = [EvalPiece("a\n", False), EvalPiece("b\n", True), EvalPiece("c", True)]
    strings = list(scoring.document_strings(pieces, 100))
    assert strings == [EvalPiece("a\nb\n", True), EvalPiece("c", True)]


def test_chunks_are_whole_lines_and_lose_nothing():
    text = "".join(f"line {i} " + "x" * (i % 50) + "\n" for i in range(200))
    chunks = scoring.chunk_text(text, 256)
    assert "".join(chunks) == text
    assert all(c.endswith("\n") for c in chunks)
    assert all(len(c) <= 256 for c in chunks)


@pytest.mark.bad_input("an eval text cut inside a document")
def test_an_eval_text_that_ends_inside_a_document_is_refused(tmp_path):
    path = tmp_path / "eval.jsonl"
    write_eval_text(path, ["one\ntwo\nthree\n"], piece_lines=1)
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:2]))
    with pytest.raises(UserError, match="ends inside a document"):
        scoring.score_eval_text(Recorder(), str(path))


def test_the_seen_share_counted_while_scoring_is_the_whole_texts():
    rng = random.Random(1)
    documents = [_document(rng, f"doc{d}", 30) for d in range(5)]
    train = overlap.Sketch()
    train.add("".join(documents[:2]).encode())
    count = overlap.SeenCount.of(train.to_bytes())
    pieces = [EvalPiece(d, True) for d in documents]
    scoring.score_pieces(Recorder(), pieces, count)
    assert count.result() == overlap.seen_share(train.to_bytes(), "".join(documents).encode())
    assert count.result().share == pytest.approx(0.4, abs=0.05)


def _eval_file(tmp_path, megabytes: int):
    """An eval text of about `megabytes` MB: documents of 1 to 200 lines, pieces of 16 lines."""
    rng = random.Random(megabytes)
    path = tmp_path / f"eval-{megabytes}.jsonl"
    documents, size = [], 0
    while size < megabytes * 1_000_000:
        documents.append(_document(rng, f"d{len(documents)}", rng.randint(1, 200)))
        size += len(documents[-1])
    write_eval_text(path, documents, piece_lines=16)
    return path


def _peak_bytes(path, sketch: bytes) -> tuple[int, int]:
    """(Python's peak traced allocation, the most characters one batch held) while scoring
    `path` and counting its overlap with `sketch`, as evaluate does."""
    scorer = Recorder(keep=False)
    tracemalloc.start()
    try:
        count = overlap.SeenCount.of(sketch)
        scoring.score_eval_text(scorer, str(path), count)
        count.result()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, scorer.most_chars


def test_scoring_memory_does_not_grow_with_the_eval_text(tmp_path, monkeypatch):
    """Eight times the eval text, the same peak: only a batch of strings (and the overlap's
    block) is held. Python's traced allocations are counted exactly, not timed or sampled."""
    monkeypatch.setattr(overlap, "_BLOCK_BYTES", 1 << 16)
    sketch = overlap.Sketch()
    sketch.add(_document(random.Random(2), "d1", 200).encode())
    small, large = _eval_file(tmp_path, 1), _eval_file(tmp_path, 8)
    _peak_bytes(small, sketch.to_bytes())  # warm: the overlap's cached powers
    small_peak, small_batch = _peak_bytes(small, sketch.to_bytes())
    large_peak, large_batch = _peak_bytes(large, sketch.to_bytes())
    for batch in (small_batch, large_batch):  # full batches, never more
        assert batch > scoring.BATCH_CHUNKS * scoring.CHUNK_CHARS // 2
        assert batch <= scoring.BATCH_CHUNKS * scoring.CHUNK_CHARS
    # Holding the text would add 7 MB; the batches' and pieces' sizes vary by some KB.
    assert large_peak - small_peak < 7_000_000 // 16, (small_peak, large_peak)
