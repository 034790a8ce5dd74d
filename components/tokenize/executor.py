"""Tokenize: turn a UTF-8 text corpus into the Examples artifact (docs/design.md).

    corpus ─ read (checks, tokenizer sample) ─ SentencePiece BPE (on the sample)
           ─ read again, in chunks ─ encode (worker processes) ─ windows ─ GZIP TFRecord shards

Both reads stream the corpus in chunks of whole lines (corpus.py), and shards are written as
they fill (shards.py), so memory stays flat whatever the corpus's size; the first read checks
every byte before any work, and gives the tokenizer a bounded sample (bpe.Sample). The whole
output is written in a temporary sibling folder and renamed into place at the end, so a
failure leaves nothing at `output_dir`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components import overlap, storage
from components.tokenize import bpe
from components.tokenize.corpus import (
    CHUNK_BYTES,
    Chunk,
    check_not_blank,
    list_sources,
    read_chunks,
    train_bytes,
)
from components.tokenize.dataset import (
    build_manifest,
    dataset_parameters,
    dataset_version,
    source_entry,
)
from components.tokenize.encode import Encoder, default_workers
from components.tokenize.progress import Report
from components.tokenize.shards import SplitWriter
from contracts import progress as events
from contracts import records
from contracts.artifacts import (
    DATASETS_DIR,
    EVAL_TEXT,
    EXAMPLES_MANIFEST,
    EXAMPLES_REF,
    SPLITS,
    TOKENIZER_FILE,
    TRAIN_TEXT_SKETCH,
)
from contracts.errors import UserError
from contracts.examples import (
    DatasetParameters,
    ExamplesManifest,
    ExamplesReference,
    SplitStats,
    manifest_json,
    parse_manifest,
)
from contracts.params import TokenizeParams

if TYPE_CHECKING:
    from components.step import Step

DEFAULT_SHARD_WINDOWS = 4096  # about 0.25 MB of GZIP per shard at seq_len 64, vocab 512
# A worker process costs about as much to start as encoding 2 MB, so a corpus gets one for
# every CHUNKS_PER_WORKER chunks at most; a corpus of fewer is encoded in this process.
CHUNKS_PER_WORKER = 2
# Options of `run` that change nothing in the output, so not the dataset version.
NOT_VERSIONED = ("workers", "progress", "reporter")


def run(
    corpus: str,
    output_dir: str,
    *,
    vocab_size: int,
    seq_len: int,
    eval_fraction: float = 0.1,
    tokenizer: str | None = None,
    shard_windows: int = DEFAULT_SHARD_WINDOWS,
    chunk_bytes: int = CHUNK_BYTES,
    tokenizer_sample_bytes: int = bpe.SAMPLE_BYTES,
    workers: int | None = None,
    progress: bool = True,
    expected_version: str | None = None,
    reporter: events.Progress | None = None,
) -> ExamplesManifest:
    """Tokenize `corpus` (a UTF-8 text file, folder or glob) into `output_dir`; return the manifest.

    Split: each file's eval part starts at the first line start at or after its byte
    round(size * (1 - eval_fraction)); the rest is train, as nanoGPT splits. Tail splits
    keep eval text contiguous, so eval windows span real context, the demo split matches
    nanoGPT's Shakespeare split, and every file contributes to both splits however small it
    is (a hashed-block split can leave a small corpus with no eval text). Appending text to a
    file moves its cut; the dataset version changes with any byte anyway.

    Tokenizer: a SentencePiece BPE model trained on the train split only (so eval text is
    unseen), with SENTENCEPIECE_TRAINER_OPTIONS, on at most `tokenizer_sample_bytes` of it
    taken evenly from every `chunk_bytes` chunk (all of it when it fits: bpe.Sample); or the
    model at `tokenizer`, whose vocabulary must have `vocab_size` pieces and must reproduce
    text with newlines exactly.

    Bytes that are not UTF-8 raise UserError naming the file and byte offset: replacing them
    would silently train on U+FFFD and change the eval text's character count. A binary file
    and a line over `corpus.MAX_LINE_BYTES` are refused while they are read, before decoding.

    `corpus` and `output_dir` may be local or `gs://` (a prefix, an object or a glob such as
    `gs://bucket/texts/*.txt`). Objects are listed with GCS's own fingerprints, then streamed;
    an object replaced between the listing and the read raises a UserError naming it.

    Encoding runs on `workers` processes (default: every CPU this process may use; a small
    corpus is encoded in this process, see CHUNKS_PER_WORKER), at most one chunk each in
    flight, the ids taken back in the corpus's order.

    `dataset_version` is a sha256 over each source's content fingerprint and its path relative
    to the corpus root (the folder given, a file's folder or a glob's fixed part, so moving or
    renaming that folder does not change it) and every parameter that changes the output
    (`parameters` in the manifest). Same inputs give the same version and byte-identical
    shards; `workers`, `progress` and `reporter` (where progress events go, counted in bytes
    of the corpus per stage: read, encode, write) change neither. The fingerprint is the
    sha256 of a local file, and for a `gs://` object its crc32c, md5 and size as GCS lists
    them (nothing is downloaded to compute it). The version follows the bytes, not the object
    generation: re-uploading the same bytes makes a new generation but the same dataset, so it
    keeps its version (the manifest's `sources` still record each generation that was read,
    for lineage).

    Manifest counts per split: `tokens` and `chars` of the whole split, and the `windows`
    written (`windows * seq_len + 1 <= tokens`: the incomplete tail is dropped).
    """
    _check_arguments(
        output_dir,
        eval_fraction,
        vocab_size=vocab_size,
        seq_len=seq_len,
        shard_windows=shard_windows,
        chunk_bytes=chunk_bytes,
        tokenizer_sample_bytes=tokenizer_sample_bytes,
        workers=workers,
    )
    report = Report(progress, reporter)
    sources = list_sources(corpus)
    total = sum(f.size for f in sources)
    sample = (
        None
        if tokenizer
        else bpe.Sample(tokenizer_sample_bytes, train_bytes(sources, eval_fraction))
    )
    sketch = overlap.Sketch()
    chunks = _check_and_sample(
        corpus, sources, eval_fraction, chunk_bytes, sample, sketch, report, total
    )
    parameters, given = _parameters(
        tokenizer,
        vocab_size=vocab_size,
        seq_len=seq_len,
        eval_fraction=eval_fraction,
        shard_windows=shard_windows,
        chunk_bytes=chunk_bytes,
        tokenizer_sample_bytes=tokenizer_sample_bytes,
    )
    if expected_version and dataset_version(corpus, sources, parameters) != expected_version:
        # Checked before writing: a folder named for one version must never hold another.
        raise UserError(
            f"corpus {corpus!r} changed while the run was reading it; run again when it is stable"
        )
    with storage.atomic_dir(output_dir, ready=EXAMPLES_MANIFEST) as tmp:
        model = given or _train(sample, vocab_size, corpus, report)
        sample = None  # the sample's memory is free again before encoding starts
        (tmp / TOKENIZER_FILE).write_bytes(model)
        (tmp / TRAIN_TEXT_SKETCH).write_bytes(sketch.to_bytes())
        processes = _processes(workers, chunks)
        report.line(
            f"encoding {chunks} chunks "
            + (f"on {processes} worker processes" if processes > 1 else "in this process")
        )
        stream = (c for source in sources for c in read_chunks(source, eval_fraction, chunk_bytes))
        stats = _Splits(tmp, seq_len, shard_windows).write(
            stream, Encoder(model, processes), report, total, corpus
        )
        manifest = build_manifest(corpus, sources, parameters, stats, model, trained=given is None)
        (tmp / EXAMPLES_MANIFEST).write_text(manifest_json(manifest), encoding="utf-8")
    report.line(f"wrote {output_dir}: dataset_version {manifest.dataset_version[:12]}")
    return manifest


@dataclass(frozen=True)
class Dataset:
    """Examples in the content-addressed store: `<datasets_root>/<dataset_version>/`."""

    uri: str  # the Examples folder
    manifest: ExamplesManifest  # its manifest.json, with `sources` as listed by this run
    reused: bool  # True when the folder already existed and nothing was tokenized


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
        tokenizer=params.tokenizer or None,
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
    tokenizer: str | None = None,
    shard_windows: int = DEFAULT_SHARD_WINDOWS,
    chunk_bytes: int = CHUNK_BYTES,
    tokenizer_sample_bytes: int = bpe.SAMPLE_BYTES,
) -> tuple[str, list[storage.FileInfo]]:
    """The dataset version `run` would produce, from fingerprints alone (nothing is tokenized)."""
    sources = list_sources(corpus)
    parameters, _ = _parameters(
        tokenizer,
        vocab_size=vocab_size,
        seq_len=seq_len,
        eval_fraction=eval_fraction,
        shard_windows=shard_windows,
        chunk_bytes=chunk_bytes,
        tokenizer_sample_bytes=tokenizer_sample_bytes,
    )
    return dataset_version(corpus, sources, parameters), sources


def _parameters(tokenizer: str | None, **versioned: Any) -> tuple[DatasetParameters, Any]:
    """Every parameter that changes the output (`versioned`: dataset_parameters' arguments but
    the tokenizer), and the given tokenizer's bytes (None: one is trained)."""
    given = bpe.read_given(tokenizer, versioned["vocab_size"]) if tokenizer else None
    return dataset_parameters(given=given, **versioned), given


