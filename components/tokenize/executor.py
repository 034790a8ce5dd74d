"""Tokenize: turn a corpus of documents into the Examples artifact (docs/design.md).

    corpus ─ list, plan units ─ phase 1 on N parts: check, count, sample ─ SentencePiece BPE
           ─ phase 2 on N parts: split, encode (EOS after each document), windows, shards
           ─ merge: name the shards, sum the counts, manifest last

The parts (parts.py) run here as processes or on a cluster as an Indexed Job, and stream their
units (readers.py, corpus.py), so memory stays flat whatever the corpus's size; phase 1 checks
every byte before the tokenizer is trained, and gives it a bounded sample (bpe.Sample). Each
unit's output is published whole into a work folder, where a later run finds it done; the
Examples are published whole at the end (storage.atomic_dir), so a failure leaves nothing at
`output_dir`.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sentencepiece as spm

from components import storage
from components.tokenize import bpe, phases, reuse
from components.tokenize.corpus import CHUNK_BYTES, check_not_blank, list_sources, train_bytes
from components.tokenize.dataset import (
    DocumentCounts,
    build_manifest,
    corpus_root,
    dataset_parameters,
    dataset_version,
    source_entry,
)
from components.tokenize.encode import default_workers
from components.tokenize.phases import PartRunner
from components.tokenize.plan import (
    DOCUMENTS,
    PHASES,
    PLAN_FILE,
    SPLIT_FILE,
    TAIL,
    WORK_TOKENIZER,
    Plan,
    SplitRule,
    eval_buckets,
    group_units,
    read_record,
    write_record,
)
from components.tokenize.progress import Report
from contracts import progress as events
from contracts import records
from contracts.artifacts import DATASETS_DIR, EXAMPLES_MANIFEST, EXAMPLES_REF, TOKENIZER_FILE
from contracts.errors import UserError
from contracts.examples import (
    DatasetParameters,
    ExamplesManifest,
    ExamplesReference,
    manifest_json,
    parse_manifest,
)
from contracts.params import TokenizeParams

if TYPE_CHECKING:
    from components.step import Step

DEFAULT_SHARD_WINDOWS = 4096  # about 0.25 MB of GZIP per shard at seq_len 64, vocab 512
DEFAULT_EVAL_MAX_BYTES = TokenizeParams.eval_max_bytes
DEFAULT_UNIT_BYTES = TokenizeParams.unit_bytes
# Options of `run` that change nothing in the output, so not the dataset version.
NOT_VERSIONED = ("parts", "runner", "progress", "reporter", "work_dir")
# Options of `run` that the dataset's parameters hold (the tokenizer is held by its hash).
VERSIONED = (
    "vocab_size",
    "seq_len",
    "eval_fraction",
    "eval_max_bytes",
    "text_field",
    "unit_bytes",
    "shard_windows",
    "chunk_bytes",
    "tokenizer_sample_bytes",
)


def run(
    corpus: str,
    output_dir: str,
    *,
    vocab_size: int,
    seq_len: int,
    eval_fraction: float = 0.1,
    eval_max_bytes: int = DEFAULT_EVAL_MAX_BYTES,
    text_field: str = "text",
    unit_bytes: int = DEFAULT_UNIT_BYTES,
    tokenizer: str | None = None,
    shard_windows: int = DEFAULT_SHARD_WINDOWS,
    chunk_bytes: int = CHUNK_BYTES,
    tokenizer_sample_bytes: int = bpe.SAMPLE_BYTES,
    parts: int | None = None,
    runner: PartRunner | None = None,
    work_dir: str | None = None,
    progress: bool = True,
    expected_version: str | None = None,
    reporter: events.Progress | None = None,
) -> ExamplesManifest:
    """Tokenize `corpus` (files, a folder or a glob; local or gs://) into `output_dir`; return
    the manifest.

    Documents: a `.txt` file is one; a JSONL line or a Parquet row is one, its text the
    `text_field` string; any of them may be compressed (components/tokenize/readers.py says
    which suffixes). The tokenizer's EOS id follows every document, so a window that runs
    from one document into the next shows the model where one ended (as GPT-2 and nanoGPT
    pack). Empty documents are skipped and counted.

    Split (plan.py names it in the parameters): a corpus that is one `.txt` file keeps
    nanoGPT's tail split, its eval part starting at the first line start at or after byte
    round(size * (1 - eval_fraction)), or size - eval_max_bytes if later. Any other corpus is
    split by document, deterministically: a document is eval when a hash of its identity
    (its file's name relative to the corpus root and its index there) falls under
    eval_fraction, and, past `eval_max_bytes` of such text, only the ones with the lowest
    hashes are (`plan.eval_buckets`). A document is never cut between the splits.

    Tokenizer: a SentencePiece BPE model trained on at most `tokenizer_sample_bytes` of the
    train text, drawn evenly from every unit of the corpus (bpe.Sample), or the model at
    `tokenizer`, whose vocabulary must have `vocab_size` pieces and must reproduce text with
    newlines exactly.

    Work: the corpus's sources are grouped into units (plan.py); `parts` parts (default: one
    per CPU, at most one per unit) run on `runner` (default: processes on this machine) in
    two phases: check and sample every unit, then (once this process has trained the
    tokenizer) encode and pack every unit, each unit's shards published whole into the work
    folder `work_dir` (default: `.<name>.work` beside `output_dir`). A unit already done is
    not redone, so a step killed part way resumes when run again. This process then merges
    the units into `output_dir`, the manifest last. The output does not depend on `parts`,
    `runner` or where they ran: the same inputs give the same dataset version and
    byte-identical shards.

    Bad input raises UserError naming the file and the line or offset: bytes that are not
    UTF-8 in a text file, a JSONL line that is not JSON or lacks the string `text_field`, a
    truncated or mislabelled compressed file, a Parquet file without the column, an unknown
    suffix, a corpus whose documents are all empty. A `gs://` object replaced between the
    listing and the read is refused too.

    `dataset_version` is a sha256 over each source's content fingerprint and its path relative
    to the corpus root, and every parameter that changes the output (`parameters` in the
    manifest); `parts`, `runner`, `work_dir`, `progress` and `reporter` change neither it nor
    the bytes.

    Manifest counts per split: `tokens` (EOS included) and `chars` of the whole split, and the
    `windows` written (each unit's incomplete tail of a split is dropped).
    """
    _check_arguments(
        output_dir,
        eval_fraction,
        vocab_size=vocab_size,
        seq_len=seq_len,
        shard_windows=shard_windows,
        chunk_bytes=chunk_bytes,
        tokenizer_sample_bytes=tokenizer_sample_bytes,
        parts=parts,
    )
    report = Report(progress, reporter)
    given_options = locals()
    versioned = {name: given_options[name] for name in VERSIONED}
    sources, parameters, given, version = _versioned(corpus, tokenizer, versioned)
    method = parameters.split_method
    if expected_version and version != expected_version:
        # Checked before writing: a folder named for one version must never hold another.
        raise UserError(
            f"corpus {corpus!r} changed while the run was reading it; run again when it is stable"
        )
    units = group_units(sources, unit_bytes)
    plan = Plan(
        corpus=corpus,
        root=corpus_root(corpus, sources),
        split_method=method,
        units=units,
        parts=max(1, min(parts or default_workers(), len(units))),
        text_field=text_field,
        eval_fraction=eval_fraction,
        eval_max_bytes=eval_max_bytes,
        chunk_bytes=chunk_bytes,
        sample_bytes=0 if given else tokenizer_sample_bytes,
        sample_fraction=min(
            1.0, tokenizer_sample_bytes / max(train_bytes(sources, eval_fraction), 1)
        ),
        seq_len=seq_len,
        shard_windows=shard_windows,
    )
    work = work_dir or _work_beside(output_dir)
    _start_work(work, plan)
    report.line(
        f"{len(sources)} files in {len(units)} units, on {plan.parts} "
        + ("part" if plan.parts == 1 else "parts")
    )
    try:
        manifest = _tokenize(plan, work, runner, report, sources, parameters, given, output_dir)
    except UserError:
        # Bad input: the same input fails the same way, and fixed input is another version,
        # so nothing here is worth resuming. Any other failure keeps the units done.
        phases.remove_work(work)
        raise
    phases.remove_work(work)
    report.line(f"wrote {output_dir}: dataset_version {manifest.dataset_version[:12]}")
    return manifest


def _tokenize(
    plan: Plan,
    work: str,
    runner: PartRunner | None,
    report: Report,
    sources: Sequence[storage.FileInfo],
    parameters: DatasetParameters,
    given: bytes | None,
    output_dir: str,
) -> ExamplesManifest:
    """The phases, the tokenizer between them, and the merge (see `run`)."""
    corpus = plan.corpus
    if runner is None:
        from components.tokenize.job import LocalParts

        runner = phases.in_process if plan.parts == 1 else LocalParts()
    phases.run_phase(runner, PHASES[0], plan, work, report)
    counts, sample, histogram = phases.sampled(plan, work)
    documents = sum(c.documents for c in counts)
    empty = sum(c.empty for c in counts)
    formats: dict[str, int] = {}
    for c in counts:
        for kind, n in c.formats.items():
            formats[kind] = formats.get(kind, 0) + n
    report.line(_describe(documents, empty, formats))
    if plan.split_method == TAIL:
        check_not_blank(documents > empty, corpus)
    elif documents == empty:
        raise UserError(
            f"corpus {corpus!r}: all {documents:,} of its documents are empty; check that "
            f"tokenize.text_field ({plan.text_field!r}) names the field that holds the text"
        )
    model = _tokenizer(work, given, sample, parameters.vocab_size, corpus, report)
    del sample  # its memory is free again before encoding starts
    eval_max_bytes = plan.eval_max_bytes if plan.split_method == DOCUMENTS else 0
    _split_rule(work, model, histogram, eval_max_bytes)
    phases.run_phase(runner, PHASES[1], plan, work, report)
    with report.stage("write", sum(f.size for f in sources)):
        found = DocumentCounts({}, empty, formats)
        return _publish(plan, work, output_dir, corpus, sources, parameters, model, found)


def split_method(sources: Sequence[storage.FileInfo]) -> str:
    """TAIL for a corpus that is one plain `.txt` file, else DOCUMENTS (every file's format
    checked: an unknown suffix is refused here, naming the file)."""
    if len(sources) == 1 and sources[0].uri.lower().endswith(".txt"):
        return TAIL
    from components.tokenize.readers import check_formats

    check_formats(sources)
    return DOCUMENTS


def _describe(documents: int, empty: int, formats: dict[str, int]) -> str:
    kinds = ", ".join(f"{kind}: {n}" for kind, n in sorted(formats.items()))
    skipped = f"; {empty:,} empty, skipped" if empty else ""
    return f"read {documents:,} documents from files of format {kinds}{skipped}"


def _work_beside(output_dir: str) -> str:
    parent, _, name = output_dir.rstrip("/").rpartition("/")
    return f"{parent}/.{name}.work" if parent else f".{name}.work"


def _start_work(work: str, plan: Plan) -> None:
    """Write the plan into the work folder; a folder left by another plan (another version
    cannot share the name; a different `parts` can) starts again from nothing."""
    uri = storage.join(work, PLAN_FILE)
    if storage.has_content(uri):
        try:
            old = read_record(Plan, uri)
        except UserError:
            old = None
        if old == plan:
            return
        if isinstance(old, Plan) and dataclasses.replace(old, parts=plan.parts) == plan:
            write_record(uri, plan)  # units are the same: what they hold is still good
            return
        storage.delete_tree(work)
    write_record(uri, plan)


def _tokenizer(
    work: str, given: bytes | None, sample: str, vocab_size: int, corpus: str, report: Report
) -> bytes:
    """The tokenizer phase 2 encodes with: the one a run before trained for this work, the
    given one, or one trained on the sample now."""
    uri = storage.join(work, WORK_TOKENIZER)
    if storage.has_content(uri):
        return storage.read_bytes(uri)
    model = given or bpe.train(sample, vocab_size, corpus, report.line)
    storage.write_bytes(uri, model)
    return model


def _split_rule(work: str, model: bytes, histogram: Any, eval_max_bytes: int) -> SplitRule:
    eos = spm.SentencePieceProcessor(model_proto=model).eos_id()
    if eos < 0:
        raise UserError(
            "the tokenizer has no EOS piece (eos_id -1), which tokenize writes after every "
            "document; train it with SENTENCEPIECE_TRAINER_OPTIONS (eos_id 2) or omit it"
        )
    rule = SplitRule(eval_buckets(histogram, eval_max_bytes), eos)
    write_record(storage.join(work, SPLIT_FILE), rule)
    return rule


def _publish(
    plan: Plan,
    work: str,
    output_dir: str,
    corpus: str,
    sources: Sequence[storage.FileInfo],
    parameters: DatasetParameters,
    model: bytes,
    counts: DocumentCounts,
) -> ExamplesManifest:
    """Merge the encoded units into `output_dir`, the manifest last."""
    stats, documents, include = phases.merge(plan, work, corpus)
    with storage.atomic_dir(output_dir, ready=EXAMPLES_MANIFEST, include=include) as tmp:
        phases.write_merged(plan, work, tmp)
        (tmp / TOKENIZER_FILE).write_bytes(model)
        counts = dataclasses.replace(counts, documents=documents)
        trained = parameters.given_tokenizer_sha256 is None
        manifest = build_manifest(corpus, sources, parameters, stats, model, trained, counts)
        (tmp / EXAMPLES_MANIFEST).write_text(manifest_json(manifest), encoding="utf-8")
    return manifest


@dataclass(frozen=True)
class Dataset:
    """Examples in the content-addressed store: `<datasets_root>/<dataset_version>/`."""

    uri: str  # the Examples folder
    manifest: ExamplesManifest  # its manifest.json, with `sources` as listed by this run
    reused: bool  # True when the folder already existed and nothing was tokenized
    damage: str = ""  # what was wrong with a stored folder this run tokenized again; "": none


def execute(
    step: Step, *, corpus: str, config: dict, tokenize: dict, artifact_root: str, examples: Any
) -> tuple[str, str]:
    """The tokenize step: the Examples of `corpus` in `<artifact_root>/datasets/`, reused when
    that version exists; returns their URI and dataset version (components/step.py runs it).

    The KFP artifact `examples` stays in the run's folder (KFP 2.5.0's launcher fails a task
    whose output URI leaves it) and points at the content-addressed Examples, which lineage
    records as the Examples.
    """
    from components import kfp_metadata, lineage
    from trainer.config import config_from_dict

    cfg = config_from_dict(config)
    params = TokenizeParams.from_dict(tokenize)
    step.check_shared(artifact_root, "artifact_root")
    step.check_shared(examples.uri, "the pipeline root")
    step.rec.set(vocab_size=cfg.model.vocab_size, seq_len=cfg.model.seq_len)
    dataset = run_content_addressed(
        corpus,
        storage.join(artifact_root, DATASETS_DIR),
        vocab_size=cfg.model.vocab_size,
        seq_len=cfg.model.seq_len,
        eval_fraction=params.eval_fraction,
        eval_max_bytes=params.eval_max_bytes,
        text_field=params.text_field,
        unit_bytes=params.unit_bytes,
        tokenizer=params.tokenizer or None,
        parts=params.parts or None,
        runner=part_runner(params, step),
        reporter=step.progress,
    )
    manifest = dataset.manifest
    step.rec.set(reused=int(dataset.reused))
    props = artifact_properties(manifest)
    write_reference(examples.path, dataset)
    examples.metadata.update(kfp_metadata.recordable({**props, "examples_uri": dataset.uri}))
    step.rec.output("examples", lineage.EXAMPLES_TYPE, dataset.uri, props)
    step.rec.dataset_version = manifest.dataset_version
    return dataset.uri, manifest.dataset_version


def dataset_version_of(
    corpus: str,
    *,
    vocab_size: int,
    seq_len: int,
    eval_fraction: float = 0.1,
    eval_max_bytes: int = DEFAULT_EVAL_MAX_BYTES,
    text_field: str = "text",
    unit_bytes: int = DEFAULT_UNIT_BYTES,
    tokenizer: str | None = None,
    shard_windows: int = DEFAULT_SHARD_WINDOWS,
    chunk_bytes: int = CHUNK_BYTES,
    tokenizer_sample_bytes: int = bpe.SAMPLE_BYTES,
) -> tuple[str, list[storage.FileInfo]]:
    """The dataset version `run` would produce, from fingerprints alone (nothing is tokenized)."""
    given_options = locals()
    sources, _, _, version = _versioned(
        corpus, tokenizer, {name: given_options[name] for name in VERSIONED}
    )
    return version, sources


def _versioned(
    corpus: str, tokenizer: str | None, versioned: dict[str, Any]
) -> tuple[list[storage.FileInfo], DatasetParameters, bytes | None, str]:
    """The corpus's sources, every parameter that changes the output (`versioned`: `run`'s
    VERSIONED arguments; the split method follows from the sources, the tokenizer's hash
    from its bytes), the given tokenizer's bytes (None: one is trained), and the version."""
    sources = list_sources(corpus)
    given = bpe.read_given(tokenizer, versioned["vocab_size"]) if tokenizer else None
    parameters = dataset_parameters(given=given, split_method=split_method(sources), **versioned)
    return sources, parameters, given, dataset_version(corpus, sources, parameters)


