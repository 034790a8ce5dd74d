"""Tokenize: turn a UTF-8 text corpus into the Examples artifact (docs/design.md).

    corpus ─ read (strict UTF-8) ─ split (tail of each file) ─ SentencePiece BPE (train split)
           ─ encode (threads) ─ windows of seq_len+1, stride seq_len ─ GZIP TFRecord shards

The whole output is written in a temporary sibling folder and renamed into place at the end,
so a failure leaves nothing at `output_dir`. The corpus is held in memory: this step is sized
for corpora of up to a few hundred MB; a larger one would stream files through the same steps.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from components import storage
from contracts.errors import UserError

FORMAT_VERSION = 1  # bump when the artifact layout or any encoding rule below changes
SPLIT_METHOD = "file-tail-v1"  # see _split_file; bump the suffix if the rule changes
SPLITS = ("train", "eval")
DEFAULT_SHARD_WINDOWS = 4096  # about 0.25 MB of GZIP per shard at seq_len 64, vocab 512

# Options for SentencePieceTrainer.train besides the input and vocab_size. They make the model
# (a) reproduce text exactly: decode(encode(text)) == text, newlines and runs of spaces included
# (identity normalization, no dummy prefix, no whitespace folding, "\n" a symbol of its own);
# (b) never emit <unk>: unseen characters become UTF-8 byte pieces;
# (c) deterministic: one thread, every sentence used in order, no sampling.
# tensorflow_text.SentencepieceTokenizer(model, add_bos=False, add_eos=False) reads the same model.
SENTENCEPIECE_TRAINER_OPTIONS: dict[str, Any] = {
    "model_type": "bpe",
    "byte_fallback": True,
    "normalization_rule_name": "identity",
    "remove_extra_whitespaces": False,
    "add_dummy_prefix": False,
    "user_defined_symbols": ["\n"],
    "allow_whitespace_only_pieces": True,
    "split_digits": False,
    "character_coverage": 0.9995,
    "max_sentence_length": 1 << 16,
    "input_sentence_size": 0,
    "shuffle_input_sentence": False,
    "num_threads": 1,
    "unk_id": 0,
    "bos_id": 1,
    "eos_id": 2,
    "pad_id": -1,
}

_ENCODE_CHUNK_CHARS = 1 << 16  # one unit of work for an encode thread, cut after a newline
_ROUND_TRIP_PROBE = "First line\n\n  two  spaces,\ttab.\nlast"


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
    would silently train on U+FFFD and change the eval text's character count.

    `corpus` and `output_dir` may be local or `gs://` (a prefix, an object or a glob such as
    `gs://bucket/texts/*.txt`). Objects are listed with GCS's own fingerprints, then streamed;
    an object replaced between the listing and the read raises a UserError naming it.

    `dataset_version` is a sha256 over each source's content fingerprint and its path relative
    to the corpus root (the folder given, a file's folder or a glob's fixed part, so moving or
    renaming that folder does not change it) and every parameter that changes the output
    (`parameters` in the manifest). Same inputs give the same version and byte-identical
    shards; `workers` and `progress` change neither. The fingerprint is the sha256 of a local
    file, and for a `gs://` object its crc32c, md5 and size as GCS lists them (nothing is
    downloaded to compute it). The version follows the bytes, not the object generation:
    re-uploading the same bytes makes a new generation but the same dataset, so it keeps its
    version (the manifest's `sources` still record each generation that was read, for lineage).

    Manifest counts per split: `tokens` and `chars` of the whole split, and the `windows`
    written (`windows * seq_len + 1 <= tokens`: the incomplete tail is dropped).
    """
    _check_arguments(output_dir, vocab_size, seq_len, eval_fraction, shard_windows, workers)
    report = _Report(progress)
    sources = _list_sources(corpus)
    splits = _split_corpus([_read_utf8(f) for f in sources], eval_fraction, corpus)
    given = _read_given_tokenizer(tokenizer, vocab_size) if tokenizer else None
    parameters = _parameters(vocab_size, seq_len, eval_fraction, shard_windows, given)
    if expected_version and _dataset_version(corpus, sources, parameters) != expected_version:
        # Checked before writing: a folder named for one version must never hold another.
        raise UserError(f"corpus {corpus!r} changed while the run was reading it; run again")
    with storage.atomic_dir(output_dir, ready="manifest.json") as tmp:
        model = given or _train_tokenizer(splits["train"], vocab_size, corpus, report)
        (tmp / "tokenizer.model").write_bytes(model)
        ids = {}
        for split, text in splits.items():
            with report.task(f"encode {split}") as advance:
                ids[split] = _encode(model, text, workers or os.cpu_count() or 1, advance)
            _check_one_window(corpus, split, len(ids[split]), seq_len)
        stats = {}
        for split, text in splits.items():
            with report.task(f"write {split}") as advance:
                shards = _write_shards(tmp, split, ids[split], seq_len, shard_windows, advance)
            stats[split] = {**shards, "tokens": len(ids[split]), "chars": len(text)}
        (tmp / "raw").mkdir()
        (tmp / "raw" / "eval.txt").write_text(splits["eval"], encoding="utf-8", newline="")
        manifest = _manifest(corpus, sources, parameters, stats, model, trained=given is None)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
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
    sources = _list_sources(corpus)
    given = _read_given_tokenizer(tokenizer, vocab_size) if tokenizer else None
    parameters = _parameters(vocab_size, seq_len, eval_fraction, shard_windows, given)
    return _dataset_version(corpus, sources, parameters), sources