def run_content_addressed(corpus: str, datasets_root: str, **options: Any) -> Dataset:
    """Tokenize into `<datasets_root>/<dataset_version>/`, or reuse that folder if complete.

    The version is known from the sources' fingerprints before any work, so unchanged data is
    never tokenized twice, and every run on the same data names the same Examples URI: what
    lets KFP's cache key for train follow the data (docs/lineage.md). A folder is complete
    once its manifest.json exists: atomic_dir writes the manifest last. Runs on the same data
    at the same time tokenize it once: one holds the version's lease
    (`<datasets_root>/.<version>.lease`), the others wait for its manifest.
    """
    version, sources = dataset_version_of(
        corpus, **{k: v for k, v in options.items() if k not in NOT_VERSIONED}
    )
    uri = storage.join(datasets_root, version)
    manifest_uri = storage.join(uri, EXAMPLES_MANIFEST)

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

    lease = storage.join(datasets_root, f".{version}.lease")
    with storage.hold_or_wait(lease, done=lambda: storage.has_content(manifest_uri)) as holder:
        if not holder:  # a concurrent run on the same data tokenized it while we waited
            return stored()
        # A run killed while copying this version into place on gs:// left its staging
        # upload; finish it (or clean up an abandoned one) so the folder is not "taken".
        storage.finish_publishes(datasets_root, ready=EXAMPLES_MANIFEST)
        if storage.has_content(manifest_uri):
            return stored()
        try:
            manifest = run(corpus, uri, expected_version=version, **options)
        except FileExistsError:
            # Our heartbeat stalled past the limit while we worked (a paused node, a storage
            # stall), a waiter took the lease over and published this version first: the
            # same data's dataset, which the run reads as a concurrent run's.
            if not storage.has_content(manifest_uri):
                raise
            return stored()
    return Dataset(uri, manifest, False)


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


