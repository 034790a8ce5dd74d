"""Corpus files as documents: every format and compression, pieces, counts, bad input."""

import bz2
import gzip
import io
import json
import lzma
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from components import storage
from components.tokenize import corpus, readers
from components.tokenize.readers import DocumentReader, Piece
from contracts.errors import UserError

COMPRESS = {
    "": lambda data: data,
    "gz": gzip.compress,
    "bz2": bz2.compress,
    "xz": lzma.compress,
    "zst": lambda data: zstandard.ZstdCompressor().compress(data),
}
# Documents as a JSONL or Parquet file holds them: blank ones keep their index.
DOCS = ["First Citizen:\nBefore we proceed.\n", "", "  \n\t", "Ünïcödé, then no newline", None]


def _jsonl(docs: list[str | None], field: str = "text") -> bytes:
    return b"".join(json.dumps({"id": i, field: d}).encode() + b"\n" for i, d in enumerate(docs))


def _parquet(columns: dict[str, list], row_group_size: int | None = None) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.table(columns), out, row_group_size=row_group_size)
    return out.getvalue()


def _file(path: Path, data: bytes) -> storage.FileInfo:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return storage.list_files(str(path))[0]


def _read(source: storage.FileInfo, **kwargs) -> tuple[DocumentReader, list[Piece]]:
    reader = DocumentReader(source, **kwargs)
    return reader, list(reader.pieces())


def _documents(pieces: list[Piece]) -> dict[int, str]:
    """{doc: text}, checking that each document's pieces end once, on a `last` piece."""
    docs: dict[int, list[str]] = {}
    for piece in pieces:
        assert not docs or piece.doc >= max(docs)
        assert piece.doc not in docs or not docs[piece.doc][-1].endswith("\0"), "after last"
        docs.setdefault(piece.doc, []).append(piece.text + ("\0" if piece.last else ""))
    for parts in docs.values():
        assert parts[-1].endswith("\0") and all(p.endswith("\n") for p in parts[:-1])
    return {doc: "".join(parts)[:-1] for doc, parts in docs.items()}


def _refusal(source: storage.FileInfo, **kwargs) -> str:
    with pytest.raises(UserError) as refused:
        _read(source, **kwargs)
    message = str(refused.value)
    assert "\n" not in message and repr(source.uri) in message
    return message


# ---- formats ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, expected",
    [
        ("a/b.txt", "txt"),
        ("gs://bucket/x/part-0.JSONL.ZST", "jsonl+zst"),
        ("c.json.gz", "jsonl+gz"),
        ("d.parquet.bz2", "parquet+bz2"),
        ("e.tar.txt.xz", "txt+xz"),
    ],
)
def test_the_format_is_the_suffix(name, expected):
    assert readers.format_of(name) == expected


def test_every_known_suffix_has_a_format_and_counts():
    assert len(readers.KNOWN_SUFFIXES) == 20 and ".jsonl.zst" in readers.KNOWN_SUFFIXES
    sources = [storage.FileInfo(f"/c/f{s}", 1, "") for s in readers.KNOWN_SUFFIXES]
    counts = readers.check_formats(sources)
    assert counts["jsonl"] == 2 and counts["txt+zst"] == 1 and sum(counts.values()) == 20


@pytest.mark.bad_input("a corpus file with a suffix tokenize does not read (.csv, none)")
@pytest.mark.parametrize("name", ["table.csv", "README", "notes.txt.7z"])
def test_an_unknown_suffix_is_refused_listing_the_known_ones(name):
    good = storage.FileInfo("/c/a.txt", 1, "")
    with pytest.raises(UserError) as refused:
        readers.check_formats([good, storage.FileInfo(f"/c/{name}", 1, "")])
    message = str(refused.value)
    assert f"'/c/{name}'" in message and "suffix tokenize does not read" in message
    assert ".txt, .jsonl, .json, .parquet" in message and ".gz, .bz2, .xz, .zst" in message


# ---- every format, every compression -------------------------------------------------------


@pytest.mark.parametrize("packed", list(COMPRESS))
def test_a_text_file_is_one_document(tmp_path, packed):
    text = "Before we proceed any further, hear me speak.\n" * 40 + "Speak, speak."
    name = "a.txt" + (f".{packed}" if packed else "")
    source = _file(tmp_path / name, COMPRESS[packed](text.encode()))
    reader, pieces = _read(source, piece_bytes=100)
    assert _documents(pieces) == {0: text}
    assert all(len(p.text.encode()) >= 100 for p in pieces[:-1]) and len(pieces) > 10
    assert (reader.documents, reader.empty, reader.text_bytes) == (1, 0, len(text))
    assert reader.raw_bytes == source.size