def run_content_addressed(corpus: str, datasets_root: str, **options: Any) -> Dataset:
    """Tokenize into `<datasets_root>/<dataset_version>/`, or reuse that folder if complete.

    The version is known from the sources' fingerprints before any work, so unchanged data is
    never tokenized twice, and every run on the same data names the same Examples URI: what
    lets KFP's cache key for train follow the data (docs/lineage.md). A folder is complete
    once its manifest.json exists: atomic_dir writes the manifest last.
    """
    version, sources = dataset_version_of(
        corpus, **{k: v for k, v in options.items() if k not in ("workers", "progress")}
    )
    uri = storage.join(datasets_root, version)
    manifest_uri = storage.join(uri, "manifest.json")

    def stored() -> Dataset:
        manifest = json.loads(storage.read_bytes(manifest_uri))
        if manifest.get("dataset_version") != version:
            raise UserError(
                f"dataset folder {uri} holds version {manifest.get('dataset_version')!r}, not "
                "the one it is named for; remove it so that it is written again"
            )
        return Dataset(uri, {**manifest, "sources": [_source_entry(f) for f in sources]}, True)

    if storage.has_content(manifest_uri):
        return stored()
    try:
        manifest = run(corpus, uri, expected_version=version, **options)
    except (OSError, UserError):
        if storage.has_content(manifest_uri):  # a concurrent run on the same data finished first
            return stored()
        raise
    return Dataset(uri, manifest, False)


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


# ---- inputs ---------------------------------------------------------------------------------


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


def _list_sources(corpus: str) -> list[storage.FileInfo]:
    sources = storage.list_files(corpus)
    if not sources:
        raise UserError(f"corpus {corpus!r} has no files; give a text file, a folder or a glob")
    if sum(f.size for f in sources) == 0:
        raise UserError(f"corpus {corpus!r} is empty (0 bytes); give a text file with content")
    return sources


def _read_utf8(source: storage.FileInfo) -> str:
    """Stream one source's bytes (checked against its listing) and decode them strictly."""
    path = source.uri
    data = storage.read_bytes(path, expect=source)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(
            f"corpus file {path!r} is not UTF-8: byte 0x{data[e.start]:02x} at offset {e.start}; "
            "convert it to UTF-8 (for example `iconv -f latin1 -t utf-8`)"
        ) from None


