"""The train-text sketch and the share of an eval text a model trained on (components/overlap.py),
checked against the windows themselves compared as bytes."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from components import overlap

TEXT = (Path(__file__).resolve().parents[1] / "data" / "tinyshakespeare.txt").read_bytes()


def _cut(fraction: float) -> int:
    """Where a file-tail split with `eval_fraction` = fraction starts (the next line start)."""
    return TEXT.index(b"\n", round(len(TEXT) * (1 - fraction))) + 1


def _windows(text: bytes) -> set[bytes]:
    """The windows as bytes, the slow way: 64 bytes from every line start that has them."""
    starts = [0] + [i + 1 for i, byte in enumerate(text) if byte == ord("\n")]
    return {text[s : s + 64] for s in starts if s + 64 <= len(text)}


def _exact_share(train: bytes, eval_text: bytes) -> float:
    ours, theirs = _windows(eval_text), _windows(train)
    return len(ours & theirs) / len(ours)


def _sketch(*parts: bytes, size: int = overlap.SKETCH_SIZE) -> bytes:
    sketch = overlap.Sketch(size)
    for part in parts:
        sketch.add(part)
    return sketch.to_bytes()


def test_a_disjoint_split_shares_nothing_and_the_train_text_everything():
    cut = _cut(0.1)
    sketch = _sketch(TEXT[:cut])
    own = overlap.seen_share(sketch, TEXT[cut:])
    assert own == overlap.Seen(0.0, len(_windows(TEXT[cut:])), exact=True)
    assert overlap.seen_share(sketch, TEXT[: cut // 4]).share == 1.0


def test_a_model_trained_on_a_smaller_eval_fraction_saw_that_much_of_the_new_eval_text():
    """The split moved (eval_fraction 0.05 then, 0.1 now): the share is the windows' own."""
    train_then, eval_now = TEXT[: _cut(0.05)], TEXT[_cut(0.1) :]
    seen = overlap.seen_share(_sketch(train_then), eval_now)
    assert seen.exact and seen.share == pytest.approx(_exact_share(train_then, eval_now), abs=1e-9)
    assert 0.45 < seen.share < 0.55


def test_a_full_sketch_estimates_the_share_from_the_hashes_it_could_hold():
    train_then, eval_now = TEXT[: _cut(0.05)], TEXT[_cut(0.1) :]
    exact = _exact_share(train_then, eval_now)
    seen = overlap.seen_share(_sketch(train_then, size=4000), eval_now)
    assert not seen.exact and 50 < seen.sampled < len(_windows(eval_now))
    assert seen.share == pytest.approx(exact, abs=0.1)
    assert f"estimated from {seen.sampled}" in seen.describe()


def test_windows_follow_the_text_not_where_it_sits():
    """The same lines elsewhere in another file (or after other text) give the same windows."""
    passage = TEXT[_cut(0.1) :]
    moved = b"Some other preface.\nAnd more of it, in a second line.\n" + passage
    seen = overlap.seen_share(_sketch(moved), passage)
    assert seen.share == 1.0


def test_a_sketch_fed_in_line_aligned_parts_holds_only_windows_of_the_whole():
    cut = _cut(0.1)
    parts, start = [], 0
    for end in range(1 << 16, cut, 1 << 16):
        end = TEXT.index(b"\n", end) + 1
        parts.append(TEXT[start:end])
        start = end
    parts.append(TEXT[start:cut])
    whole = overlap.window_hashes(TEXT[:cut])
    in_parts = overlap.read_sketch(_sketch(*parts))[0]
    assert set(in_parts.tolist()) <= set(whole.tolist())
    assert len(in_parts) >= len(whole) - 2 * len(parts)  # only windows at the parts' ends lost


def test_hashes_are_distinct_for_distinct_windows():
    rng = random.Random(0)
    lines = [bytes(rng.choices(b"abcdefghij ", k=70)) for _ in range(20000)]
    assert len(overlap.window_hashes(b"\n".join(lines))) == len({line[:64] for line in lines})


def test_nothing_to_tell_without_windows_or_from_another_format():
    sketch = _sketch(TEXT[:100000])
    assert overlap.seen_share(sketch, b"short\nlines\n") is None
    assert overlap.seen_share(sketch, b"") is None
    assert len(overlap.window_hashes(b"x" * 63)) == 0 and len(overlap.window_hashes(b"")) == 0
    other = overlap.MAGIC + b'{"format": 99, "window_bytes": 64, "hashes": 0}\n'
    assert overlap.seen_share(other, TEXT[:100000]) is None
    with pytest.raises(ValueError, match="not a train-text sketch"):
        overlap.seen_share(b"PK\x03\x04", TEXT[:100000])
    with pytest.raises(ValueError, match="cut short"):
        overlap.seen_share(sketch[:-3], TEXT[:100000])


def test_the_sketch_file_is_its_header_and_hashes_alone():
    """The Examples folder is content-addressed, its files the same bytes every run: the file
    holds nothing but the header and the hashes (no time stamp, as a zip's .npz would)."""
    sketch = overlap.Sketch()
    sketch.add(TEXT[:200000])
    header = b'{"format": 1, "full": false, "hashes": %d, "window_bytes": 64}\n' % len(
        sketch.hashes
    )
    assert sketch.to_bytes() == overlap.MAGIC + header + sketch.hashes.astype("<u8").tobytes()