# ---- the two reads ------------------------------------------------------------------------


def _check_and_sample(
    corpus: str,
    sources: Sequence[storage.FileInfo],
    eval_fraction: float,
    chunk_bytes: int,
    sample: bpe.Sample | None,
    sketch: overlap.Sketch,
    report: Report,
    total: int,
) -> int:
    """Read every byte once before any work, so that every check (binary, long lines, UTF-8,
    edits, blank) fails fast; take the tokenizer's sample and sketch the train text (what
    evaluate checks eval text against, components/overlap.py). Returns how many chunks there
    are."""
    chunks, done, has_text = 0, 0, False
    with report.stage("read", total) as advance:
        for source in sources:
            for chunk in read_chunks(source, eval_fraction, chunk_bytes):
                chunks += 1
                has_text = has_text or not chunk.text.isspace()
                if chunk.split == SPLITS[0]:
                    sketch.add(chunk.text.encode("utf-8"))
                    if sample is not None:
                        sample.add(chunk.text)
                done += chunk.size
                advance(done)
        check_not_blank(has_text, corpus)
    return chunks


def _train(sample: bpe.Sample | None, vocab_size: int, corpus: str, report: Report) -> bytes:
    assert sample is not None  # taken whenever no tokenizer is given
    if sample.fraction < 1.0:
        report.line(f"the tokenizer learns from {sample.fraction:.1%} of each train chunk")
    return bpe.train(sample.pieces, vocab_size, corpus, report.line)


def _processes(workers: int | None, chunks: int) -> int:
    """How many processes encode: `workers` (default: every CPU), at most one for every
    CHUNKS_PER_WORKER chunks; 1 means this process."""
    return max(1, min(workers or default_workers(), chunks // CHUNKS_PER_WORKER))


class _Splits:
    """Both splits' writers, and the eval text, fed by the encoded chunks in corpus order."""

    def __init__(self, folder: Path, seq_len: int, shard_windows: int) -> None:
        self.folder = folder
        self.seq_len = seq_len
        self.writers = {s: SplitWriter(folder, s, seq_len, shard_windows) for s in SPLITS}
        self.chars = dict.fromkeys(SPLITS, 0)

    def write(
        self, chunks: Iterator[Chunk], encoder: Encoder, report: Report, total: int, corpus: str
    ) -> dict[str, SplitStats]:
        """Encode and write every chunk; the manifest's counts per split."""
        (self.folder / EVAL_TEXT).parent.mkdir()
        try:
            with (
                (self.folder / EVAL_TEXT).open("w", encoding="utf-8", newline="") as eval_text,
                report.stage("encode", total) as advance,
                encoder,  # its workers' start is part of the stage
            ):
                done = 0
                for chunk, ids in encoder.map(chunks, lambda c: c.text):
                    self.writers[chunk.split].add(ids)
                    self.chars[chunk.split] += len(chunk.text)
                    if chunk.split == SPLITS[1]:
                        eval_text.write(chunk.text)
                    done += chunk.size
                    advance(done)
            for split, writer in self.writers.items():
                _check_one_window(corpus, split, writer.tokens, self.seq_len)
            with report.stage("write", total):
                return {
                    split: writer.finish(self.chars[split])
                    for split, writer in self.writers.items()
                }
        except BaseException:
            for writer in self.writers.values():
                writer.abort()
            raise


# ---- checks ------------------------------------------------------------------------------


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


def _check_one_window(corpus: str, split: str, tokens: int, seq_len: int) -> None:
    if tokens < seq_len + 1:
        larger_split = ", or a larger eval_fraction" if split == "eval" else ""
        fits = f"seq_len <= {tokens - 1}" if tokens > 1 else "a smaller seq_len"
        raise UserError(
            f"corpus {corpus!r}: the {split} split has {tokens} tokens, fewer than one window of "
            f"seq_len + 1 = {seq_len + 1}; use {fits}, more data{larger_split}"
        )
