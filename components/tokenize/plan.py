"""What the tokenize step and its parts share: the plan, the split rule, the work folder's
layout, and the record each part leaves for every unit it finishes.

The corpus's sources are grouped, in listing order, into units of at least `unit_bytes` (a
function of the listing alone), and part `i` of `n` takes units i, i + n, i + 2n, ... So the
units, and with them every shard's bytes, are the same whatever the number of parts and
wherever they run; only who does which unit changes. Windows never cross a unit's end.

The work folder (`<datasets_root>/.<version>.work/`, beside the Examples it becomes) holds:

    plan.json                         the Plan, written by the step before the first phase
    sampled/unit-<u>/unit.json        phase 1, one folder per unit, published whole, unit.json
                    /sample.txt       last: its counts, the tokenizer's sample of its train
                    /eval_bytes.bin   text, and its eval candidates' bytes by hash bucket
    tokenizer.model, split.json       the step, between the phases
    encoded/unit-<u>/unit.json        phase 2: the unit's shards (Split-<split>/part-<k>.gz),
                    /...              its eval documents and a sketch of its train text

A unit whose unit.json exists is done, and is never redone: a step run again (the same
version, so the same work folder) resumes where the last run stopped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from components import storage
from contracts import records
from contracts.examples import SplitStats

PLAN_FILE = "plan.json"
SPLIT_FILE = "split.json"
WORK_TOKENIZER = "tokenizer.model"
UNIT_RECORD = "unit.json"  # written last into a unit's folder: the unit is done
SAMPLE_TEXT = "sample.txt"
EVAL_BYTES = "eval_bytes.bin"
UNIT_EVAL_TEXT = "eval.jsonl"
UNIT_SKETCH = "train_text_sketch.bin"
PHASES = ("sampled", "encoded")  # the folders of the two phases' units

# How the split is made: the tail of a corpus that is one .txt file (nanoGPT's split), else
# whole documents by a hash of their identity. Named in the dataset's parameters.
TAIL = "file-tail-bytes-v3"
DOCUMENTS = "document-hash-v1"
# Eval candidates (documents whose hash is under eval_fraction) are counted in this many
# buckets by hash, so that the step can choose the largest eval set under eval_max_bytes.
BUCKETS = 1 << 16


@dataclass(frozen=True)
class Plan:
    """Everything a part needs, besides the tokenizer and split rule of phase 2."""

    corpus: str  # as the user gave it
    root: str  # the folder sources are named relative to (a document's identity)
    split_method: str  # TAIL or DOCUMENTS
    units: tuple[tuple[storage.FileInfo, ...], ...]  # sources, grouped
    parts: int  # part i takes units i, i + parts, ...
    text_field: str  # the JSONL field or Parquet column of a document
    eval_fraction: float
    eval_max_bytes: int  # 0: no cap
    chunk_bytes: int  # text encoded at a time, and the longest piece of a document
    sample_bytes: int  # the tokenizer's sample, at most, over all units; 0: none (given)
    sample_fraction: float  # of each train piece, the share the sample keeps (bpe.Sample)
    seq_len: int
    shard_windows: int

    def unit_sample_bytes(self, unit: int) -> int:
        """Unit `unit`'s share of the sample's bound, by its listed bytes."""
        total = sum(f.size for sources in self.units for f in sources)
        size = sum(f.size for f in self.units[unit])
        return self.sample_bytes * size // max(total, 1)

    def part_units(self, part: int) -> range:
        return range(part, len(self.units), self.parts)

    def unit_size(self, unit: int) -> int:
        return sum(f.size for f in self.units[unit])


@dataclass(frozen=True)
class SplitRule:
    """Phase 2's split and end-of-document id, decided by the step after phase 1."""

    eval_buckets: int  # an eval candidate in a bucket below this is eval; BUCKETS: all are
    eos_id: int  # the tokenizer's EOS, written after every document


@dataclass(frozen=True)
class Sampled:
    """A unit after phase 1."""

    documents: int  # documents read, empty ones included
    empty: int  # documents with no text (or only whitespace), skipped
    text_bytes: int  # UTF-8 bytes of document text
    formats: dict[str, int]  # files by format (readers.format_of)


@dataclass(frozen=True)
class Encoded:
    """A unit after phase 2: its shards (relative to its folder) and counts, by split."""

    splits: dict[str, SplitStats]
    documents: dict[str, int]  # documents by split (a tail-split file counts in both)


def unit_name(unit: int) -> str:
    return f"unit-{unit:05d}"


def unit_uri(work: str, phase: str, unit: int) -> str:
    return storage.join(work, phase, unit_name(unit))


def group_units(
    sources: Sequence[storage.FileInfo], unit_bytes: int
) -> tuple[tuple[storage.FileInfo, ...], ...]:
    """Consecutive sources in units of at least `unit_bytes` listed bytes (the last may be
    less)."""
    units: list[tuple[storage.FileInfo, ...]] = []
    current: list[storage.FileInfo] = []
    for source in sources:
        current.append(source)
        if sum(f.size for f in current) >= unit_bytes:
            units.append(tuple(current))
            current = []
    if current:
        units.append(tuple(current))
    return tuple(units)


def document_hashes(name: str, doc: int) -> tuple[float, int]:
    """A document's place in [0, 1), which decides its split, and an independent 64-bit key,
    which decides whether the tokenizer's sample keeps it; both from its identity: its
    source's name relative to the corpus root, and its index in the source."""
    digest = hashlib.blake2b(f"{name}\0{doc}".encode(), digest_size=16).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64, int.from_bytes(digest[8:], "big")


def eval_bucket(place: float, eval_fraction: float) -> int | None:
    """The bucket of an eval candidate, None for a document that is train whatever the cap."""
    if place >= eval_fraction:
        return None
    return min(int(place / eval_fraction * BUCKETS), BUCKETS - 1)


def eval_buckets(histogram: np.ndarray, eval_max_bytes: int) -> int:
    """The most buckets whose candidates hold at most `eval_max_bytes` (all with no cap)."""
    if not eval_max_bytes or int(histogram.sum()) <= eval_max_bytes:
        return BUCKETS
    return int(np.searchsorted(np.cumsum(histogram), eval_max_bytes, side="right"))


def write_record(uri: str, record: object) -> None:
    storage.write_bytes(uri, (records.to_json(record) + "\n").encode("utf-8"))


def read_record(cls: type, uri: str) -> object:
    return records.from_json(cls, storage.read_bytes(uri).decode("utf-8"), uri)
