"""Encode text to token ids, and count the CPUs a step may use.

Each part of the tokenize step (components/tokenize/parts.py) is one process that encodes
its own sources, so parts scale over CPUs and pods alike; nothing here starts a process.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm


def default_workers() -> int:
    """The CPUs this process may use: its affinity, capped by a cgroup's CPU quota (a
    Kubernetes pod's CPU limit; the node's CPUs would start a worker per CPU of the node)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    quota = cpu_quota()
    return max(1, min(cpus, math.ceil(quota))) if quota else cpus


CGROUP = Path("/sys/fs/cgroup")


def cpu_quota(cgroup: Path = CGROUP) -> float | None:
    """The CPUs the cgroup's quota allows, or None when it sets none (v2 `cpu.max`, else v1
    `cpu.cfs_quota_us` over `cpu.cfs_period_us`)."""
    try:
        if (cgroup / "cpu.max").exists():
            quota, period = (cgroup / "cpu.max").read_text().split()
        else:
            quota = (cgroup / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (cgroup / "cpu" / "cpu.cfs_period_us").read_text().strip()
        return None if quota in ("max", "-1") else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def encode_text(processor: spm.SentencePieceProcessor, text: str) -> np.ndarray:
    """The ids of `text`, as int32: equal to `processor.encode(text)`, about twice as fast.

    "\\n" is a piece of its own that no merge crosses, so encoding line by line and putting a
    newline id between the lines gives the ids of the whole text; BPE on short lines is
    faster than on one long string.
    """
    return encode_pieces(processor, [text], [False], eos=-1)


def encode_pieces(
    processor: spm.SentencePieceProcessor, texts: Sequence[str], ends: Sequence[bool], eos: int
) -> np.ndarray:
    """The ids of `texts` one after another, with `eos` after each text whose `ends` is True
    (a document's last piece): `encode_text` of each, in one call to SentencePiece."""
    if not texts:
        return np.zeros(0, np.int32)
    lines: list[str] = []
    per_text: list[int] = []
    for text in texts:
        split = text.split("\n")
        lines.extend(split)
        per_text.append(len(split))
    encoded = processor.encode(lines, num_threads=1)
    counts = np.fromiter(map(len, encoded), np.int64, len(encoded))
    flat = np.fromiter(itertools.chain.from_iterable(encoded), np.int32, int(counts.sum()))
    # Where each line's ids end in `flat`; a newline goes after every line but a text's last,
    # and EOS after the last line of a text that ends a document. Several can share a place
    # (a text that ends in "\n" and a document's end, then a text that starts with one): they
    # go in by text, and a text's newlines before its EOS.
    line_ends = np.cumsum(counts)
    last_line = np.cumsum(per_text) - 1
    newline_at = np.delete(line_ends, last_line)
    newline_text = np.delete(np.repeat(np.arange(len(texts)), per_text), last_line)
    ended = np.flatnonzero(np.asarray(ends, dtype=bool))
    at = np.concatenate([newline_at, line_ends[last_line][ended]])
    text_of = np.concatenate([newline_text, ended])
    kind = np.concatenate([np.zeros(len(newline_at), np.int8), np.ones(len(ended), np.int8)])
    values = np.where(kind == 0, np.int32(processor.piece_to_id("\n")), np.int32(eos))
    order = np.lexsort((kind, text_of, at))
    return np.insert(flat, at[order], values[order].astype(np.int32))


# A text's words as SentencePiece splits its input before it merges (split_by_whitespace,
# model_interface.cc SplitIntoWords, with allow_whitespace_only_pieces): a run of non-spaces, or
# a run of spaces with the non-spaces after it; "\n" alone. Every character is in one. A space
# is "\u2581" once escaped, so a "\u2581" in the text is a space to SentencePiece too.
_WORDS = re.compile("\n|[^ \u2581\n]+|[ \u2581]+[^ \u2581\n]*")
_END = "\n</s>"  # the key of EOS in the cache: no word holds "\n" beside anything else
# What the cache may hold, counting each word's characters and ids and about 150 bytes of
# Python objects beside them; past it, it starts again once the batch is encoded.
CACHE_BYTES = 32 << 20
_ENTRY_BYTES = 150
_PROBE = (
    "Two  households,\tboth   alike\n\n  in dignity. \u2581 a\u2581  b "
    "\u00c9coute \u3000\u6f22\u5b57 \u00b4x \U0001f600  "
)


class Encoder:
    """Texts to ids, as `encode_pieces`, with a cache of each word's ids.

    No piece of our models crosses the start of a run of spaces (the trainer's
    split_by_whitespace: a piece holds "\u2581" only first, or only "\u2581"s), and they
    normalize nothing, so a text's ids are its words' ids one after another, each word encoded
    alone. A corpus repeats its words: most are looked up, and only new ones reach
    SentencePiece, together. The ids equal `encode_pieces`' (tests/components/tokenize); a model
    that might not allow it (a given tokenizer that normalizes, or whose pieces cross a space)
    is encoded by lines instead.
    """

    def __init__(self, processor: spm.SentencePieceProcessor, eos: int) -> None:
        self.processor = processor
        self.eos = eos
        self.by_words = _words_stand_alone(processor)
        self._cache: dict[str, bytes] = {}
        self._bytes = 0
        self._reset()

    def encode(self, texts: Sequence[str], ends: Sequence[bool]) -> np.ndarray:
        """The ids of `texts` one after another, `eos` after each whose `ends` is True."""
        if not self.by_words:
            return encode_pieces(self.processor, texts, ends, self.eos)
        words: list[str] = []
        for text, end in zip(texts, ends, strict=True):
            words += _WORDS.findall(text)
            if end:
                words.append(_END)
        new = list(set(words).difference(self._cache))
        if new:
            for word, ids in zip(new, self.processor.encode(new, num_threads=1), strict=True):
                packed = np.array(ids, np.int32).tobytes()
                self._cache[word] = packed
                self._bytes += _ENTRY_BYTES + len(word) + len(packed)
        joined = b"".join(map(self._cache.__getitem__, words))
        if self._bytes > CACHE_BYTES:  # (text without spaces is one long word per line)
            self._reset()
        return np.frombuffer(joined, np.int32)

    def _reset(self) -> None:
        self._cache.clear()
        self._cache["\n"] = np.int32(self.processor.piece_to_id("\n")).tobytes()
        self._cache[_END] = np.int32(self.eos).tobytes()
        self._bytes = 0


def _words_stand_alone(processor: spm.SentencePieceProcessor) -> bool:
    """Whether each word of a text encodes alone as within it: the model normalizes nothing
    (identity rule, no dummy prefix, no whitespace folding), no piece but whitespace ones holds
    "\u2581" after its start, and a probe of spaces, tabs and non-ASCII agrees."""
    normalizer = _fields(_field(processor.serialized_model_proto(), _NORMALIZER_SPEC))
    if normalizer != {_NAME: b"identity", _ADD_DUMMY_PREFIX: 0, _REMOVE_EXTRA_WHITESPACES: 0}:
        return False
    for i in range(processor.get_piece_size()):
        piece = processor.id_to_piece(i)
        if "\u2581" in piece[1:] and piece.strip("\u2581"):
            return False
    words = _WORDS.findall(_PROBE)
    return [i for w in words for i in processor.encode(w)] == processor.encode(_PROBE)


# sentencepiece_model.proto: ModelProto.normalizer_spec is field 3; in NormalizerSpec, name is
# 1, add_dummy_prefix 3 and remove_extra_whitespaces 4 (both true when left out), and 2 the
# precompiled character map, left out, as empty, by the identity rule. Read off the wire:
# sentencepiece's own sentencepiece_model_pb2 needs protobuf 5, and the stack pins protobuf < 5.
_NORMALIZER_SPEC, _NAME, _ADD_DUMMY_PREFIX, _REMOVE_EXTRA_WHITESPACES = 3, 1, 3, 4


def _field(message: bytes, number: int) -> bytes:
    """The last value of length-delimited field `number` of `message` (b"" if absent)."""
    found = b""
    for key, value in _wire(message):
        if key == number and isinstance(value, bytes):
            found = value
    return found


def _fields(message: bytes) -> dict[int, int | bytes]:
    """The fields of `message` by number (the last of each), an empty bytes field left out;
    NormalizerSpec's two booleans default to 1 (true) when left out."""
    found: dict[int, int | bytes] = {_ADD_DUMMY_PREFIX: 1, _REMOVE_EXTRA_WHITESPACES: 1}
    for key, value in _wire(message):
        if value != b"" and key != 5:  # escape_whitespaces (5): how, not whether, spaces split
            found[key] = value
    return found


def _wire(message: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of each field of a serialized protobuf message: varints as ints,
    length-delimited and fixed-width fields as bytes."""
    at = 0
    while at < len(message):
        key, at = _varint(message, at)
        kind = key & 7
        if kind == 0:
            value, at = _varint(message, at)
            yield key >> 3, value
            continue
        if kind == 2:
            size, at = _varint(message, at)
        elif kind in (1, 5):
            size = 8 if kind == 1 else 4
        else:
            raise ValueError(f"wire type {kind} in a SentencePiece model")
        yield key >> 3, message[at : at + size]
        at += size


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