def _corpus_root(corpus: str, sources: Sequence[storage.FileInfo]) -> str:
    """The folder sources are named relative to: the folder given, a file's, or a glob's fixed part.

    So a file and a folder holding only that file give the same dataset version.
    """
    if storage.is_gcs(corpus):
        return _gcs_corpus_root(corpus, sources)
    parts = Path(corpus).parts
    wild = next((i for i, part in enumerate(parts) if any(c in part for c in "*?[")), None)
    if wild is not None:
        return str(Path(*parts[:wild]).resolve() if wild else Path.cwd())
    path = Path(corpus).resolve()
    return str(path.parent if path.is_file() else path)


def _gcs_corpus_root(corpus: str, sources: Sequence[storage.FileInfo]) -> str:
    bucket, key = storage.split_gcs(corpus)
    wild = next((i for i, c in enumerate(key) if c in "*?["), None)
    if wild is not None:
        key = key[:wild]
        key = key[: key.rfind("/") + 1]
    elif [s.uri for s in sources] == [corpus]:  # one object, named exactly
        key = key[: key.rfind("/") + 1]
    return f"gs://{bucket}/{key.rstrip('/')}"


# ---- split ----------------------------------------------------------------------------------


def _split_file(text: str, eval_fraction: float) -> tuple[str, str]:
    """Cut one file into (train, eval) at the line start nearest to (1 - eval_fraction)."""
    target = round(len(text) * (1.0 - eval_fraction))
    before = text.rfind("\n", 0, target) + 1  # 0 when there is no line start before
    after = text.find("\n", target) + 1  # 0 when there is no line start after
    inside = [cut for cut in (before, after) if 0 < cut < len(text)]
    cut = min(inside, key=lambda c: abs(c - target)) if inside else target
    return text[:cut], text[cut:]


def _split_corpus(texts: Sequence[str], eval_fraction: float, corpus: str) -> dict[str, str]:
    """Split each file, then join the parts of each split (newline-terminated) in file order."""
    if not any(t.strip() for t in texts):
        raise UserError(f"corpus {corpus!r} holds only whitespace; give a text file with content")
    parts = [_split_file(t, eval_fraction) for t in texts if t]
    return {split: "".join(_terminated(p[i]) for p in parts) for i, split in enumerate(SPLITS)}


def _terminated(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


# ---- tokenizer ------------------------------------------------------------------------------


def _train_tokenizer(train_text: str, vocab_size: int, corpus: str, report: _Report) -> bytes:
    """Train the BPE model on the train split's lines; return the serialized model."""
    report.line(
        f"training SentencePiece BPE, vocab_size {vocab_size}, "
        f"on {len(train_text):,} train characters"
    )
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(train_text.split("\n")),
            model_writer=model,
            vocab_size=vocab_size,
            minloglevel=2,
            **SENTENCEPIECE_TRAINER_OPTIONS,
        )
    except RuntimeError as e:
        raise UserError(
            f"cannot train a tokenizer with vocab_size {vocab_size} on corpus "
            f"{corpus!r}: {_explain_trainer_error(str(e))}"
        ) from None
    return model.getvalue()


def _explain_trainer_error(message: str) -> str:
    """Turn SentencePiece's check failures into the fix a user can make here."""
    too_small = re.search(r"smaller than required_chars\. \d+ vs (\d+)", message)
    if too_small:
        return (
            f"byte pieces, special pieces and the corpus's characters need at least "
            f"{too_small[1]}; use vocab_size >= {too_small[1]}"
        )
    too_high = re.search(
        r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)", message
    )
    if too_high:
        return (
            f"the train split yields at most {too_high[1]} pieces; use vocab_size <= "
            f"{too_high[1]} or more data"
        )
    return message.split("] ")[-1]


