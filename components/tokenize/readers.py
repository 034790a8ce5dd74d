"""Documents from one corpus file: its format by suffix, read as a stream of text pieces.

A `.txt` file is one document; a JSON Lines file has one per line and a Parquet file one per
row, their text in the field `text_field`. Any of them may be compressed (`.gz`, `.bz2`,
`.xz`, `.zst`). Nothing holds a whole file: text streams in blocks (a Parquet file in record
batches), and a long document is handed on in pieces of whole lines, so memory stays flat
however large the corpus is. Local paths and gs:// read the same, through `components.storage`,
checked against the listed fingerprint.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from components import storage
from components.tokenize import compression, sniff
from components.tokenize.corpus import MAX_LINE_BYTES, READ_CHUNK_BYTES, check_text, checked_blocks
from contracts.errors import UserError

_FORMATS = {".txt": "txt", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
KNOWN_SUFFIXES: tuple[str, ...] = tuple(
    f"{suffix}{packed}"
    for suffix in _FORMATS
    for packed in ("", *(f".{c}" for c in compression.COMPRESSIONS))
)
PIECE_BYTES = 1 << 20  # a piece: whole lines, from the first that reaches this many bytes on
# A JSON line holds a whole document and is parsed whole, so a longer one is refused while it
# is read: a file with no newlines would otherwise be held whole.
MAX_JSON_LINE_BYTES = 64 << 20
# A document that is only whitespace so far is held back (it may yet turn out empty); this
# much of it, all whitespace, is refused rather than held.
MAX_BLANK_BYTES = 64 << 20
PARQUET_BATCH_ROWS = 256  # rows per record batch: a few MiB of text at web-page sizes
_FIELD_FIX = "set the field with `--param tokenize.text_field=NAME`"


def format_of(uri: str) -> str:
    """The file's format by its suffix: "txt", "jsonl" or "parquet", plus "+gz" and the like."""
    name = uri.rstrip("/").rsplit("/", 1)[-1].lower()
    stem, dot, last = name.rpartition(".")
    packed = last if dot and last in compression.COMPRESSIONS else ""
    if packed:
        name = stem
    fmt = _FORMATS.get(name[name.rfind(".") :] if "." in name else "")
    if fmt is None:
        raise UserError(
            f"corpus file {uri!r} has a suffix tokenize does not read; name it with one of "
            f"{', '.join(_FORMATS)} (text, JSON Lines, Parquet), each also compressed as "
            f"{', '.join('.' + c for c in compression.COMPRESSIONS)} (as in `corpus.jsonl.zst`), "
            "or move it out of the corpus"
        )
    return f"{fmt}+{packed}" if packed else fmt


def check_formats(sources: Sequence[storage.FileInfo]) -> dict[str, int]:
    """How many files of each format the corpus has; the first unknown suffix is refused."""
    counts = collections.Counter(format_of(source.uri) for source in sources)
    return dict(sorted(counts.items()))


@dataclass(frozen=True)
class Piece:
    """Whole lines of one document's text (all of it, for most documents)."""

    doc: int  # the document's index in its file: 0 (.txt), the line - 1 (JSONL), the row
    text: str  # the text; every piece of a document but its last ends in "\n"
    last: bool  # True on the document's last piece