def run_content_addressed(corpus: str, datasets_root: str, **options: Any) -> Dataset:
    """Tokenize into `<datasets_root>/<dataset_version>/`, or reuse that folder if complete.

    The version is known from the sources' fingerprints before any work, so unchanged data is
    never tokenized twice, and every run on the same data names the same Examples URI: what
    lets KFP's cache key for train follow the data (docs/lineage.md). A folder is complete
    once its manifest.json exists: atomic_dir writes the manifest last. Runs on the same data
    at the same time tokenize it once: one holds the version's lease
    (`<datasets_root>/.<version>.lease`), the others wait for its manifest. A complete folder
    that a shard is missing from, or of another size or crc32c than its manifest records, is
    not reused: the lease's holder says so, discards it and tokenizes it again (reuse.py).
    """
    version, sources = dataset_version_of(
        corpus, **{k: v for k, v in options.items() if k not in NOT_VERSIONED}
    )
    uri = storage.join(datasets_root, version)
    manifest_uri = storage.join(uri, EXAMPLES_MANIFEST)
    # A killed run's finished units are here, for the next run of the same version to resume.
    options.setdefault("work_dir", storage.join(datasets_root, f".{version}.work"))

    def stored() -> Dataset:
        manifest = parse_manifest(storage.read_bytes(manifest_uri), manifest_uri)
        reporter = options.get("reporter")
        if reporter is not None:
            reporter.note(f"reusing dataset {version[:12]}: nothing to tokenize")
            total = sum(f.size for f in sources)
            reporter.update(total, total, "bytes", final=True, stage="reused")
        if manifest.dataset_version != version:
            raise UserError(
                f"dataset folder {uri} holds version {manifest.dataset_version!r}, not "
                "the one it is named for; remove it so that it is written again"
            )
        listed = tuple(source_entry(f) for f in sources)
        return Dataset(uri, dataclasses.replace(manifest, sources=listed), True)

    def whole() -> bool:  # complete, and nothing of it missing or cut (reuse.py)
        return storage.has_content(manifest_uri) and reuse.damage(uri, manifest_uri) is None

    lease = storage.join(datasets_root, f".{version}.lease")
    damage = ""
    with storage.hold_or_wait(lease, done=whole) as holder:
        if not holder:  # stored whole, or a concurrent run tokenized it while we waited
            return stored()
        # A run killed while copying this version into place on gs:// left its staging
        # upload; finish it (or clean up an abandoned one) so the folder is not "taken".
        storage.finish_publishes(datasets_root, ready=EXAMPLES_MANIFEST)
        if storage.has_content(manifest_uri):
            damage = reuse.damage(uri, manifest_uri) or ""
            if not damage:
                return stored()
            _say(options, f"dataset {version[:12]} is damaged ({damage}): tokenizing it again")
            reuse.discard(uri, manifest_uri)
        try:
            manifest = run(corpus, uri, expected_version=version, **options)
        except FileExistsError:
            # Our heartbeat stalled past the limit while we worked (a paused node, a storage
            # stall), a waiter took the lease over and published this version first: the
            # same data's dataset, which the run reads as a concurrent run's.
            if not storage.has_content(manifest_uri):
                raise
            return stored()
    return Dataset(uri, manifest, False, damage)


