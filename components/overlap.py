"""How much of an eval text a model trained on: a sketch of its training text, and the check.

The blessing compares the candidate with the model in service on the current eval split. If
the model in service trained on some of that text (the corpus was edited, `eval_fraction`
grew, or a file appears twice), its score is flattered and a better candidate can be refused.
So tokenize sketches the train split's text, the trainer carries the sketch inside the
SavedModel (assets.extra/, beside the training curve), and evaluate measures, for each model,
the share of the eval text's windows that were in its training text.

Windows: the 64 bytes from each line start (lines run on across a window), so the same text
gives the same windows wherever it sits in a file, whatever the tokenizer. A short line that
recurs ("ROMEO:") is a window only with the 63 bytes after it. Sketch: the SKETCH_SIZE smallest
distinct 64-bit hashes of the train windows (a bottom-k sketch, as MinHash-based
deduplication keeps). A train split with fewer windows is kept whole and the share is exact;
otherwise it is estimated from the eval windows whose hash is at most the sketch's largest,
each of which is in the sketch exactly when it is in the train text. The estimate's sample is
reported with it.

A shared layer: tokenize writes the sketch (contracts.artifacts.TRAIN_TEXT_SKETCH), the trainer
copies it into the SavedModel (MODEL_TEXT_SKETCH), evaluate reads it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

WINDOW_BYTES = 64
SKETCH_SIZE = 1 << 16  # hashes kept: 512 KiB in the SavedModel, whatever the corpus's size
MAGIC = b"gptpipe train-text sketch\n"
_FORMAT = 1  # bump when the windows or the hash change: an older sketch is then not used


def window_hashes(text: bytes) -> np.ndarray:
    """The distinct hashes of `text`'s windows (every line start with 64 bytes after it), sorted."""
    data = np.frombuffer(text, dtype=np.uint8)
    starts = np.flatnonzero(data == ord("\n")) + 1
    starts = np.concatenate(([0], starts)) if len(data) else starts
    starts = starts[starts + WINDOW_BYTES <= len(data)]
    if not len(starts):
        return np.empty(0, dtype=np.uint64)
    # The 8-byte little-endian word at every byte offset (a view: nothing is copied), read
    # at each window's 8 word offsets.
    words: np.ndarray = np.ndarray((len(data) - 7,), dtype="<u8", buffer=data, strides=(1,))
    return np.unique(_mix([words[starts + offset] for offset in range(0, WINDOW_BYTES, 8)]))


def _mix(words: list[np.ndarray]) -> np.ndarray:
    """A 64-bit hash of each window from its 8 words: multiply-xor over the words, then
    splitmix64's finaliser. numpy's uint64 arithmetic wraps, which is the modulus wanted."""
    with np.errstate(over="ignore"):
        h = np.full(len(words[0]), 0x9E3779B97F4A7C15, dtype=np.uint64)
        for word in words:
            h = (h ^ word) * np.uint64(0x100000001B3)
            h ^= h >> np.uint64(29)
        h ^= h >> np.uint64(30)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(27)
        h *= np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(31)
    return h


class Sketch:
    """The bottom-SKETCH_SIZE distinct window hashes of a text fed in parts (train chunks of
    whole lines: a window is never cut at a part's end, it is just not taken there)."""

    def __init__(self, size: int = SKETCH_SIZE) -> None:
        self.size = size
        self.hashes = np.empty(0, dtype=np.uint64)
        self.full = False  # True once some hash was dropped: the sketch is then a sample

    def add(self, text: bytes) -> None:
        new = window_hashes(text)
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
        header = {"format": _FORMAT, "window_bytes": WINDOW_BYTES, "full": self.full}
        line = json.dumps({**header, "hashes": len(self.hashes)}, sort_keys=True) + "\n"
        return MAGIC + line.encode("ascii") + self.hashes.astype("<u8").tobytes()


def read_sketch(data: bytes) -> tuple[np.ndarray, bool] | None:
    """A sketch file's (hashes, full), or None if it is of another format; ValueError if it is
    not a sketch or is cut short."""
    if not data.startswith(MAGIC):
        raise ValueError("not a train-text sketch (no header)")
    line, _, body = data[len(MAGIC) :].partition(b"\n")
    header = json.loads(line)
    if header.get("format") != _FORMAT or header.get("window_bytes") != WINDOW_BYTES:
        return None
    if len(body) != 8 * header["hashes"]:
        raise ValueError(f"train-text sketch cut short: {len(body)} bytes of hashes")
    return np.frombuffer(body, dtype="<u8").astype(np.uint64), bool(header["full"])


@dataclass(frozen=True)
class Seen:
    """The share of an eval text's windows that were in a model's training text."""

    share: float  # 0..1
    sampled: int  # eval windows the share is measured on (all of them when `exact`)
    exact: bool  # the train sketch held every train window

    def describe(self) -> str:
        how = "" if self.exact else f", estimated from {self.sampled} of them"
        return f"{self.share:.1%} of the eval text's {WINDOW_BYTES}-byte windows{how}"


def seen_share(sketch: bytes, eval_text: bytes) -> Seen | None:
    """How much of `eval_text` the text behind `sketch` holds; None if the sketch is of another
    format or the eval text has no window (then nothing can be said); ValueError if `sketch`
    is not one."""
    read = read_sketch(sketch)
    if read is None:
        return None
    hashes, full = read
    windows = window_hashes(eval_text)
    if full:  # only hashes the sketch could hold tell whether the train text had them
        windows = windows[windows <= hashes[-1]] if len(hashes) else windows[:0]
    if not len(windows):
        return None
    found = np.isin(windows, hashes, assume_unique=True)
    return Seen(float(found.mean()), len(windows), not full)