class DocumentReader:
    """Streams one corpus file as the pieces of its documents (see `pieces`).

    The counts grow while it streams: `raw_bytes` is the bytes of the file read so far (for
    Parquet: its size times the share of rows read), `text_bytes` the UTF-8 bytes of text
    handed on; once `pieces` is exhausted, `documents` is how many the file holds and `empty`
    how many of them were skipped as empty or only whitespace.
    """

    def __init__(
        self, source: storage.FileInfo, *, text_field: str = "text", piece_bytes: int = PIECE_BYTES
    ) -> None:
        self.source = source
        self.text_field = text_field
        self.piece_bytes = piece_bytes
        self.format, _, self.compression = format_of(source.uri).partition("+")
        self.documents = 0
        self.empty = 0
        self.raw_bytes = 0
        self.text_bytes = 0
        self._started = False

    def pieces(self) -> Iterator[Piece]:
        """The pieces of every non-empty document, in file order; call once.

        An empty document takes its index and yields nothing. Bad input is one UserError
        naming the file and where in it; a file changed since it was listed is refused.
        """
        if self._started:
            raise RuntimeError(f"pieces() of {self.source.uri} was already called")
        self._started = True
        uri = self.source.uri
        try:
            if self.format == "parquet":
                yield from self._parquet()
            else:
                with self._stream() as f:
                    yield from self._txt(f) if self.format == "txt" else self._jsonl(f)
        except storage.ObjectChangedError:
            raise UserError(
                f"corpus file {uri!r} changed while it was read; run again when it is stable"
            ) from None

    # ---- shared steps ----------------------------------------------------------------------

    @contextlib.contextmanager
    def _stream(self, counted: bool = True) -> Iterator[IO[bytes]]:
        """The file's bytes, decompressed, checked against the listing at their end."""
        count = self._count if counted else _ignore
        with storage.open_read(self.source.uri, expect=self.source) as raw:
            yield compression.open_stream(self.source.uri, self.compression, raw, count)

    def _count(self, n: int) -> None:
        self.raw_bytes += n

    def _document(self, doc: int, texts: Iterable[str]) -> Iterator[Piece]:
        """The pieces of document `doc`, from its texts in order; none if it is blank."""
        self.documents += 1
        held: list[str] = []  # blank texts until the document shows text; then the latest
        blank_bytes = 0
        shown = False
        for text in texts:
            if shown:
                yield self._piece(doc, held.pop(), last=False)
            elif text.isspace() or not text:
                blank_bytes += len(text)
                if blank_bytes > MAX_BLANK_BYTES:
                    raise UserError(
                        f"corpus file {self.source.uri!r}: document {doc} starts with over "
                        f"{MAX_BLANK_BYTES >> 20} MiB of whitespace; remove it"
                    )
            else:
                shown = True
                for blank in held:
                    yield self._piece(doc, blank, last=False)
                held.clear()
            held.append(text)
        if shown:
            yield self._piece(doc, held[0], last=True)
        else:
            self.empty += 1

    def _piece(self, doc: int, text: str, last: bool) -> Piece:
        self.text_bytes += len(text) if text.isascii() else len(text.encode("utf-8"))
        return Piece(doc, text, last)

    def _cut(self, text: str, where: str) -> Iterator[str]:
        """A document's text held whole, in pieces of whole lines (see `_TextPieces`)."""
        limit = min(self.piece_bytes, MAX_LINE_BYTES)
        data = text.encode("utf-8") if len(text) * 4 > limit else b""  # 4: UTF-8's widest
        if len(data) <= limit:
            yield text
            return
        _check_lines(self.source.uri, data, where)
        start = 0
        while start < len(data):
            newline = data.find(b"\n", start + self.piece_bytes - 1)
            end = len(data) if newline == -1 else newline + 1
            yield data[start:end].decode("utf-8")
            start = end

    # ---- .txt ------------------------------------------------------------------------------

    def _txt(self, f: IO[bytes]) -> Iterator[Piece]:
        """The whole file, one document, checked as `corpus.read_chunks` checks text."""
        pieces = _TextPieces(self.source.uri, self.piece_bytes, bool(self.compression))
        yield from self._document(0, pieces.cut(checked_blocks(self.source.uri, f)))

    # ---- JSON Lines ------------------------------------------------------------------------

    def _jsonl(self, f: IO[bytes]) -> Iterator[Piece]:
        """One document per line: the string `text_field` of its JSON object."""
        field = self.text_field
        for number, line in _lines(self.source.uri, f):
            where = f"line {number}'s {field!r}"
            text = self._json_text(number, line) if line.strip() else None
            yield from self._document(number - 1, self._cut(text, where) if text else ())

    def _json_text(self, number: int, line: bytes) -> str | None:
        uri, field = self.source.uri, self.text_field
        try:
            record = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise UserError(
                f"corpus file {uri!r} is not UTF-8: line {number} has byte "
                f"0x{line[e.start]:02x} at its byte {e.start}; convert it to UTF-8"
            ) from None
        except (ValueError, RecursionError) as e:
            detail = f"{e.msg}, column {e.colno}" if isinstance(e, json.JSONDecodeError) else e
            raise UserError(
                f"corpus file {uri!r}: line {number} is not JSON ({detail}); give one JSON "
                "object per line (JSON Lines)"
            ) from None
        if not isinstance(record, dict):
            raise UserError(
                f"corpus file {uri!r}: line {number} is a JSON {type(record).__name__}, not "
                f"an object; give one JSON object per line, its text in {field!r}"
            )
        if field not in record:
            raise UserError(
                f"corpus file {uri!r}: line {number} has no {field!r} field (its keys: "
                f"{_listed(record)}); {_FIELD_FIX}"
            )
        text = record[field]
        if text is not None and not isinstance(text, str):  # null: an empty document
            raise UserError(
                f"corpus file {uri!r}: line {number}'s {field!r} is a JSON "
                f"{type(text).__name__}, not a string; {_FIELD_FIX} to name the text"
            )
        return text

    # ---- Parquet ---------------------------------------------------------------------------

    def _parquet(self) -> Iterator[Piece]:
        """One document per row: column `text_field`, read in record batches."""
        uri, field = self.source.uri, self.text_field
        with self._parquet_file() as parquet:
            _check_column(uri, field, parquet.schema_arrow)
            rows = max(parquet.metadata.num_rows, 1)
            try:
                for batch in parquet.iter_batches(
                    batch_size=PARQUET_BATCH_ROWS, columns=[field], use_threads=False
                ):
                    for text in batch.column(0).to_pylist():
                        doc, where = self.documents, f"row {self.documents}'s {field!r}"
                        yield from self._document(doc, self._cut(text, where) if text else ())
                    self.raw_bytes = self.source.size * self.documents // rows
            except pa.ArrowException as e:
                raise _not_parquet(uri, f"pyarrow: {e}") from None

    @contextlib.contextmanager
    def _parquet_file(self) -> Iterator[pq.ParquetFile]:
        """The file, seekable, as Parquet needs (its index is at the end).

        A local file is read in place, then hashed through the same handle to check it
        against the listing. A gs:// object or a compressed file is first streamed into a
        local temporary file (checked on the way, as every read is): that costs local disk
        the size of the file, but reads each byte once with the same checks as the other
        formats, where ranged reads would need a seekable GCS reader the storage layer does
        not have.
        """
        uri = self.source.uri
        if not storage.is_gcs(uri) and not self.compression:
            with open(uri, "rb") as f:
                yield _open_parquet(uri, f)
                _check_unchanged(self.source, f)
            return
        with tempfile.TemporaryFile(prefix="gptpipe-parquet-") as copy:
            with self._stream(counted=False) as f:  # progress counts rows read, as locally
                for block in iter(lambda: f.read(READ_CHUNK_BYTES), b""):
                    copy.write(block)
            copy.seek(0)
            yield _open_parquet(uri, copy)


