"""The corpus side of tokenize: list the sources, and stream each one as checked chunks of
strict UTF-8 text, cut after newlines, from its train head and then its eval tail.

Nothing here holds a whole file: a source is read in READ_CHUNK_BYTES blocks and handed on in
chunks of whole lines, so memory stays flat however large the corpus is. Where a chunk ends
depends on the bytes alone (never on block sizes or on how many processes encode them), so the
same bytes always give the same chunks.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from components import storage
from components.tokenize import sniff
from components.tokenize.bpe import SENTENCEPIECE_TRAINER_OPTIONS
from contracts.artifacts import SPLITS
from contracts.errors import UserError

CHUNK_BYTES = 1 << 20  # a chunk: whole lines, from the first that reaches this many bytes on

# SentencePiece skips training lines longer than its max_sentence_length (64 KiB), and a chunk
# holds whole lines, so a longer line is refused while it is read, before it is decoded: one
# huge line (a minified dump, a file with no newlines) would otherwise be held whole. 16 times
# the training limit leaves room for long paragraphs.
MAX_LINE_BYTES = 16 * SENTENCEPIECE_TRAINER_OPTIONS["max_sentence_length"]
# Bytes read at a time. No larger than MAX_LINE_BYTES: a line that starts and ends inside one
# block is then within the limit, and only lines that cross a block boundary are measured.
READ_CHUNK_BYTES = min(1 << 20, MAX_LINE_BYTES)


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


# ---- streamed, checked reading --------------------------------------------------------------


@dataclass(frozen=True)
class Chunk:
    """Whole lines of one source, all of one split."""

    split: str  # "train" or "eval"
    text: str  # the lines; the last chunk of a file's train or eval part always ends in "\n"
    size: int  # the source bytes it covers (a "\n" added at a part's end is not counted)


def read_chunks(
    source: storage.FileInfo,
    eval_fraction: float,
    chunk_bytes: int = CHUNK_BYTES,
    eval_max_bytes: int = 0,
) -> Iterator[Chunk]:
    """Stream one source as chunks: its train part's, then its eval part's (see _Chunker).

    While the bytes arrive, refuse a binary file (a known header, a NUL byte) and a line over
    MAX_LINE_BYTES, and decode each chunk strictly, naming the byte offset and line of the
    first byte that is not UTF-8 (replacing it would silently train on U+FFFD and change the
    eval text's character count). Storage checks the bytes read against the fingerprint
    listed (`expect`): a file edited meanwhile is refused, never tokenized under the version
    of its old bytes. The check runs at the end of the file, so chunks already handed on are
    from a run that then fails.
    """
    uri = source.uri
    try:
        with storage.open_read(uri, expect=source) as f:
            chunker = _Chunker(uri, source.size, eval_fraction, chunk_bytes, eval_max_bytes)
            yield from chunker.chunks(checked_blocks(uri, f))
    except storage.ObjectChangedError:
        raise UserError(
            f"corpus file {uri!r} changed while it was read; run again when it is stable"
        ) from None


def train_bytes(sources: Sequence[storage.FileInfo], eval_fraction: float) -> int:
    """About how many bytes the train split has, known from the listed sizes alone."""
    return sum(_eval_target(f.size, eval_fraction) for f in sources)


def _eval_target(size: int, eval_fraction: float, eval_max_bytes: int = 0) -> int:
    """Where a file's eval part starts, at the earliest: its tail share, at most the cap."""
    target = round(size * (1.0 - eval_fraction))
    return max(target, size - eval_max_bytes) if eval_max_bytes else target


def checked_blocks(uri: str, f: IO[bytes]) -> Iterator[bytes]:
    """The file's bytes in blocks, each checked for binary content and over-long lines."""
    lines = LineLimit(uri)
    offset = 0
    for block in iter(lambda: f.read(READ_CHUNK_BYTES), b""):
        check_text(uri, block, offset)
        lines.feed(block, offset)
        yield block
        offset += len(block)


class _Chunker:
    """Cuts one file, arriving in blocks of any size, into chunks that depend on its bytes only.

    Split: the eval part starts at the first line start at or after byte
    round(size * (1 - eval_fraction)) of the file (or size - eval_max_bytes, if later), so
    every file gives text to both splits and eval text stays contiguous (nanoGPT's tail split,
    counted in bytes so that it is known before the file is decoded). A file with no line
    start there is cut at that byte (moved back to a character's first byte). Chunks: each
    part is cut after the first newline at or after every `chunk_bytes` bytes from where the
    last chunk ended, and at the part's end;
    a part that does not end in a newline gets one, as the windows of a split run on across
    files. The bytes held are at most a chunk and a block, plus one line (MAX_LINE_BYTES).
    """

    def __init__(
        self, uri: str, size: int, eval_fraction: float, chunk_bytes: int, eval_max_bytes: int = 0
    ) -> None:
        self.uri = uri
        self.size = size
        self.chunk_bytes = chunk_bytes
        self.target = _eval_target(size, eval_fraction, eval_max_bytes)
        self.cut: int | None = None  # where the eval part starts, once known
        self.split = SPLITS[0]  # the part being cut: train, then eval
        self.buf = bytearray()  # bytes read and not yet handed on, from self.buf[self.pos]
        self.pos = 0
        self.start = 0  # the file offset of self.buf[self.pos]
        self.lines = 0  # newlines before self.start, to name a line in an error

    def chunks(self, blocks: Iterable[bytes]) -> Iterator[Chunk]:
        for block in blocks:
            del self.buf[: self.pos]
            self.pos = 0
            self.buf += block
            yield from self._ready(final=False)
        yield from self._ready(final=True)

    def _ready(self, final: bool) -> Iterator[Chunk]:
        """Every chunk whose end the bytes so far decide (at the end of the file: the rest)."""
        while True:
            if self.split == SPLITS[0]:
                if self.cut is None:
                    self._find_cut(final)
                if self.cut == self.start:
                    self.split = SPLITS[1]
            end = self._chunk_end(final)
            if end is None or end == self.start:
                return
            yield self._take(end)

    def _find_cut(self, final: bool) -> None:
        # Train chunks so far end before the target, so the byte before it is still held.
        held = len(self.buf) - self.pos
        newline = self.buf.find(b"\n", self.pos + max(self.target - 1 - self.start, 0))
        if newline != -1 and self.start + newline - self.pos + 1 < self.size:
            self.cut = self.start + newline - self.pos + 1
        elif newline != -1 or final:  # no line start at or after the target inside the file
            cut = self.target
            while self.start < cut < self.start + held and self._byte(cut) & 0xC0 == 0x80:
                cut -= 1  # a UTF-8 continuation byte: cut before its character instead
            self.cut = cut

    def _byte(self, offset: int) -> int:
        return self.buf[self.pos + offset - self.start]

    def _chunk_end(self, final: bool) -> int | None:
        """Where the next chunk ends in the file, or None until more bytes decide it."""
        newline = self.buf.find(b"\n", self.pos + self.chunk_bytes - 1)
        if newline != -1:
            end: int | None = self.start + newline - self.pos + 1
        else:
            end = self.start + len(self.buf) - self.pos if final else None
        if self.split == SPLITS[1]:
            return end
        if self.cut is None:  # safe only before the target: the eval part cannot start there
            return end if end is not None and end < self.target else None
        return self.cut if end is None else min(end, self.cut)

    def _take(self, end: int) -> Chunk:
        data = bytes(self.buf[self.pos : self.pos + end - self.start])
        text = self._decode(data)
        part_ends = end == (self.cut if self.split == SPLITS[0] else self.size)
        if part_ends and not text.endswith("\n"):
            text += "\n"
        chunk = Chunk(self.split, text, len(data))
        self.pos += len(data)
        self.start = end
        self.lines += data.count(b"\n")
        if self.split == SPLITS[0] and end == self.cut:
            self.split = SPLITS[1]
        return chunk

    def _decode(self, data: bytes) -> str:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            offset = self.start + e.start
            line = self.lines + data.count(b"\n", 0, e.start) + 1
            raise UserError(
                f"corpus file {self.uri!r} is not UTF-8: byte 0x{data[e.start]:02x} at offset "
                f"{offset} (line {line}); convert it to UTF-8 (for example `iconv -f latin1 "
                "-t utf-8`)"
            ) from None


def check_text(uri: str, chunk: bytes, offset: int) -> None:
    """Refuse a file that is not text: a known binary header first, then any NUL byte."""
    magic = sniff.identify(chunk) if offset == 0 else None
    if magic is not None:
        fix = magic.fix.format(name=uri.rstrip("/").rsplit("/", 1)[-1])
        raise UserError(f"corpus file {uri!r} is {magic.kind}, not UTF-8 text; {fix}")
    nul = chunk.find(b"\x00")
    if nul != -1:
        raise UserError(
            f"corpus file {uri!r} holds a NUL byte at offset {offset + nul}, so it is binary, "
            "not text; remove it from the corpus or give its text as UTF-8"
        )


class LineLimit:
    """Follows line boundaries across blocks; refuses a line once it passes MAX_LINE_BYTES."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.start = 0  # byte offset where the current line starts
        self.number = 1  # its 1-based line number

    def feed(self, chunk: bytes, offset: int) -> None:
        """Take the next block, read at byte `offset` of the file."""
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
            # Lines wholly inside the block are shorter than the block, so within the limit.
            self.number += chunk.count(b"\n")
            self.start = offset + chunk.rfind(b"\n") + 1


# ---- whole texts ----------------------------------------------------------------------------


def check_not_blank(has_text: bool, corpus: str) -> None:
    """Refuse a corpus that holds only whitespace."""
    if not has_text:
        raise UserError(f"corpus {corpus!r} holds only whitespace; give a text file with content")


def split_corpus(texts: Sequence[str], eval_fraction: float, corpus: str) -> dict[str, str]:
    """Each split's text for files held in memory, by the rule `read_chunks` streams.

    The parts of each split are joined in file order, each ending in a newline.
    """
    check_not_blank(any(t.strip() for t in texts), corpus)
    parts: dict[str, list[str]] = {split: [] for split in SPLITS}
    for i, text in enumerate(texts):
        data = text.encode("utf-8")
        for chunk in _Chunker(f"{corpus}[{i}]", len(data), eval_fraction, CHUNK_BYTES).chunks(
            [data]
        ):
            parts[chunk.split].append(chunk.text)
    return {split: "".join(pieces) for split, pieces in parts.items()}
