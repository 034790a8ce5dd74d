"""Tokenize: turn a UTF-8 text corpus into the Examples artifact (docs/design.md).

    corpus ─ read (strict UTF-8) ─ split (tail of each file) ─ SentencePiece BPE (train split)
           ─ encode (threads) ─ windows of seq_len+1, stride seq_len ─ GZIP TFRecord shards

The whole output is written in a temporary sibling folder and renamed into place at the end,
so a failure leaves nothing at `output_dir`. The corpus is held in memory: this step is sized
for corpora of up to a few hundred MB; a larger one would stream files through the same steps.
"""

from __future__ import annotations

import errno
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from components import storage
from components.tokenize import bpe
from components.tokenize.corpus import (
    build_manifest,
    dataset_parameters,
    dataset_version,
    list_sources,
    read_utf8,
    source_entry,
    split_corpus,
)
from components.tokenize.progress import Report
from contracts import progress as events
from contracts.artifacts import (
    EVAL_TEXT,
    EXAMPLES_MANIFEST,
    EXAMPLES_REF,
    TOKENIZER_FILE,
    shard_file,
)
from contracts.errors import UserError

DEFAULT_SHARD_WINDOWS = 4096  # about 0.25 MB of GZIP per shard at seq_len 64, vocab 512


def run(
    corpus: str,
    output_dir: str,
    *,
    vocab_size: int,
    seq_len: int,
    eval_fraction: float = 0.1,
    tokenizer: str | None = None,
    shard_windows: int = DEFAULT_SHARD_WINDOWS,
    workers: int | None = None,
    progress: bool = True,
    expected_version: str | None = None,
    reporter: events.Progress | None = None,
) -> dict[str, Any]:
    """Tokenize `corpus` (a UTF-8 text file, folder or glob) into `output_dir`; return the manifest.

    Split: the last `eval_fraction` of each file (cut at the nearest line start) is eval, the
    rest train, as nanoGPT does. Tail splits keep eval text contiguous, so eval windows span
    real context, the demo split matches nanoGPT's Shakespeare split, and every file
    contributes to both splits however small it is (a hashed-block split can leave a small
    corpus with no eval text). Appending text to a file moves its cut;
    the dataset version changes with any byte anyway.

    Tokenizer: a SentencePiece BPE model trained on the train split only (so eval text is
    unseen), with SENTENCEPIECE_TRAINER_OPTIONS; or the model at `tokenizer`, whose vocabulary
    must have `vocab_size` pieces and must reproduce text with newlines exactly.

    Bytes that are not UTF-8 raise UserError naming the file and byte offset: replacing them
    would silently train on U+FFFD and change the eval text's character count. A binary file
    and a line over `corpus.MAX_LINE_BYTES` are refused while they are read, before decoding.

    `corpus` and `output_dir` may be local or `gs://` (a prefix, an object or a glob such as
    `gs://bucket/texts/*.txt`). Objects are listed with GCS's own fingerprints, then streamed;
    an object replaced between the listing and the read raises a UserError naming it.

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
    _check_arguments(output_dir, vocab_size, seq_len, eval_fraction, shard_windows, workers)
    report = Report(progress, reporter)
    sources = list_sources(corpus)
    total = sum(f.size for f in sources)
    splits = split_corpus(_read_all(sources, report, total), eval_fraction, corpus)
    shares = _byte_shares(splits, total)
    given = bpe.read_given(tokenizer, vocab_size) if tokenizer else None
    parameters = dataset_parameters(vocab_size, seq_len, eval_fraction, shard_windows, given)
    if expected_version and dataset_version(corpus, sources, parameters) != expected_version:
        # Checked before writing: a folder named for one version must never hold another.
        raise UserError(
            f"corpus {corpus!r} changed while the run was reading it; run again when it is stable"
        )
    with storage.atomic_dir(output_dir, ready=EXAMPLES_MANIFEST) as tmp:
        model = given or bpe.train(splits["train"], vocab_size, corpus, report.line)
        (tmp / TOKENIZER_FILE).write_bytes(model)
        ids = {}
        for split, text in splits.items():
            with report.task(f"encode {split}") as advance:
                advance = _in_bytes(advance, report, "encode", shares[split], total)
                ids[split] = bpe.encode(model, text, workers or os.cpu_count() or 1, advance)
            _check_one_window(corpus, split, len(ids[split]), seq_len)
        stats = {}
        for split, text in splits.items():
            with report.task(f"write {split}") as advance:
                advance = _in_bytes(advance, report, "write", shares[split], total)
                shards = _write_shards(tmp, split, ids[split], seq_len, shard_windows, advance)
            stats[split] = {**shards, "tokens": len(ids[split]), "chars": len(text)}
        (tmp / EVAL_TEXT).parent.mkdir()
        (tmp / EVAL_TEXT).write_text(splits["eval"], encoding="utf-8", newline="")
        manifest = build_manifest(corpus, sources, parameters, stats, model, trained=given is None)
        (tmp / EXAMPLES_MANIFEST).write_text(
            json.dumps(manifest, indent=2) + "\n", encoding="utf-8"
        )
    report.line(f"wrote {output_dir}: dataset_version {manifest['dataset_version'][:12]}")
    return manifest


@dataclass(frozen=True)
class Dataset:
    """Examples in the content-addressed store: `<datasets_root>/<dataset_version>/`."""

    uri: str  # the Examples folder
    manifest: dict[str, Any]  # its manifest.json, with `sources` as listed by this run
    reused: bool  # True when the folder already existed and nothing was tokenized


def dataset_version_of(
    corpus: str,
    *,
    vocab_size: int,
    seq_len: int,
    eval_fraction: float = 0.1,
    tokenizer: str | None = None,
    shard_windows: int = DEFAULT_SHARD_WINDOWS,
) -> tuple[str, list[storage.FileInfo]]:
    """The dataset version `run` would produce, from fingerprints alone (nothing is tokenized)."""
    sources = list_sources(corpus)
    given = bpe.read_given(tokenizer, vocab_size) if tokenizer else None
    parameters = dataset_parameters(vocab_size, seq_len, eval_fraction, shard_windows, given)
    return dataset_version(corpus, sources, parameters), sources


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
        corpus,
        **{k: v for k, v in options.items() if k not in ("workers", "progress", "reporter")},
    )
    uri = storage.join(datasets_root, version)
    manifest_uri = storage.join(uri, EXAMPLES_MANIFEST)

    def stored() -> Dataset:
        manifest = json.loads(storage.read_bytes(manifest_uri))
        reporter = options.get("reporter")
        if reporter is not None:
            reporter.note(f"reusing dataset {version[:12]}: nothing to tokenize")
            total = sum(f.size for f in sources)
            reporter.update(total, total, "bytes", final=True, stage="reused")
        if manifest.get("dataset_version") != version:
            raise UserError(
                f"dataset folder {uri} holds version {manifest.get('dataset_version')!r}, not "
                "the one it is named for; remove it so that it is written again"
            )
        return Dataset(uri, {**manifest, "sources": [source_entry(f) for f in sources]}, True)

    lease = storage.join(datasets_root, f".{version}.lease")
    with storage.hold_or_wait(lease, done=lambda: storage.has_content(manifest_uri)) as holder:
        if not holder:  # a concurrent run on the same data tokenized it while we waited
            return stored()
        # A run killed while copying this version into place on gs:// left its staging
        # upload; finish it (or clean up an abandoned one) so the folder is not "taken".
        storage.finish_publishes(datasets_root, ready=EXAMPLES_MANIFEST)
        if storage.has_content(manifest_uri):
            return stored()
        manifest = run(corpus, uri, expected_version=version, **options)
    return Dataset(uri, manifest, False)


def write_reference(folder: str, dataset: Dataset) -> None:
    """Write, into a run's own Examples artifact folder, where the Examples really are."""
    reference = {
        "uri": dataset.uri,
        "dataset_version": dataset.manifest["dataset_version"],
        "manifest": dataset.manifest,
    }
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    (path / EXAMPLES_REF).write_text(json.dumps(reference, indent=2) + "\n", encoding="utf-8")