class _TextPieces:
    """Cuts a text file's checked blocks into pieces of whole lines, decoded strictly.

    A piece ends after the first newline at or past `piece_bytes` bytes from its start, or at
    the end of the file: the bytes alone decide where, whatever the block sizes.
    """

    def __init__(self, uri: str, piece_bytes: int, decompressed: bool) -> None:
        self.uri = uri
        self.piece_bytes = piece_bytes
        self.where = " of its decompressed text" if decompressed else ""
        self.start = 0  # the file offset of the next piece
        self.lines = 0  # newlines before it

    def cut(self, blocks: Iterable[bytes]) -> Iterator[str]:
        buf = bytearray()
        for block in blocks:
            buf += block
            newline = buf.find(b"\n", self.piece_bytes - 1)
            while newline != -1:
                data = bytes(buf[: newline + 1])
                del buf[: newline + 1]
                yield self._decode(data)
                newline = buf.find(b"\n", self.piece_bytes - 1)
        if buf:
            yield self._decode(bytes(buf))

    def _decode(self, data: bytes) -> str:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = self.lines + data.count(b"\n", 0, e.start) + 1
            raise UserError(
                f"corpus file {self.uri!r} is not UTF-8: byte 0x{data[e.start]:02x} at offset "
                f"{self.start + e.start}{self.where} (line {line}); convert it to UTF-8 (for "
                "example `iconv -f latin1 -t utf-8`)"
            ) from None
        self.start += len(data)
        self.lines += data.count(b"\n")
        return text