@pytest.mark.parametrize("packed", list(COMPRESS))
@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_jsonl_and_parquet_documents_keep_their_index(tmp_path, kind, packed):
    data = _jsonl(DOCS) if kind == "jsonl" else _parquet({"id": list(range(5)), "text": DOCS})
    name = f"d.{kind}" + (f".{packed}" if packed else "")
    reader, pieces = _read(_file(tmp_path / name, COMPRESS[packed](data)))
    assert _documents(pieces) == {0: DOCS[0], 3: DOCS[3]}
    assert (reader.documents, reader.empty) == (5, 3)
    assert reader.text_bytes == len(DOCS[0].encode()) + len(DOCS[3].encode())
    assert reader.raw_bytes == len(COMPRESS[packed](data))


def test_jsonl_blank_lines_are_empty_documents_and_another_field_is_read(tmp_path):
    data = b'{"body": "one"}\n\n   \n{"body": "two", "text": 3}\n{"body": "three"}'
    reader, pieces = _read(_file(tmp_path / "b.json", data), text_field="body")
    assert _documents(pieces) == {0: "one", 3: "two", 4: "three"}
    assert (reader.documents, reader.empty) == (5, 2)


def test_a_zstd_file_of_several_frames_reads_across_them(tmp_path):
    frames = [zstandard.ZstdCompressor(level=i).compress(_jsonl([d])) for i, d in enumerate(DOCS)]
    reader, pieces = _read(_file(tmp_path / "f.jsonl.zst", b"".join(frames)))
    assert _documents(pieces) == {0: DOCS[0], 3: DOCS[3]}  # one line per frame
    assert (reader.documents, reader.empty) == (5, 3)
    truncated = _file(tmp_path / "t.jsonl.zst", b"".join(frames)[:-3])
    assert "is truncated" in _refusal(truncated)


def test_parquet_is_read_in_batches_across_row_groups(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "PARQUET_BATCH_ROWS", 3)
    docs = [f"row {i}\n" if i % 4 else None for i in range(20)]
    data = _parquet({"text": pa.array(docs, pa.large_string())}, row_group_size=7)
    reader, pieces = _read(_file(tmp_path / "p.parquet", data))
    assert _documents(pieces) == {i: d for i, d in enumerate(docs) if d}
    assert (reader.documents, reader.empty) == (20, 5)


def test_a_dictionary_encoded_parquet_column_is_text(tmp_path):
    column = pa.array(["a", "b", "a"]).dictionary_encode()
    _, pieces = _read(_file(tmp_path / "p.parquet", _parquet({"text": column})))
    assert _documents(pieces) == {0: "a", 1: "b", 2: "a"}


# ---- pieces ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet"])
def test_a_long_document_comes_in_pieces_of_whole_lines(tmp_path, kind):
    text = "".join(f"línea {i} " + "é" * (i % 13) + "\n" for i in range(300)) + "end"
    data = {
        "txt": lambda: text.encode(),
        "jsonl": lambda: _jsonl(["short", text]),
        "parquet": lambda: _parquet({"text": ["short", text]}),
    }[kind]()
    reader, pieces = _read(_file(tmp_path / f"long.{kind}", data), piece_bytes=200)
    assert _documents(pieces)[0 if kind == "txt" else 1] == text
    long = [p for p in pieces if p.text != "short"]
    assert len(long) > 10 and all(len(p.text.encode()) >= 200 for p in long[:-1])
    # Each piece ends after the first newline at or past 200 bytes: one line less is short.
    assert all(
        len(p.text.encode()) - len(p.text[:-1].rsplit("\n", 1)[-1].encode()) - 1 < 200
        for p in long[:-1]
    )
    assert reader.text_bytes == sum(len(p.text.encode()) for p in pieces)


def test_a_blank_text_file_is_one_empty_document_and_leading_blanks_are_kept(tmp_path):
    reader, pieces = _read(_file(tmp_path / "blank.txt", b" \n\n \t\n" * 50), piece_bytes=8)
    assert pieces == [] and (reader.documents, reader.empty) == (1, 1)
    reader, pieces = _read(_file(tmp_path / "empty.txt.gz", gzip.compress(b"")))
    assert pieces == [] and (reader.documents, reader.empty) == (1, 1)
    text = " \n\n \t\n" * 50 + "text at last\n"
    reader, pieces = _read(_file(tmp_path / "late.txt", text.encode()), piece_bytes=8)
    assert _documents(pieces) == {0: text} and reader.empty == 0


