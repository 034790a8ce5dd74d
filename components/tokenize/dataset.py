"""The dataset's identity: the parameters that change the output, the version they and the
sources' fingerprints name, and the manifest that records both.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm

from components import storage
from components.tokenize.bpe import SENTENCEPIECE_TRAINER_OPTIONS
from contracts import records
from contracts.artifacts import TOKENIZER_FILE
from contracts.examples import (
    FORMAT_VERSION,
    DatasetParameters,
    ExamplesManifest,
    GcsSource,
    LocalSource,
    Source,
    SplitStats,
    TokenizerRecord,
)


def dataset_parameters(
    *,
    split_method: str,
    vocab_size: int,
    seq_len: int,
    eval_fraction: float,
    eval_max_bytes: int,
    text_field: str,
    unit_bytes: int,
    shard_windows: int,
    chunk_bytes: int,
    tokenizer_sample_bytes: int,
    given: bytes | None,
) -> DatasetParameters:
    """Every value that changes the output bytes, for `given` tokenizer bytes or None."""
    return DatasetParameters(
        format_version=FORMAT_VERSION,
        split_method=split_method,
        vocab_size=vocab_size,
        seq_len=seq_len,
        eval_fraction=eval_fraction,
        eval_max_bytes=eval_max_bytes,
        text_field=text_field,
        unit_bytes=unit_bytes,
        shard_windows=shard_windows,
        chunk_bytes=chunk_bytes,
        tokenizer_sample_bytes=tokenizer_sample_bytes,
        sentencepiece_version=spm.__version__,
        tokenizer_options=None if given else SENTENCEPIECE_TRAINER_OPTIONS,
        given_tokenizer_sha256=hashlib.sha256(given).hexdigest() if given else None,
    )


def dataset_version(
    corpus: str, sources: Sequence[storage.FileInfo], parameters: DatasetParameters
) -> str:
    """sha256 over each source's path relative to the corpus root, its fingerprint, and the
    parameters (as the manifest holds them)."""
    root = corpus_root(corpus, sources)
    fingerprints = [[relative_name(f.uri, root), f.fingerprint] for f in sources]
    canonical = json.dumps(
        {"sources": fingerprints, "parameters": records.to_dict(parameters)},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def source_entry(source: storage.FileInfo) -> Source:
    """A manifest `sources` entry: the sha256 locally; GCS's fingerprints and generation."""
    if not storage.is_gcs(source.uri):
        return LocalSource(source.uri, source.size, source.sha256)
    return GcsSource(source.uri, source.size, source.crc32c, source.md5, source.generation)


def build_manifest(
    corpus: str,
    sources: Sequence[storage.FileInfo],
    parameters: DatasetParameters,
    stats: dict[str, SplitStats],
    model: bytes,
    trained: bool,
    counts: DocumentCounts,
) -> ExamplesManifest:
    """manifest.json's record (docs/design.md)."""
    return ExamplesManifest(
        dataset_version=dataset_version(corpus, sources, parameters),
        seq_len=parameters.seq_len,
        vocab_size=parameters.vocab_size,
        eval_fraction=parameters.eval_fraction,
        splits=stats,
        tokenizer=TokenizerRecord(
            file=TOKENIZER_FILE,
            sha256=hashlib.sha256(model).hexdigest(),
            vocab_size=parameters.vocab_size,
            trained=trained,
        ),
        sources=tuple(source_entry(f) for f in sources),
        parameters=parameters,
        documents=dict(counts.documents),
        empty_documents=counts.empty,
        formats=dict(counts.formats),
    )


@dataclass(frozen=True)
class DocumentCounts:
    """What the manifest says of the corpus's documents."""

    documents: dict[str, int]  # by split
    empty: int  # skipped
    formats: dict[str, int]  # files by format


def corpus_root(corpus: str, sources: Sequence[storage.FileInfo]) -> str:
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


def relative_name(uri: str, root: str) -> str:
    """A source's name relative to the corpus root: part of its documents' identity."""
    if storage.is_gcs(uri):
        folder = root.rstrip("/") + "/"
        return uri[len(folder) :] if uri.startswith(folder) else uri.rsplit("/", 1)[-1]
    path = Path(uri)
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name
