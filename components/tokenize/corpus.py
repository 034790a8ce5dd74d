"""The corpus side of tokenize: list the sources, read them as strict UTF-8 text, split each
file's tail off for eval, and name the dataset version from the sources' fingerprints and the
parameters.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
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

# SentencePiece skips training lines longer than its max_sentence_length (64 KiB), and encoding
# holds a line's ids whole, so a longer line is refused while it is read, before the file is
# decoded: one huge line (a minified dump, a file with no newlines) would otherwise be held
# several times over. 16 times the training limit leaves room for long paragraphs.
MAX_LINE_BYTES = 16 * SENTENCEPIECE_TRAINER_OPTIONS["max_sentence_length"]
# Bytes read at a time. No larger than MAX_LINE_BYTES: a line that starts and ends inside one
# chunk is then within the limit, and only lines that cross a chunk boundary are measured.
READ_CHUNK_BYTES = min(1 << 20, MAX_LINE_BYTES)
# Files that land in a text folder by mistake, by their first bytes: what they are, the fix.
_NOT_TEXT = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image", "remove it from the corpus"),
    (b"\xff\xd8\xff", "a JPEG image", "remove it from the corpus"),
    (b"\x7fELF", "an ELF executable", "remove it from the corpus"),
    (b"%PDF-", "a PDF document", "extract its text into a UTF-8 file"),
    (b"\x1f\x8b", "gzip-compressed", "decompress it first (`gunzip`)"),
    (b"PK\x03\x04", "a zip archive", "extract its text files first (`unzip`)"),
    (b"\xff\xfe", "UTF-16 text", "convert it to UTF-8 (`iconv -f utf-16 -t utf-8`)"),
    (b"\xfe\xff", "UTF-16 text", "convert it to UTF-8 (`iconv -f utf-16 -t utf-8`)"),
)


def list_sources(corpus: str) -> list[storage.FileInfo]:
    """The corpus's files with their fingerprints; a corpus with nothing to read is refused."""
    if not storage.is_gcs(corpus):
        _check_links(corpus)
    sources = storage.list_files(corpus)
    if not sources:
        raise UserError(f"corpus {corpus!r} has no files; give a text file, a folder or a glob")
    if sum(f.size for f in sources) == 0:
        raise UserError(f"corpus {corpus!r} is empty (0 bytes); give a text file with content")
    return sources


def _check_links(corpus: str) -> None:
    """Refuse symbolic links that loop: the corpus itself, or a link in a corpus folder.

    The listing skips them silently (a link to a folder is not followed), so the user would
    never learn that part of what they meant to give is missing, or why a path is "not found".
    """
    path = Path(corpus)
    if path.is_symlink() and _loops(path):
        raise UserError(
            f"corpus {corpus!r} is a symbolic link that loops ({corpus} -> {os.readlink(path)}); "
            "point it at a text file or folder"
        )
    if not any(c in corpus for c in "*?[") and not path.exists():
        raise UserError(
            f"corpus {corpus!r} not found: no such file or folder; check the path, or give "
            "a text file, a folder or a glob"
        )
    if not path.is_dir():
        return
    for folder, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(".")]  # hidden folders are never read
        for name in [*dirs, *files]:
            link = Path(folder, name)
            if not name.startswith(".") and link.is_symlink() and _loops(link):
                raise UserError(
                    f"corpus folder {corpus!r} holds a symbolic link that loops: {link} -> "
                    f"{os.readlink(link)}; remove the link (or give the corpus as a glob)"
                )


def _loops(link: Path) -> bool:
    """True for a link that never resolves (ELOOP) or that points at a folder above itself."""
    try:
        target = link.resolve(strict=True)
    except RuntimeError:  # pathlib's "Symlink loop from ...", raised for ELOOP
        return True
    except OSError as err:  # a link to nothing is skipped by the listing, not a loop
        return err.errno == errno.ELOOP
    return target.is_dir() and link.parent.resolve().is_relative_to(target)


def read_utf8(source: storage.FileInfo) -> str:
    """Read one source as text: streamed, checked against its listing, decoded strictly.

    While the bytes arrive, refuse a binary file (a known header, a NUL byte) and a line over
    MAX_LINE_BYTES, so neither is held whole first. Storage checks the bytes read against the
    fingerprint listed (`expect`): a file edited meanwhile is refused, never tokenized under
    the version of its old bytes.
    """
    uri = source.uri
    data = bytearray()
    lines = _LineLimit(uri)
    try:
        with storage.open_read(uri, expect=source) as f:
            for chunk in iter(lambda: f.read(READ_CHUNK_BYTES), b""):
                _check_text(uri, chunk, len(data))
                lines.feed(chunk, len(data))
                data += chunk
    except storage.ObjectChangedError:
        raise UserError(
            f"corpus file {uri!r} changed while it was read; run again when it is stable"
        ) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UserError(
            f"corpus file {uri!r} is not UTF-8: byte 0x{data[e.start]:02x} at offset {e.start} "
            f"(line {line}); convert it to UTF-8 (for example `iconv -f latin1 -t utf-8`)"
        ) from None


def _check_text(uri: str, chunk: bytes, offset: int) -> None:
    """Refuse a file that is not text: a known binary header first, then any NUL byte."""
    if offset == 0:
        for magic, kind, fix in _NOT_TEXT:
            if chunk.startswith(magic):
                raise UserError(f"corpus file {uri!r} is {kind}, not UTF-8 text; {fix}")
    nul = chunk.find(b"\x00")
    if nul != -1:
        raise UserError(
            f"corpus file {uri!r} holds a NUL byte at offset {offset + nul}, so it is binary, "
            "not text; remove it from the corpus or give its text as UTF-8"
        )


class _LineLimit:
    """Follows line boundaries across chunks; refuses a line once it passes MAX_LINE_BYTES."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.start = 0  # byte offset where the current line starts
        self.number = 1  # its 1-based line number

    def feed(self, chunk: bytes, offset: int) -> None:
        """Take the next chunk, read at byte `offset` of the file."""
        first = chunk.find(b"\n")
        end = offset + (len(chunk) if first == -1 else first)  # the current line reaches here
        if end - self.start > MAX_LINE_BYTES:
            raise UserError(
                f"corpus file {self.uri!r}: line {self.number} (from byte {self.start}) is longer "
                f"than {MAX_LINE_BYTES >> 20} MiB with no newline; split it into lines (the "
                f"tokenizer learns from lines of at most "
                f"{SENTENCEPIECE_TRAINER_OPTIONS['max_sentence_length'] >> 10} KiB)"
            )
        if first != -1:
            # Lines wholly inside the chunk are shorter than the chunk, so within the limit.
            self.number += chunk.count(b"\n")
            self.start = offset + chunk.rfind(b"\n") + 1


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