def _read_given_tokenizer(path: str, vocab_size: int) -> bytes:
    """Read and check a user-supplied SentencePiece model."""
    try:
        model = storage.read_bytes(path)
    except (OSError, UserError):
        raise UserError(
            f"tokenizer {path!r} not found; give a SentencePiece .model file or omit it"
        ) from None
    try:
        processor = spm.SentencePieceProcessor(model_proto=model)
    except RuntimeError:
        raise UserError(f"tokenizer {path!r} is not a SentencePiece model") from None
    if processor.vocab_size() != vocab_size:
        raise UserError(
            f"tokenizer {path!r} has {processor.vocab_size()} pieces but vocab_size "
            f"is {vocab_size}; set vocab_size={processor.vocab_size()} or omit "
            "the tokenizer to train one"
        )
    if processor.decode(processor.encode(_ROUND_TRIP_PROBE)) != _ROUND_TRIP_PROBE:
        raise UserError(
            f"tokenizer {path!r} does not reproduce newlines and spaces exactly; "
            "train it with SENTENCEPIECE_TRAINER_OPTIONS or omit it"
        )
    return model


# ---- encode ---------------------------------------------------------------------------------


def _line_chunks(text: str, chunk_chars: int) -> list[str]:
    """Cut text after a newline every ~chunk_chars; the cut points depend on the text only."""
    chunks, start = [], 0
    while start < len(text):
        newline = text.find("\n", min(start + chunk_chars, len(text)) - 1)
        end = len(text) if newline == -1 else newline + 1
        chunks.append(text[start:end])
        start = end
    return chunks


def _encode(
    model: bytes,
    text: str,
    workers: int,
    advance: Callable[[int, int], None],
    chunk_chars: int = _ENCODE_CHUNK_CHARS,
) -> np.ndarray:
    """Encode text to int64 ids on `workers` threads, chunk order kept.

    SentencePiece's batch encode runs C++ threads without the GIL, so it uses every core with no
    process pool: spawned workers would cost more than the encode (about 0.2 s per MB on one core)
    and need a `__main__` guard in every caller, and forking after TensorFlow started its threads
    is unsafe. "\\n" is a piece of its own, so no piece spans a chunk boundary and the ids equal
    those of encoding the text whole, whatever `workers` is.
    """
    processor = spm.SentencePieceProcessor(model_proto=model)
    chunks = _line_chunks(text, chunk_chars)
    batch = 8 * workers  # chunks per progress report
    encoded = [np.zeros(0, np.int64)]
    for start in range(0, len(chunks), batch):
        for ids in processor.encode(chunks[start : start + batch], num_threads=workers):
            encoded.append(np.asarray(ids, dtype=np.int64))
        advance(min(start + batch, len(chunks)), len(chunks))
    return np.concatenate(encoded)


def _check_one_window(corpus: str, split: str, tokens: int, seq_len: int) -> None:
    if tokens < seq_len + 1:
        larger_split = ", or a larger eval_fraction" if split == "eval" else ""
        raise UserError(
            f"corpus {corpus!r}: the {split} split has {tokens} tokens, fewer than one window of "
            f"seq_len + 1 = {seq_len + 1}; use a smaller seq_len, more data{larger_split}"
        )


# ---- write ----------------------------------------------------------------------------------


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
    folder = out / f"Split-{split}"
    folder.mkdir()
    names = []
    for shard in range(n_shards):
        name = f"data_tfrecord-{shard:05d}-of-{n_shards:05d}.gz"
        with tf.io.TFRecordWriter(str(folder / name), options="GZIP") as writer:
            for w in range(shard * shard_windows, min((shard + 1) * shard_windows, windows)):
                window = ids[w * seq_len : w * seq_len + seq_len + 1].tolist()  # seq_len + 1 ids
                feature = tf.train.Feature(int64_list=tf.train.Int64List(value=window))
                example = tf.train.Example(
                    features=tf.train.Features(feature={"input_ids": feature})
                )
                writer.write(example.SerializeToString())
        names.append(f"{folder.name}/{name}")
        advance(shard + 1, n_shards)
    return {"shards": names, "windows": windows}


