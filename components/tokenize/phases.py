"""The tokenize step's side of its parts: start a phase, follow it, read back what the units
left, and merge the encoded units into the Examples folder.

A phase runs on a `PartRunner`: in this process (one part), as processes on this machine, or
as a Kubernetes Indexed Job (components/jobs/indexed.py), whichever the step was given; the
output is the same, byte for byte (plan.py says why).
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from components import overlap, storage
from components.tokenize import parts as part_program
from components.tokenize.plan import (
    BUCKETS,
    DOCUMENTS,
    EVAL_BYTES,
    PHASES,
    SAMPLE_TEXT,
    UNIT_EVAL_TEXT,
    UNIT_RECORD,
    UNIT_SKETCH,
    Encoded,
    Plan,
    Sampled,
    read_record,
    unit_uri,
)
from components.tokenize.progress import Report
from contracts.artifacts import EVAL_TEXT, SPLITS, TRAIN_TEXT_SKETCH, shard_file
from contracts.errors import UserError
from contracts.examples import SplitStats

# How often a phase's finished units are counted, for its progress: a listing of the phase's
# folder, which on gs:// names every shard written so far, so it is asked for less often.
WATCH_S = 1.0
WATCH_GCS_S = 15.0


class PartRunner(Protocol):
    """Runs `python -m components.tokenize.parts <phase> <work>` as `parts` indexed parts,
    to the end; raises UserError for a part that stopped on bad input."""

    def __call__(self, phase: str, work: str, parts: int) -> None: ...


def in_process(phase: str, work: str, parts: int) -> None:
    """Every part here, one after another (a corpus of one unit, tests)."""
    for part in range(parts):
        part_program.run_part(phase, work, part)


def run_phase(runner: PartRunner, phase: str, plan: Plan, work: str, report: Report) -> None:
    """Run one phase of every unit not done yet, reporting the units' bytes as they finish."""
    total = sum(plan.unit_size(u) for u in range(len(plan.units)))
    stage = "read" if phase == PHASES[0] else "encode"
    with report.stage(stage, total) as advance:
        stop = threading.Event()
        watcher = threading.Thread(
            target=_watch, args=(plan, work, phase, advance, stop), daemon=True
        )
        watcher.start()
        try:
            runner(phase, work, plan.parts)
        finally:
            stop.set()
            watcher.join()
        advance(total)
    missing = [u for u in range(len(plan.units)) if not _done(work, phase, u)]
    if missing:  # a runner that returned without doing its work: never merge a partial set
        raise RuntimeError(f"tokenize: phase {phase} left units {missing} unfinished")


def _watch(
    plan: Plan, work: str, phase: str, advance: Callable[[int], None], stop: threading.Event
) -> None:
    every = WATCH_GCS_S if storage.is_gcs(work) else WATCH_S
    while not stop.wait(every):
        try:
            names = storage.list_tree(storage.join(work, phase))
        except Exception:  # progress only: a listing that fails is tried again
            continue
        done = {int(n.split("/")[0].split("-")[1]) for n in names if n.endswith(UNIT_RECORD)}
        advance(sum(plan.unit_size(u) for u in done))


def _done(work: str, phase: str, unit: int) -> bool:
    return storage.has_content(storage.join(unit_uri(work, phase, unit), UNIT_RECORD))


# ---- phase 1's results ----------------------------------------------------------------------


def sampled(plan: Plan, work: str) -> tuple[list[Sampled], str, np.ndarray]:
    """Every unit's counts, the tokenizer's sample (units in order) and the eval candidates'
    bytes by bucket, summed."""
    records, texts = [], []
    histogram = np.zeros(BUCKETS, np.int64)
    for unit in range(len(plan.units)):
        folder = unit_uri(work, PHASES[0], unit)
        record = read_record(Sampled, storage.join(folder, UNIT_RECORD))
        assert isinstance(record, Sampled)
        records.append(record)
        texts.append(storage.read_bytes(storage.join(folder, SAMPLE_TEXT)).decode("utf-8"))
        data = storage.read_bytes(storage.join(folder, EVAL_BYTES))
        histogram += np.frombuffer(data, "<i8").astype(np.int64)
    return records, "".join(texts), histogram