def _say(options: dict[str, Any], message: str) -> None:
    """A line for the step's log (always: it explains a tokenize nobody expected) and the run
    view."""
    print(f"tokenize: {message}", file=sys.stderr, flush=True)
    reporter = options.get("reporter")
    if reporter is not None:
        reporter.note(message)


def write_reference(folder: str, dataset: Dataset) -> None:
    """Write, into a run's own Examples artifact folder, where the Examples really are."""
    reference = ExamplesReference(dataset.uri, dataset.manifest.dataset_version, dataset.manifest)
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    (path / EXAMPLES_REF).write_text(manifest_json(reference), encoding="utf-8")


def artifact_properties(manifest: ExamplesManifest) -> dict[str, Any]:
    """Flat scalar properties of the Examples artifact for KFP and ML Metadata (TFX names).

    `dataset_version`, per-split and total `windows` and `tokens`, and `sources` (JSON).
    """
    props: dict[str, Any] = {
        "dataset_version": manifest.dataset_version,
        "split_names": json.dumps(list(manifest.splits)),
        "seq_len": manifest.seq_len,
        "vocab_size": manifest.vocab_size,
        "eval_fraction": manifest.eval_fraction,
        "tokenizer_sha256": manifest.tokenizer.sha256,
    }
    for split, stats in manifest.splits.items():
        for key in ("windows", "tokens", "chars"):
            props[f"{split}_{key}"] = getattr(stats, key)
    for key in ("windows", "tokens"):
        props[key] = manifest.total(key)
    # Each source with its content fingerprint (size + sha256 locally; size, generation,
    # crc32c and md5 on GCS), so `gptpipe reproduce` can tell whether the data is still there.
    props["sources"] = json.dumps([records.to_dict(s) for s in manifest.sources], sort_keys=True)
    return props


# ---- checks ------------------------------------------------------------------------------


def part_runner(params: TokenizeParams, step: Step) -> PartRunner | None:
    """Where the step's parts run: `local` processes (None: run's default), or an Indexed Job."""
    if params.launcher == "local":
        return None
    from components.tokenize.job import JobParts

    return JobParts(params, step)


def _check_arguments(output_dir: str, eval_fraction: float, **positive: int | None) -> None:
    """Refuse an eval_fraction out of range, a `positive` value below 1 (None: its default),
    and an output folder that holds something."""
    if not 0.0 < eval_fraction <= 0.5:
        raise UserError(f"eval_fraction must be in (0, 0.5], got {eval_fraction}; 0.1 is usual")
    for name, value in positive.items():
        if value is not None and value < 1:
            raise UserError(f"{name} must be a positive integer, got {value}")
    if storage.has_content(output_dir):
        raise UserError(
            f"output folder {output_dir!r} already exists and is not empty; "
            "choose a new folder or remove it"
        )