def artifact_properties(manifest: dict[str, Any]) -> dict[str, Any]:
    """Flat scalar properties of the Examples artifact for KFP and ML Metadata (TFX names).

    `dataset_version`, per-split and total `windows` and `tokens`, and `sources` (JSON).
    """
    props: dict[str, Any] = {
        "dataset_version": manifest["dataset_version"],
        "split_names": json.dumps(list(manifest["splits"])),
        "seq_len": manifest["seq_len"],
        "vocab_size": manifest["vocab_size"],
        "eval_fraction": manifest["eval_fraction"],
        "tokenizer_sha256": manifest["tokenizer"]["sha256"],
    }
    for split, stats in manifest["splits"].items():
        for key in ("windows", "tokens", "chars"):
            props[f"{split}_{key}"] = stats[key]
    for key in ("windows", "tokens"):
        props[key] = sum(stats[key] for stats in manifest["splits"].values())
    # Each source with its content fingerprint (size + sha256 locally; size, generation,
    # crc32c and md5 on GCS), so `gptpipe reproduce` can tell whether the data is still there.
    props["sources"] = json.dumps(manifest["sources"], sort_keys=True)
    return props


# ---- progress in bytes of the corpus ----------------------------------------------------


def _read_all(sources: list[storage.FileInfo], report: Report, total: int) -> list[str]:
    """Each source's text, in order, reporting the bytes read so far."""
    texts, done = [], 0
    for i, source in enumerate(sources):
        texts.append(read_utf8(source))
        done += source.size
        report.corpus_bytes(done, total, "read", final=i == len(sources) - 1)
    return texts