def test_a_document_of_only_whitespace_too_large_to_hold_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "MAX_BLANK_BYTES", 100)
    source = _file(tmp_path / "blank.txt", b"\n" * 300)
    assert "document 0 starts with over" in _refusal(source, piece_bytes=10)


def test_pieces_streams_once(tmp_path):
    reader = DocumentReader(_file(tmp_path / "a.txt", b"x\n"))
    list(reader.pieces())
    with pytest.raises(RuntimeError, match="already called"):
        list(reader.pieces())


# ---- bad input -------------------------------------------------------------------------------


@pytest.mark.bad_input("a JSON Lines file with a line that is not JSON, or not an object")
def test_a_jsonl_line_that_is_not_a_json_object(tmp_path):
    source = _file(tmp_path / "a.jsonl", _jsonl(["ok", "ok"]) + b'{"text": "cut off\n')
    message = _refusal(source)
    assert "line 3 is not JSON (Unterminated string" in message and "JSON Lines" in message
    source = _file(tmp_path / "b.jsonl", b'{"text": "x"}\n["text"]\n')
    assert "line 2 is a JSON list, not an object" in _refusal(source)


@pytest.mark.bad_input("a JSON Lines file without the text field, or with a non-string one")
def test_a_jsonl_line_without_its_text_field(tmp_path):
    source = _file(tmp_path / "a.jsonl.gz", gzip.compress(_jsonl(["ok", "ok"], field="body")))
    message = _refusal(source)
    assert "line 1 has no 'text' field (its keys: 'id', 'body')" in message
    assert "--param tokenize.text_field=NAME" in message
    source = _file(tmp_path / "b.jsonl", b'{"text": "x"}\n\n{"text": ["x"]}\n')
    message = _refusal(source)
    assert "line 3's 'text' is a JSON list, not a string" in message
    assert "tokenize.text_field" in message


