"""The train-text sketch and the share of an eval text a model trained on (components/overlap.py),
checked against the lines themselves compared as bytes."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from components import overlap

TEXT = (Path(__file__).resolve().parents[2] / "data" / "tinyshakespeare.txt").read_bytes()


def _cut(text: bytes, fraction: float) -> int:
    """Where a file-tail split with `eval_fraction` = fraction starts (the next line start)."""
    return text.index(b"\n", round(len(text) * (1 - fraction))) + 1


def _lines(text: bytes) -> list[bytes]:
    """The units, the slow way: whole lines of at least MIN_LINE_BYTES, newline included."""
    lines = [line + b"\n" for line in text.split(b"\n")[:-1]]
    return [line for line in lines if len(line) >= overlap.MIN_LINE_BYTES]


def _exact_share(train: bytes, eval_text: bytes) -> float:
    trained = set(_lines(train))
    ours = _lines(eval_text)
    return sum(len(line) for line in ours if line in trained) / sum(len(line) for line in ours)


def _sketch(*parts: bytes, size: int = overlap.SKETCH_SIZE) -> bytes:
    sketch = overlap.Sketch(size)
    for part in parts:
        sketch.add(part)
    return sketch.to_bytes()


def test_hashes_are_of_whole_long_lines_wherever_they_sit():
    found, lengths = overlap.line_hashes(TEXT[:200_000])
    assert lengths.tolist() == [len(line) for line in _lines(TEXT[:200_000])]
    by_hash: dict[int, set[bytes]] = {}
    for h, line in zip(found.tolist(), _lines(TEXT[:200_000]), strict=True):
        by_hash.setdefault(h, set()).add(line)
    assert all(len(lines) == 1 for lines in by_hash.values())  # no two lines share a hash
    line = b"Now is the winter of our discontent made glorious\n"
    assert overlap.line_hashes(b"short\n" + line)[0] == overlap.line_hashes(line + b"x\n")[0]
    assert len(overlap.line_hashes(line[:-1])[0]) == 0  # no newline: not a whole line


def test_a_disjoint_split_shares_nothing_and_the_train_text_everything():
    cut = _cut(TEXT, 0.1)
    sketch = _sketch(TEXT[:cut])
    own = overlap.seen_share(sketch, TEXT[cut:])
    assert own == overlap.Seen(0.0, len(_lines(TEXT[cut:])), exact=True)
    assert overlap.seen_share(sketch, TEXT[: cut // 4]).share == 1.0


def test_a_model_trained_on_a_smaller_eval_fraction_saw_that_much_of_the_new_eval_text():
    """The split moved (eval_fraction 0.05 then, 0.1 now): the share is the lines' own."""
    train_then, eval_now = TEXT[: _cut(TEXT, 0.05)], TEXT[_cut(TEXT, 0.1) :]
    seen = overlap.seen_share(_sketch(train_then), eval_now)
    assert seen.exact and seen.share == pytest.approx(_exact_share(train_then, eval_now), abs=1e-9)
    assert 0.45 < seen.share < 0.55


def test_small_files_lose_nothing_at_their_ends():
    """Each file's train part is sketched alone and the eval text joins every file's eval part;
    lines, unlike windows running on, are the same units in both."""
    lines = TEXT.split(b"\n")
    files = [b"\n".join(lines[i : i + 15]) + b"\n" for i in range(0, 30_000, 15)]
    then = _sketch(*(f[: _cut(f, 0.1)] for f in files))
    eval_now = b"".join(f[_cut(f, 0.15) :] for f in files)
    train_then = b"".join(f[: _cut(f, 0.1)] for f in files)
    seen = overlap.seen_share(then, eval_now)
    assert seen.share == pytest.approx(_exact_share(train_then, eval_now), abs=1e-9)
    assert seen.share > 0.2


def test_each_occurrence_of_a_seen_line_counts():
    """The score counts every occurrence, so the share does too (by bytes)."""
    seen_line = b"This line was in the training text, word for word.\n"
    unseen = [b"an unseen line number %06d of some length, padded\n" % i for i in range(1000)]
    eval_text = seen_line * 1000 + b"".join(unseen)
    share = overlap.seen_share(_sketch(seen_line), eval_text).share
    assert share == pytest.approx(len(seen_line) / (len(seen_line) + len(unseen[0])))


def test_a_full_sketch_estimates_the_share_from_the_hashes_it_could_hold():
    train_then, eval_now = TEXT[: _cut(TEXT, 0.05)], TEXT[_cut(TEXT, 0.1) :]
    exact = _exact_share(train_then, eval_now)
    seen = overlap.seen_share(_sketch(train_then, size=4000), eval_now)
    assert not seen.exact and 50 < seen.sampled < len(_lines(eval_now))
    assert seen.share == pytest.approx(exact, abs=0.1)
    assert f"estimated from {seen.sampled} of its lines" in seen.describe()


def test_a_sketch_fed_in_line_aligned_parts_is_the_sketch_of_the_whole():
    cut = _cut(TEXT, 0.1)
    parts, start = [], 0
    for end in range(1 << 16, cut, 1 << 16):
        end = TEXT.index(b"\n", end) + 1
        parts.append(TEXT[start:end])
        start = end
    parts.append(TEXT[start:cut])
    assert _sketch(*parts) == _sketch(TEXT[:cut])
    assert _sketch(*parts, size=500) == _sketch(TEXT[:cut], size=500)


def test_an_eval_text_is_hashed_in_blocks_with_the_same_result(monkeypatch):
    sketch = _sketch(TEXT[: _cut(TEXT, 0.05)])
    whole = overlap.seen_share(sketch, TEXT[_cut(TEXT, 0.1) :])
    monkeypatch.setattr(overlap, "_BLOCK_BYTES", 1000)
    assert overlap.seen_share(sketch, TEXT[_cut(TEXT, 0.1) :]) == whole


def test_hashes_are_distinct_for_distinct_lines():
    rng = random.Random(0)
    lines = {
        bytes(rng.choices(b"abcdefghij ", k=rng.randint(32, 90))) + b"\n" for _ in range(20000)
    }
    assert len(set(overlap.line_hashes(b"".join(lines))[0].tolist())) == len(lines)


def test_nothing_to_tell_without_long_lines_or_from_another_format():
    sketch = _sketch(TEXT[:100000])
    assert overlap.seen_share(sketch, b"short\nlines\n") is None
    assert overlap.seen_share(sketch, b"") is None
    other = overlap.MAGIC + b'{"format": 99, "min_line_bytes": 32, "hashes": 0}\n'
    assert overlap.seen_share(other, TEXT[:100000]) is None
    for broken, why in (
        (b"PK\x03\x04", "not a train-text sketch"),
        (overlap.MAGIC + b"[1]\n", "not an object"),
        (sketch[:-3], "cut short"),
    ):
        with pytest.raises(ValueError, match=why):
            overlap.seen_share(broken, TEXT[:100000])


def test_the_sketch_file_is_its_header_and_hashes_alone():
    """The Examples folder is content-addressed, its files the same bytes every run: the file
    holds nothing but the header and the hashes (no time stamp, as a zip's .npz would)."""
    sketch = overlap.Sketch()
    sketch.add(TEXT[:200000])
    header = b'{"format": 2, "full": false, "hashes": %d, "min_line_bytes": 32}\n' % len(
        sketch.hashes
    )
    assert sketch.to_bytes() == overlap.MAGIC + header + sketch.hashes.astype("<u8").tobytes()