def _parameters(
    vocab_size: int, seq_len: int, eval_fraction: float, shard_windows: int, given: bytes | None
) -> dict[str, Any]:
    """Every value that changes the output bytes; the dataset version hashes them."""
    return {
        "format_version": FORMAT_VERSION,
        "split_method": SPLIT_METHOD,
        "vocab_size": vocab_size,
        "seq_len": seq_len,
        "eval_fraction": eval_fraction,
        "shard_windows": shard_windows,
        "encode_chunk_chars": _ENCODE_CHUNK_CHARS,
        "sentencepiece_version": spm.__version__,
        "tokenizer_options": None if given else SENTENCEPIECE_TRAINER_OPTIONS,
        "given_tokenizer_sha256": hashlib.sha256(given).hexdigest() if given else None,
    }


def _dataset_version(
    corpus: str, sources: Sequence[storage.FileInfo], parameters: dict[str, Any]
) -> str:
    root = _corpus_root(corpus, sources)
    fingerprints = [[_relative(f.uri, root), f.fingerprint] for f in sources]
    canonical = json.dumps(
        {"sources": fingerprints, "parameters": parameters}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _relative(uri: str, root: str) -> str:
    if storage.is_gcs(uri):
        folder = root.rstrip("/") + "/"
        return uri[len(folder) :] if uri.startswith(folder) else uri.rsplit("/", 1)[-1]
    path = Path(uri)
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name


def _source_entry(source: storage.FileInfo) -> dict[str, Any]:
    """A manifest `sources` entry: the sha256 locally; GCS's fingerprints and generation."""
    if not storage.is_gcs(source.uri):
        return {"uri": source.uri, "size": source.size, "sha256": source.sha256}
    return {
        "uri": source.uri,
        "size": source.size,
        "crc32c": source.crc32c,
        "md5": source.md5,
        "generation": source.generation,
    }


def _manifest(
    corpus: str,
    sources: Sequence[storage.FileInfo],
    parameters: dict[str, Any],
    stats: dict[str, dict[str, Any]],
    model: bytes,
    trained: bool,
) -> dict[str, Any]:
    return {
        "dataset_version": _dataset_version(corpus, sources, parameters),
        "seq_len": parameters["seq_len"],
        "vocab_size": parameters["vocab_size"],
        "eval_fraction": parameters["eval_fraction"],
        "splits": stats,
        "tokenizer": {
            "file": "tokenizer.model",
            "sha256": hashlib.sha256(model).hexdigest(),
            "vocab_size": parameters["vocab_size"],
            "trained": trained,
        },
        "sources": [_source_entry(f) for f in sources],
        "parameters": parameters,
    }


# ---- progress -------------------------------------------------------------------------------


class _Report:
    """Progress for long steps: a rich bar on a terminal, a few plain lines in a log (KFP)."""

    def __init__(self, enabled: bool) -> None:
        self._console = Console(stderr=True, soft_wrap=True) if enabled else None

    def line(self, message: str) -> None:
        if self._console:
            self._console.print(f"tokenize: {message}", markup=False, highlight=False)

    @contextlib.contextmanager
    def task(self, what: str) -> Iterator[Callable[[int, int], None]]:
        """Yield advance(done, total) for one task: it moves a bar, or logs each quarter."""
        if self._console is None:
            yield lambda done, total: None
        elif self._console.is_terminal:
            with Progress(
                TextColumn(f"tokenize: {what}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self._console,
            ) as bar:
                task = bar.add_task(what, total=None)
                yield lambda done, total: bar.update(task, completed=done, total=total)
        else:
            logged = [-1]

            def advance(done: int, total: int) -> None:
                if 4 * done // total > logged[0]:
                    logged[0] = 4 * done // total
                    self.line(f"{what}: {done}/{total}")

            yield advance
