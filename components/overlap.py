"""How much of an eval text a model trained on: a sketch of its training text, and the check.

The blessing compares the candidate with the model in service on the current eval split. If
the model in service trained on some of that text (the corpus was edited, or `eval_fraction`
grew, since it trained), its score is flattered and a better candidate can be refused; if the
candidate's own train split holds eval text (a corpus that repeats itself), its score is. So
tokenize sketches the train split's text, the trainer carries the sketch inside the SavedModel
(assets.extra/, beside the training curve), and evaluate measures, for each model, the share
of the eval text that was in its training text.

Unit: a line of at least MIN_LINE_BYTES bytes (its newline included), identified by a 64-bit
hash of all its bytes. Lines are what the split and the chunks cut between, so the same line
is the same unit in a train chunk, in any file, and in the eval text; a shorter line
("ROMEO:") recurs by chance too often to tell anything. The share is by bytes, each eval line
counted as often as it occurs (the score counts every occurrence). Sketch: the SKETCH_SIZE
smallest distinct hashes of the train lines (a bottom-k sketch). A train split with fewer
distinct lines is kept whole and the share is exact; otherwise it is estimated from the eval
lines whose hash is at most the sketch's largest, each of which is in the sketch exactly when
it is in the train text, and the number of those lines is reported with it.

A shared layer: tokenize writes the sketch (contracts.artifacts.TRAIN_TEXT_SKETCH), the trainer
copies it into the SavedModel (MODEL_TEXT_SKETCH), evaluate reads it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np

from contracts.blessing import Seen

MIN_LINE_BYTES = 32
SKETCH_SIZE = 1 << 16  # hashes kept: 512 KiB in the SavedModel, whatever the corpus's size
MAGIC = b"gptpipe train-text sketch\n"
_FORMAT = 2  # bump when the unit or the hash change: an older sketch is then not used
_BLOCK_BYTES = 1 << 20  # an eval text is hashed in blocks of whole lines of about this size
# The line hash: sum of (byte + 1) * _BASE^(bytes after it in the line), modulo 2^64, from
# prefix sums weighted by _BASE's inverse powers (so a line's sum is a difference of two).
_BASE = 0x100000001B3
_BASE_INVERSE = pow(_BASE, -1, 1 << 64)


def line_hashes(text: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The hash and byte length of each whole line of `text` with at least MIN_LINE_BYTES bytes,
    in order (a last line without its newline is not whole, and not counted)."""
    data = np.frombuffer(text, dtype=np.uint8)
    ends = np.flatnonzero(data == ord("\n")) + 1
    starts = np.concatenate(([0], ends[:-1])).astype(np.int64)
    lengths = ends - starts
    keep = lengths >= MIN_LINE_BYTES
    starts, ends, lengths = starts[keep], ends[keep], lengths[keep]
    if not len(starts):
        return np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.int64)
    last = int(ends[-1])
    inverse, powers = _powers(_BASE_INVERSE, last), _powers(_BASE, last)
    prefix = np.zeros(last + 1, dtype=np.uint64)
    np.cumsum((data[:last].astype(np.uint64) + np.uint64(1)) * inverse[:last], out=prefix[1:])
    sums = (prefix[ends] - prefix[starts]) * powers[ends - 1]  # wraps: arithmetic mod 2^64
    return _finish(sums ^ (lengths.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))), lengths


_POWERS: dict[int, np.ndarray] = {}  # by base: its powers so far, kept for the next text


def _powers(base: int, n: int) -> np.ndarray:
    """base^0 .. base^(n-1) modulo 2^64 (at least n of them)."""
    known = _POWERS.get(base)
    if known is None or len(known) < n:
        powers = np.full(max(n, 2 * _BLOCK_BYTES), base, dtype=np.uint64)
        powers[0] = 1
        known = _POWERS[base] = np.cumprod(powers, dtype=np.uint64)
    return known