def _byte_shares(splits: dict[str, str], total: int) -> dict[str, tuple[float, float]]:
    """Per split, (bytes of the splits before it, its own bytes), in corpus bytes.

    A split's share of the corpus's bytes is taken as its share of the characters, which is
    exact for ASCII text and close for any, without encoding the text again to count.
    """
    chars = sum(len(text) for text in splits.values()) or 1
    shares, before = {}, 0.0
    for split, text in splits.items():
        size = total * len(text) / chars
        shares[split] = (before, size)
        before += size
    return shares


def _in_bytes(
    advance: Callable[[int, int], None],
    report: Report,
    stage: str,
    share: tuple[float, float],
    total: int,
) -> Callable[[int, int], None]:
    """`advance(done, count)` of one split's units, also reported as corpus bytes of `stage`."""
    before, size = share

    def both(done: int, count: int) -> None:
        advance(done, count)
        report.corpus_bytes(before + size * done / max(count, 1), total, stage, final=done >= count)

    return both


# ---- checks and shards --------------------------------------------------------------------


def _check_arguments(
    output_dir: str,
    vocab_size: int,
    seq_len: int,
    eval_fraction: float,
    shard_windows: int,
    workers: int | None,
) -> None:
    if not 0.0 < eval_fraction <= 0.5:
        raise UserError(f"eval_fraction must be in (0, 0.5], got {eval_fraction}; 0.1 is usual")
    for name, value in (
        ("vocab_size", vocab_size),
        ("seq_len", seq_len),
        ("shard_windows", shard_windows),
        ("workers", 1 if workers is None else workers),
    ):
        if value < 1:
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


def _write_shards(
    out: Path,
    split: str,
    ids: np.ndarray,
    seq_len: int,
    shard_windows: int,
    advance: Callable[[int, int], None],
) -> dict[str, Any]:
    """Write windows of seq_len+1 ids, stride seq_len, as GZIP TFRecords of tf.train.Example."""
    # Imported here, not at the top: reading the config or the manifest needs no TensorFlow.
    import tensorflow as tf

    windows = (len(ids) - 1) // seq_len
    n_shards = math.ceil(windows / shard_windows)
    names = [shard_file(split, shard, n_shards) for shard in range(n_shards)]
    (out / names[0]).parent.mkdir()
    for shard, name in enumerate(names):
        try:
            with tf.io.TFRecordWriter(str(out / name), options="GZIP") as writer:
                for w in range(shard * shard_windows, min((shard + 1) * shard_windows, windows)):
                    window = ids[w * seq_len : w * seq_len + seq_len + 1].tolist()  # seq_len + 1
                    feature = tf.train.Feature(int64_list=tf.train.Int64List(value=window))
                    example = tf.train.Example(
                        features=tf.train.Features(feature={"input_ids": feature})
                    )
                    writer.write(example.SerializeToString())
        except tf.errors.OpError as e:
            raise _as_os_error(e) from None
        advance(shard + 1, n_shards)
    return {"shards": names, "windows": windows}


_DISK_FULL = {  # TensorFlow's words for them: its writers raise OpErrors, not OSError
    "No space left on device": errno.ENOSPC,
    "File too large": errno.EFBIG,
    "Disk quota exceeded": errno.EDQUOT,
}


def _as_os_error(error: Exception) -> Exception:
    """A TF writer's disk-full error as the OSError the storage layer names the folder for
    (`storage.atomic_dir`: one line, nothing half-written); any other error as it is."""
    message = str(getattr(error, "message", error))
    for words, code in _DISK_FULL.items():
        if words in message:
            return OSError(code, words)
    return error