# ---- the merge -----------------------------------------------------------------------------


def merge(
    plan: Plan, work: str, corpus: str
) -> tuple[dict[str, SplitStats], dict[str, int], dict[str, str]]:
    """The encoded units as one dataset: each split's stats (its shards named for the whole
    dataset, units in order), documents by split, and the shards, {name: uri in the work}."""
    units = range(len(plan.units))
    records = []
    for unit in units:
        record = read_record(Encoded, storage.join(unit_uri(work, PHASES[1], unit), UNIT_RECORD))
        assert isinstance(record, Encoded)
        records.append(record)
    include: dict[str, str] = {}
    stats: dict[str, SplitStats] = {}
    documents = dict.fromkeys(SPLITS, 0)
    listed = _listed(work, units)
    for split in SPLITS:
        shards = [
            storage.join(unit_uri(work, PHASES[1], unit), shard)
            for unit, record in zip(units, records, strict=True)
            for shard in record.splits[split].shards
        ]
        names = tuple(shard_file(split, i, len(shards)) for i in range(len(shards)))
        include.update(zip(names, shards, strict=True))
        parts = [record.splits[split] for record in records]
        stats[split] = SplitStats(
            names,
            sum(s.windows for s in parts),
            sum(s.tokens for s in parts),
            sum(s.chars for s in parts),
            tuple(n for s in parts for n in s.shard_windows),
            tuple(listed[uri].size for uri in shards),
            tuple(listed[uri].crc32c for uri in shards) if storage.is_gcs(work) else (),
        )
        documents[split] = sum(record.documents[split] for record in records)
        check_one_window(corpus, split, stats[split], plan)
    return stats, documents, include


def _listed(work: str, units: range) -> dict[str, storage.FileInfo]:
    """The encoded units' files by URI, as the store lists them: their sizes, and on gs://
    their crc32c, for the manifest (no shard is read again)."""
    found = {}
    for unit in units:
        folder = unit_uri(work, PHASES[1], unit)
        for relative, info in storage.list_tree(folder).items():
            found[storage.join(folder, relative)] = info
    return found


def write_merged(plan: Plan, work: str, folder: Path) -> None:
    """Write into `folder` (the Examples' temporary folder) the eval documents and the
    train-text sketch of every unit, as one."""
    units = range(len(plan.units))
    (folder / EVAL_TEXT).parent.mkdir(parents=True, exist_ok=True)
    with (folder / EVAL_TEXT).open("wb") as out:
        for unit in units:
            eval_text = storage.join(unit_uri(work, PHASES[1], unit), UNIT_EVAL_TEXT)
            with storage.open_read(eval_text) as f:
                shutil.copyfileobj(f, out)
    sketches = [
        storage.read_bytes(storage.join(unit_uri(work, PHASES[1], unit), UNIT_SKETCH))
        for unit in units
    ]
    (folder / TRAIN_TEXT_SKETCH).write_bytes(overlap.merge_sketches(sketches))


def check_one_window(corpus: str, split: str, stats: SplitStats, plan: Plan) -> None:
    """Refuse a split with no window: nothing to train on, or to evaluate."""
    if stats.windows:
        return
    if plan.split_method == DOCUMENTS and not stats.tokens:
        raise UserError(
            f"corpus {corpus!r}: no document fell into the {split} split, which takes whole "
            f"documents by a hash of their names (about tokenize.eval_fraction = "
            f"{plan.eval_fraction} of them); give more documents, or a larger eval_fraction"
        )
    seq_len = plan.seq_len
    tokens = stats.tokens
    larger_split = ", or a larger eval_fraction / eval_max_bytes" if split == "eval" else ""
    fits = f"seq_len <= {tokens - 1}" if tokens > 1 else "a smaller seq_len"
    raise UserError(
        f"corpus {corpus!r}: the {split} split has {tokens} tokens, fewer than one window of "
        f"seq_len + 1 = {seq_len + 1}; use {fits}, more data{larger_split}"
    )


def remove_work(work: str) -> None:
    """The work folder, once its Examples are published."""
    storage.delete_tree(work)