def _finish(h: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every bit of the sum moves every bit of the hash, so that the
    smallest hashes are a fair sample of the lines."""
    h = h ^ (h >> np.uint64(30))
    h = h * np.uint64(0xBF58476D1CE4E5B9)
    h = h ^ (h >> np.uint64(27))
    h = h * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


class Sketch:
    """The bottom-SKETCH_SIZE distinct line hashes of a text fed in parts of whole lines (the
    train chunks)."""

    def __init__(self, size: int = SKETCH_SIZE) -> None:
        self.size = size
        self.hashes = np.empty(0, dtype=np.uint64)
        self.full = False  # True once some hash was dropped: the sketch is then a sample

    def add(self, text: bytes) -> None:
        new = line_hashes(text)[0]
        if self.full:  # past the largest kept hash, nothing can enter
            new = new[new <= self.hashes[-1]]
        merged = np.union1d(self.hashes, new)
        if len(merged) > self.size:
            self.full = True
            merged = merged[: self.size]
        self.hashes = merged

    def to_bytes(self) -> bytes:
        """The sketch as a file: MAGIC, a JSON line, then the hashes as little-endian uint64.
        The same text always gives the same bytes (an .npz would not: zip stamps the time)."""
        header = {"format": _FORMAT, "min_line_bytes": MIN_LINE_BYTES, "full": self.full}
        line = json.dumps({**header, "hashes": len(self.hashes)}, sort_keys=True) + "\n"
        return MAGIC + line.encode("ascii") + self.hashes.astype("<u8").tobytes()


def merge_sketches(sketches: list[bytes], size: int = SKETCH_SIZE) -> bytes:
    """One sketch of the texts behind `sketches` (each a `Sketch.to_bytes`): the bottom `size`
    of their hashes, as one Sketch fed every text would hold."""
    merged = Sketch(size)
    for data in sketches:
        read = read_sketch(data)
        if read is None:
            raise ValueError("a train-text sketch of another format")
        hashes, full = read
        merged.hashes = np.union1d(merged.hashes, hashes)
        merged.full = merged.full or full
        if len(merged.hashes) > size:
            merged.full = True
            merged.hashes = merged.hashes[:size]
    return merged.to_bytes()


def read_sketch(data: bytes) -> tuple[np.ndarray, bool] | None:
    """A sketch file's (hashes, full), or None if it is of another format; ValueError if it is
    not a sketch or is cut short."""
    if not data.startswith(MAGIC):
        raise ValueError("not a train-text sketch (no header)")
    line, _, body = data[len(MAGIC) :].partition(b"\n")
    header = json.loads(line)
    if not isinstance(header, dict):
        raise ValueError("not a train-text sketch (its header is not an object)")
    if header.get("format") != _FORMAT or header.get("min_line_bytes") != MIN_LINE_BYTES:
        return None
    count = header.get("hashes")
    if not isinstance(count, int) or len(body) != 8 * count:
        raise ValueError(f"train-text sketch cut short: {len(body)} bytes of hashes")
    return np.frombuffer(body, dtype="<u8").astype(np.uint64), bool(header.get("full"))


def seen_share(sketch: bytes, eval_text: bytes) -> Seen | None:
    """How much of `eval_text` the text behind `sketch` holds; None if the sketch is of another
    format or the eval text has no line long enough (then nothing can be said); ValueError if
    `sketch` is not one."""
    count = SeenCount.of(sketch)
    if count is None:
        return None
    count.add(eval_text)
    return count.result()


class SeenCount:
    """`seen_share` over an eval text fed in parts, document by document, in bounded memory:
    about _BLOCK_BYTES of it are held until they are hashed."""

    def __init__(self, hashes: np.ndarray, full: bool) -> None:
        self.hashes, self.full = hashes, full
        self.seen_bytes = self.all_bytes = self.lines = 0
        self._pending: list[bytes] = []  # the current document's text not hashed yet
        self._pending_bytes = 0

    @classmethod
    def of(cls, sketch: bytes) -> SeenCount | None:
        """A count against the sketch file `sketch`; None if it is of another format,
        ValueError if it is not one."""
        read = read_sketch(sketch)
        return None if read is None else cls(*read)

    def add(self, text: bytes) -> None:
        """Feed the next text of the current document (a line may continue in the next)."""
        self._pending.append(text)
        self._pending_bytes += len(text)
        if self._pending_bytes >= _BLOCK_BYTES:
            data = b"".join(self._pending)
            cut = data.rfind(b"\n") + 1  # a line not yet whole waits for its end
            self._count(data[:cut])
            self._pending, self._pending_bytes = [data[cut:]], len(data) - cut

    def end_document(self) -> None:
        """The current document ended: its last line, if it has no newline, is not whole."""
        self._count(b"".join(self._pending))
        self._pending, self._pending_bytes = [], 0

    def result(self) -> Seen | None:
        """The share of the text fed so far (its document ended); None without a long line."""
        self.end_document()
        if not self.lines:
            return None
        return Seen(self.seen_bytes / self.all_bytes, self.lines, not self.full)

    def _count(self, text: bytes) -> None:
        hashes = self.hashes
        for block in _blocks(text):
            found, lengths = line_hashes(block)
            if self.full:  # only hashes the sketch could hold tell whether the train text had them
                sampled = found <= hashes[-1] if len(hashes) else np.zeros(len(found), dtype=bool)
                found, lengths = found[sampled], lengths[sampled]
            self.seen_bytes += int(lengths[np.isin(found, hashes)].sum())
            self.all_bytes += int(lengths.sum())
            self.lines += len(found)


def _blocks(text: bytes) -> Iterator[bytes]:
    """`text` in parts of whole lines of about _BLOCK_BYTES (bounding the hashing's memory)."""
    start = 0
    while start < len(text):
        end = text.find(b"\n", start + _BLOCK_BYTES) + 1 or len(text)
        yield text[start:end]
        start = end
