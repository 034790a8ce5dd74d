"""A part of the tokenize step: its units of the corpus, in either phase.

    python -m components.tokenize.parts sampled|encoded <work folder>

The part's index is `JOB_COMPLETION_INDEX`, as a Kubernetes Indexed Job sets it (the local
launcher sets it the same way); it takes units i, i + n, ... of the plan (plan.py), skipping
the ones already done, and publishes each unit's folder whole, its unit.json last.

- `sampled` (phase 1): read every byte of the unit (every check fails here, before the
  tokenizer is trained), count its documents, take its share of the tokenizer's sample, and
  count its eval candidates' bytes by hash bucket.
- `encoded` (phase 2): read it again, split each document by the rule the step chose, encode
  with EOS after every document, cut windows and write the shards, the eval documents
  (contracts/eval_text.py) and a sketch of the train text (components/overlap.py).

A mistake in the input (contracts.errors.UserError) is written to the termination-message
file (contracts/termination.py) and the part exits INPUT_ERROR_EXIT, which the Job's pod
failure policy does not retry. Imports no TensorFlow.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import numpy as np
import sentencepiece as spm

from components import overlap, storage
from components.tokenize import bpe
from components.tokenize.corpus import Chunk, read_chunks
from components.tokenize.dataset import relative_name
from components.tokenize.encode import Encoder
from components.tokenize.plan import (
    BUCKETS,
    EVAL_BYTES,
    PHASES,
    PLAN_FILE,
    SAMPLE_TEXT,
    SPLIT_FILE,
    TAIL,
    UNIT_EVAL_TEXT,
    UNIT_RECORD,
    UNIT_SKETCH,
    WORK_TOKENIZER,
    Encoded,
    Plan,
    Sampled,
    SplitRule,
    document_hashes,
    eval_bucket,
    read_record,
    unit_uri,
    write_record,
)
from components.tokenize.shards import SplitWriter
from contracts import termination
from contracts.artifacts import SPLITS
from contracts.errors import UserError
from contracts.eval_text import EvalPiece, piece_line

INDEX_ENV = "JOB_COMPLETION_INDEX"  # set by the Job controller (and the local launcher)


@dataclass(frozen=True)
class Text:
    """A piece of one document, with where it goes."""

    text: str
    last: bool  # it ends its document
    key: int  # the sample's key for it
    bucket: int | None  # its eval-candidate bucket (documents); None: train whatever the cap
    split: str  # its split: decided by the tail rule, or (documents) by the step's rule


def list_with_last(items: Iterator[Chunk]) -> Iterator[tuple[Chunk, bool]]:
    """Each chunk with whether it is the last of its split (chunks come train, then eval)."""
    previous = None
    for item in items:
        if previous is not None:
            yield previous, previous.split != item.split
        previous = item
    if previous is not None:
        yield previous, True


# ---- phase 1 ----------------------------------------------------------------------------------


def sample_unit(plan: Plan, work: str, unit: int) -> None:
    """Phase 1 of one unit: check, count and sample it (see the module's docstring)."""
    sample = bpe.Sample(plan.unit_sample_bytes(unit), plan.sample_fraction)
    histogram = np.zeros(BUCKETS, np.int64)
    text_bytes = 0
    formats: dict[str, int] = {}
    for source in plan.units[unit]:
        kind = _format(plan, source.uri)
        formats[kind] = formats.get(kind, 0) + 1
    stream = _Stream(plan, unit, None)
    for piece in stream:
        size = len(piece.text.encode("utf-8"))
        text_bytes += size
        if piece.split == SPLITS[0] and plan.sample_bytes:
            sample.add(piece.text, piece.key)
        if piece.bucket is not None:
            histogram[piece.bucket] += size
    documents, empty = stream.documents, stream.empty
    record = Sampled(documents, empty, text_bytes, formats)
    with _publish(unit_uri(work, PHASES[0], unit)) as folder:
        (folder / SAMPLE_TEXT).write_text(sample.text(), encoding="utf-8")
        (folder / EVAL_BYTES).write_bytes(histogram.astype("<i8").tobytes())
        write_record(str(folder / UNIT_RECORD), record)


def _format(plan: Plan, uri: str) -> str:
    if plan.split_method == TAIL:
        return "txt"
    from components.tokenize.readers import format_of

    return format_of(uri)


class _Stream:
    """A unit's text, piece by piece in order, each with where it goes (without a rule, in
    phase 1, every eval candidate counts as eval); its document counts once it is read."""

    def __init__(self, plan: Plan, unit: int, rule: SplitRule | None) -> None:
        self.plan, self.unit, self.rule = plan, unit, rule
        self.documents = self.empty = 0

    def __iter__(self) -> Iterator[Text]:
        plan = self.plan
        for source in plan.units[self.unit]:
            name = relative_name(source.uri, plan.root)
            if plan.split_method == TAIL:
                self.documents += 1
                self.empty += 1  # until a chunk holds more than whitespace
                blank = True
                chunks = read_chunks(
                    source, plan.eval_fraction, plan.chunk_bytes, plan.eval_max_bytes
                )
                for number, (chunk, last) in enumerate(list_with_last(chunks)):
                    if blank and not chunk.text.isspace():
                        blank = False
                        self.empty -= 1
                    _, key = document_hashes(name, number)
                    ends = last and chunk.split == SPLITS[1]  # the file ends in its eval part
                    yield Text(chunk.text, ends, key, None, chunk.split)
                continue
            from components.tokenize.readers import DocumentReader

            reader = DocumentReader(
                source, text_field=plan.text_field, piece_bytes=plan.chunk_bytes
            )
            current, place, key, pieces = -1, 0.0, 0, 0
            for piece in reader.pieces():
                if piece.doc != current:
                    current, pieces = piece.doc, 0
                    place, key = document_hashes(name, piece.doc)
                pieces += 1
                bucket = eval_bucket(place, plan.eval_fraction)
                rule = self.rule
                is_eval = bucket is not None and (rule is None or bucket < rule.eval_buckets)
                split = SPLITS[1] if is_eval else SPLITS[0]
                yield Text(piece.text, piece.last, key ^ pieces, bucket, split)
            self.documents += reader.documents
            self.empty += reader.empty


# ---- phase 2 ----------------------------------------------------------------------------------


def encode_unit(plan: Plan, work: str, unit: int, rule: SplitRule, model: bytes) -> None:
    """Phase 2 of one unit: encode it and write its shards (see the module's docstring)."""
    encoder = _encoder(model, rule.eos_id)
    stream = _Stream(plan, unit, rule)
    with _publish(unit_uri(work, PHASES[1], unit)) as folder:
        writers = {s: SplitWriter(folder, s, plan.seq_len, plan.shard_windows) for s in SPLITS}
        batches = {s: _Batch() for s in SPLITS}
        chars = dict.fromkeys(SPLITS, 0)
        documents = dict.fromkeys(SPLITS, 0)
        sketch = overlap.Sketch()

        def flush(split: str) -> None:
            batch = batches[split]
            if not batch.texts:
                return
            ids = encoder.encode(batch.texts, batch.ends)
            writers[split].add(ids)
            if split == SPLITS[0]:
                sketch.add("\n".join(batch.texts).encode("utf-8"))
            batches[split] = _Batch()

        try:
            with (folder / UNIT_EVAL_TEXT).open("wb") as eval_text:
                for piece in stream:
                    batch = batches[piece.split]
                    batch.add(piece.text, piece.last)
                    chars[piece.split] += len(piece.text)
                    documents[piece.split] += piece.last
                    if piece.split == SPLITS[1]:
                        eval_text.write(piece_line(EvalPiece(piece.text, piece.last)))
                    if batch.chars >= plan.chunk_bytes:
                        flush(piece.split)
                for split in SPLITS:
                    flush(split)
            if plan.split_method == TAIL:  # the file's train part is part of its one document
                documents[SPLITS[0]] = stream.documents
            stats = {split: writers[split].finish(chars[split]) for split in SPLITS}
        except BaseException:
            for writer in writers.values():
                writer.abort()
            raise
        (folder / UNIT_SKETCH).write_bytes(sketch.to_bytes())
        write_record(str(folder / UNIT_RECORD), Encoded(stats, documents))


@functools.lru_cache(maxsize=1)
def _encoder(model: bytes, eos: int) -> Encoder:
    """The part's one encoder for the model: its word cache serves every unit the part packs."""
    return Encoder(spm.SentencePieceProcessor(model_proto=model), eos)


class _Batch:
    """Pieces of one split waiting to be encoded together."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.ends: list[bool] = []
        self.chars = 0

    def add(self, text: str, last: bool) -> None:
        self.texts.append(text)
        self.ends.append(last)
        self.chars += len(text)


# ---- the part -----------------------------------------------------------------------------


class _publish:  # noqa: N801 - a context manager, named for what it does
    """A unit's folder, written locally and published whole (storage.atomic_dir); a unit that
    another attempt of the same part published meanwhile (a retried pod) counts as done."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._inner = storage.atomic_dir(uri, ready=UNIT_RECORD)

    def __enter__(self) -> Path:
        return self._inner.__enter__()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> bool:
        try:
            return bool(self._inner.__exit__(kind, error, trace))
        except FileExistsError:
            if storage.has_content(storage.join(self.uri, UNIT_RECORD)):
                return True
            raise


def run_part(phase: str, work: str, part: int) -> list[int]:
    """Do phase `phase` of every unit of part `part` not done yet; the units it did."""
    plan = read_record(Plan, storage.join(work, PLAN_FILE))
    assert isinstance(plan, Plan)
    rule = model = None
    if phase == PHASES[1]:
        rule = read_record(SplitRule, storage.join(work, SPLIT_FILE))
        model = storage.read_bytes(storage.join(work, WORK_TOKENIZER))
    done = []
    for unit in plan.part_units(part):
        if storage.has_content(storage.join(unit_uri(work, phase, unit), UNIT_RECORD)):
            continue
        if phase == PHASES[0]:
            sample_unit(plan, work, unit)
        else:
            assert isinstance(rule, SplitRule) and model is not None
            encode_unit(plan, work, unit, rule, model)
        done.append(unit)
    return done


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in PHASES:
        print(
            f"usage: python -m components.tokenize.parts {{{'|'.join(PHASES)}}} WORK",
            file=sys.stderr,
        )
        return 64
    phase, work = argv
    part = int(os.environ.get(INDEX_ENV, "0"))
    try:
        run_part(phase, work, part)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        path = os.environ.get(termination.WORKER_MESSAGE_ENV)
        if path:
            termination.write(
                path, termination.TerminationMessage(termination.INPUT_ERROR, str(err))
            )
        return termination.INPUT_ERROR_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