@pytest.mark.bad_input("a truncated compressed corpus file (.gz, .zst, .bz2, .xz)")
@pytest.mark.parametrize("packed", ["gz", "zst", "bz2", "xz"])
@pytest.mark.parametrize("kind", ["txt", "jsonl"])
def test_a_truncated_compressed_file(tmp_path, packed, kind):
    data = COMPRESS[packed](_jsonl(["some text\n" * 200] * 20))
    source = _file(tmp_path / f"a.{kind}.{packed}", data[: len(data) * 2 // 3])
    message = _refusal(source)
    assert "is truncated" in message and "stops before its end; download it again" in message


@pytest.mark.bad_input("a compressed corpus file whose bytes fail to decompress")
def test_a_corrupt_compressed_file(tmp_path):
    data = bytearray(gzip.compress(b"some text\n" * 1000))
    data[-8] ^= 0xFF  # the CRC-32 in gzip's trailer
    message = _refusal(_file(tmp_path / "a.txt.gz", bytes(data)))
    assert "is corrupt: its gzip stream fails to decompress" in message
    assert "download it again" in message


@pytest.mark.bad_input("a corpus file whose suffix names a compression its bytes are not")
@pytest.mark.parametrize(
    "name, data, expected",
    [
        pytest.param(
            "a.jsonl.zst",
            gzip.compress(b"{}\n", mtime=0),
            "is named `.zst` but is not zstd-compressed: its bytes are gzip-compressed; "
            "rename it to `a.jsonl.gz`",
            id="gzip-named-zst",
        ),
        pytest.param(
            "a.txt.gz",
            b"plain words\n",
            "is named `.gz` but is not gzip-compressed: its bytes look like uncompressed text; "
            "if it is not compressed, rename it to `a.txt`",
            id="text-named-gz",
        ),
        pytest.param(
            "a.txt.xz",
            b"\x00\x01\x02\x03\x04\x05\x06\x07\x08",
            "its bytes start 00 01 02 03 04 05 06 07, a format tokenize does not know",
            id="unknown-named-xz",
        ),
        pytest.param("a.txt.bz2", b"", "its bytes are none (the file is empty)", id="empty-bz2"),
    ],
)
def test_a_compressed_suffix_on_other_bytes(tmp_path, name, data, expected):
    assert expected in _refusal(_file(tmp_path / name, data))


@pytest.mark.bad_input("a compressed file named .txt (zstd, gzip)")
@pytest.mark.parametrize("packed", ["zst", "gz"])
def test_a_compressed_file_named_txt_says_to_name_it_for_its_compression(tmp_path, packed):
    message = _refusal(_file(tmp_path / "notes.txt", COMPRESS[packed](b"text\n")))
    assert f"not UTF-8 text; name it `notes.txt.{packed}` so tokenize decompresses it" in message


@pytest.mark.bad_input("a compressed .txt file that is not UTF-8 once decompressed")
def test_bytes_not_utf8_inside_a_compressed_text_file(tmp_path):
    data = zstandard.ZstdCompressor().compress(b"good line\ncaf\xe9 au lait\n" * 50)
    message = _refusal(_file(tmp_path / "latin1.txt.zst", data), piece_bytes=5)
    assert "not UTF-8: byte 0xe9 at offset 13 of its decompressed text (line 2)" in message


@pytest.mark.bad_input("a compressed .txt file holding a NUL byte or a line over the limit")
def test_a_compressed_text_file_gets_the_text_checks(tmp_path, monkeypatch):
    message = _refusal(_file(tmp_path / "a.txt.gz", gzip.compress(b"ab\x00c\n")))
    assert "holds a NUL byte at offset 2" in message
    monkeypatch.setattr(corpus, "MAX_LINE_BYTES", 50)
    monkeypatch.setattr(corpus, "READ_CHUNK_BYTES", 16)  # the limit is checked across blocks
    message = _refusal(_file(tmp_path / "b.txt.bz2", bz2.compress(b"ok\n" + b"x" * 60)))
    assert "line 2 (from byte 3) is longer than" in message


@pytest.mark.bad_input("a JSONL or Parquet document with a line over the limit, a JSON line too")
def test_lines_too_long_in_documents(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "MAX_LINE_BYTES", 50)
    text = "short line\n" + "y" * 60 + "\n"
    message = _refusal(_file(tmp_path / "a.jsonl", _jsonl(["ok", text])))
    assert "line 2's 'text' has a line (its line 2) longer than" in message
    message = _refusal(_file(tmp_path / "a.parquet", _parquet({"text": ["ok", "", text]})))
    assert "row 2's 'text' has a line (its line 2) longer than" in message
    monkeypatch.setattr(readers, "MAX_JSON_LINE_BYTES", 100)
    monkeypatch.setattr(readers, "READ_CHUNK_BYTES", 64)
    message = _refusal(_file(tmp_path / "b.jsonl", _jsonl(["ok", "z" * 200])))
    assert "line 2 is longer than" in message and "one JSON object per line" in message


@pytest.mark.bad_input("a Parquet file without the text column, or with a non-string one")
def test_a_parquet_file_without_a_string_text_column(tmp_path):
    source = _file(tmp_path / "a.parquet", _parquet({"id": [1], "body": ["x"]}))
    message = _refusal(source)
    assert "has no column 'text' (its columns: 'id', 'body')" in message
    assert "--param tokenize.text_field=NAME" in message
    message = _refusal(source, text_field="id")
    assert "column 'id' holds int64, not strings" in message


@pytest.mark.bad_input("a .parquet file that is not Parquet")
def test_a_parquet_name_on_other_bytes(tmp_path):
    message = _refusal(_file(tmp_path / "a.parquet", _jsonl(["x"])))
    assert (
        "is not a valid Parquet file (it does not start with PAR1: its bytes look like" in message
    )
    data = _parquet({"text": ["x"] * 100})
    message = _refusal(_file(tmp_path / "cut.parquet.gz", gzip.compress(data[: len(data) // 2])))
    assert "is not a valid Parquet file (pyarrow:" in message


def test_a_parquet_file_changed_while_read_is_refused(tmp_path):
    source = _file(tmp_path / "a.parquet", _parquet({"text": ["x"]}))
    stale = storage.FileInfo(source.uri, source.size, "0" * 64)
    assert "changed while it was read" in _refusal(stale)


# ---- gs:// -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_documents_from_gcs_read_as_locally(gcs, tmp_path):
    gcs.put("c/a.jsonl.zst", COMPRESS["zst"](_jsonl(DOCS)))
    gcs.put("c/b.parquet", _parquet({"text": DOCS}))
    gcs.put("c/c.txt.gz", gzip.compress(b"one\ntwo\n" * 100))
    sources = storage.list_files(gcs.uri("c"))
    assert readers.check_formats(sources) == {"jsonl+zst": 1, "parquet": 1, "txt+gz": 1}
    for source in sources:
        reader, pieces = _read(source, piece_bytes=50)
        expected = {0: "one\ntwo\n" * 100} if "txt" in source.uri else {0: DOCS[0], 3: DOCS[3]}
        assert _documents(pieces) == expected, source.uri
        assert reader.raw_bytes == source.size