def _lines(uri: str, f: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """A JSON Lines file's lines, numbered from 1, without their newlines."""
    buf = bytearray()
    number = offset = 0
    for block in iter(lambda: f.read(READ_CHUNK_BYTES), b""):
        check_text(uri, block, offset)
        offset += len(block)
        buf += block
        start = 0
        while (newline := buf.find(b"\n", start)) != -1:
            number += 1
            yield number, bytes(buf[start:newline])
            start = newline + 1
        del buf[:start]
        if len(buf) > MAX_JSON_LINE_BYTES:
            raise UserError(
                f"corpus file {uri!r}: line {number + 1} is longer than "
                f"{MAX_JSON_LINE_BYTES >> 20} MiB with no newline; give one JSON object per "
                "line, and split documents that large"
            )
    if buf:
        yield number + 1, bytes(buf)


def _check_lines(uri: str, data: bytes, where: str) -> None:
    """Refuse a line of a document's text over MAX_LINE_BYTES, as a .txt file's is."""
    start, number = 0, 1
    while (newline := data.find(b"\n", start)) != -1 or start < len(data):
        end = len(data) if newline == -1 else newline
        if end - start > MAX_LINE_BYTES:
            raise UserError(
                f"corpus file {uri!r}: {where} has a line (its line {number}) longer than "
                f"{MAX_LINE_BYTES >> 20} MiB with no newline; split it into lines"
            )
        if newline == -1:
            return
        start, number = newline + 1, number + 1


def _ignore(n: int) -> None:
    pass


def _listed(record: dict[str, Any]) -> str:
    keys = [repr(k) for k in list(record)[:10]]
    return ", ".join(keys) + (", ..." if len(record) > 10 else "") if keys else "none"


def _open_parquet(uri: str, f: IO[bytes]) -> pq.ParquetFile:
    head = f.read(sniff.HEAD_BYTES)
    if not head.startswith(b"PAR1"):
        raise _not_parquet(uri, f"it does not start with PAR1: its bytes {sniff.describe(head)}")
    f.seek(0)
    try:
        return pq.ParquetFile(f)
    except pa.ArrowException as e:
        raise _not_parquet(uri, f"pyarrow: {e}") from None


def _not_parquet(uri: str, detail: str) -> UserError:
    return UserError(
        f"corpus file {uri!r} is not a valid Parquet file ({detail}); download it again, or "
        "name it for what it holds"
    )


def _check_column(uri: str, field: str, schema: pa.Schema) -> None:
    if field not in schema.names:
        columns = ", ".join(repr(n) for n in schema.names[:20]) or "none"
        raise UserError(
            f"corpus file {uri!r} has no column {field!r} (its columns: {columns}); {_FIELD_FIX}"
        )
    kind = schema.field(field).type
    value = kind.value_type if pa.types.is_dictionary(kind) else kind
    if not (pa.types.is_string(value) or pa.types.is_large_string(value)):
        raise UserError(
            f"corpus file {uri!r}: column {field!r} holds {kind}, not strings; "
            f"{_FIELD_FIX} to name the text column"
        )


def _check_unchanged(source: storage.FileInfo, f: IO[bytes]) -> None:
    """Hash the open file again: the bytes Parquet read must be the bytes listed."""
    if not source.sha256:
        return
    f.seek(0)
    digest = hashlib.sha256()
    size = 0
    for block in iter(lambda: f.read(READ_CHUNK_BYTES), b""):
        digest.update(block)
        size += len(block)
    if size != source.size or digest.hexdigest() != source.sha256:
        raise storage.ObjectChangedError(f"file {source.uri} changed while it was read")
