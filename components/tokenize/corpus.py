"""The corpus side of tokenize: list the sources, read them as strict UTF-8, split each file's
tail off for eval, and name the dataset version from the sources' fingerprints and the parameters.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sentencepiece as spm

from components import storage
from components.tokenize.bpe import ENCODE_CHUNK_CHARS, SENTENCEPIECE_TRAINER_OPTIONS
from contracts.artifacts import SPLITS, TOKENIZER_FILE
from contracts.errors import UserError

FORMAT_VERSION = 1  # bump when the artifact layout or any encoding rule changes
SPLIT_METHOD = "file-tail-v1"  # see split_file; bump the suffix if the rule changes


def list_sources(corpus: str) -> list[storage.FileInfo]:
    sources = storage.list_files(corpus)
    if not sources:
        raise UserError(f"corpus {corpus!r} has no files; give a text file, a folder or a glob")
    if sum(f.size for f in sources) == 0:
        raise UserError(f"corpus {corpus!r} is empty (0 bytes); give a text file with content")
    return sources


def read_utf8(source: storage.FileInfo) -> str:
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


def split_file(text: str, eval_fraction: float) -> tuple[str, str]:
    """Cut one file into (train, eval) at the line start nearest to (1 - eval_fraction)."""
    target = round(len(text) * (1.0 - eval_fraction))
    before = text.rfind("\n", 0, target) + 1  # 0 when there is no line start before
    after = text.find("\n", target) + 1  # 0 when there is no line start after
    inside = [cut for cut in (before, after) if 0 < cut < len(text)]
    cut = min(inside, key=lambda c: abs(c - target)) if inside else target
    return text[:cut], text[cut:]


def split_corpus(texts: Sequence[str], eval_fraction: float, corpus: str) -> dict[str, str]:
    """Split each file, then join the parts of each split (newline-terminated) in file order."""
    if not any(t.strip() for t in texts):
        raise UserError(f"corpus {corpus!r} holds only whitespace; give a text file with content")
    parts = [split_file(t, eval_fraction) for t in texts if t]
    return {split: "".join(_terminated(p[i]) for p in parts) for i, split in enumerate(SPLITS)}


def _terminated(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


# ---- version and manifest ------------------------------------------------------------------


def dataset_parameters(
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
        "encode_chunk_chars": ENCODE_CHUNK_CHARS,
        "sentencepiece_version": spm.__version__,
        "tokenizer_options": None if given else SENTENCEPIECE_TRAINER_OPTIONS,
        "given_tokenizer_sha256": hashlib.sha256(given).hexdigest() if given else None,
    }


def dataset_version(
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


def source_entry(source: storage.FileInfo) -> dict[str, Any]:
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


def build_manifest(
    corpus: str,
    sources: Sequence[storage.FileInfo],
    parameters: dict[str, Any],
    stats: dict[str, dict[str, Any]],
    model: bytes,
    trained: bool,
) -> dict[str, Any]:
    return {
        "dataset_version": dataset_version(corpus, sources, parameters),
        "seq_len": parameters["seq_len"],
        "vocab_size": parameters["vocab_size"],
        "eval_fraction": parameters["eval_fraction"],
        "splits": stats,
        "tokenizer": {
            "file": TOKENIZER_FILE,
            "sha256": hashlib.sha256(model).hexdigest(),
            "vocab_size": parameters["vocab_size"],
            "trained": trained,
        },
        "sources": [source_entry(f) for f in sources],
        "parameters": parameters,
    }
