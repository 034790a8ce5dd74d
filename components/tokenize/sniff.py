"""What a file is, from its first bytes: the formats that land in a corpus by mistake, and
the compressions tokenize reads by suffix, each with what to do about it."""

from __future__ import annotations

from dataclasses import dataclass

HEAD_BYTES = 8  # enough bytes to tell every format below


@dataclass(frozen=True)
class Magic:
    """A format known by its first bytes."""

    prefix: bytes | tuple[bytes, ...]  # the bytes it starts with (any of them)
    kind: str  # what it is, as the end of "the file is ..."
    fix: str  # what to do when it was read as text; `{name}` is the file's name
    suffix: str = ""  # a compression's file suffix, under which tokenize decompresses it


def _compressed(what: str, suffix: str) -> str:
    return f"name it `{{name}}{suffix}` so tokenize decompresses it (or {what} it first)"


MAGICS = (
    Magic(b"\x89PNG\r\n\x1a\n", "a PNG image", "remove it from the corpus"),
    Magic(b"\xff\xd8\xff", "a JPEG image", "remove it from the corpus"),
    Magic(b"\x7fELF", "an ELF executable", "remove it from the corpus"),
    Magic(b"%PDF-", "a PDF document", "extract its text into a UTF-8 file"),
    Magic(b"\x1f\x8b", "gzip-compressed", _compressed("`gunzip`", ".gz"), ".gz"),
    # A zstd frame, or a skippable frame (magic 0x184D2A50 to 0x184D2A5F, little-endian).
    Magic(
        (b"\x28\xb5\x2f\xfd", *(bytes([0x50 + i, 0x2A, 0x4D, 0x18]) for i in range(16))),
        "zstd-compressed",
        _compressed("`unzstd`", ".zst"),
        ".zst",
    ),
    Magic(
        tuple(b"BZh%d" % level for level in range(1, 10)),
        "bzip2-compressed",
        _compressed("`bunzip2`", ".bz2"),
        ".bz2",
    ),
    Magic(b"\xfd7zXZ\x00", "xz-compressed", _compressed("`unxz`", ".xz"), ".xz"),
    Magic(b"PAR1", "a Parquet file", "name it `.parquet` so tokenize reads its text column"),
    Magic(b"PK\x03\x04", "a zip archive", "extract its text files first (`unzip`)"),
    Magic(b"\xff\xfe", "UTF-16 text", "convert it to UTF-8 (`iconv -f utf-16 -t utf-8`)"),
    Magic(b"\xfe\xff", "UTF-16 text", "convert it to UTF-8 (`iconv -f utf-16 -t utf-8`)"),
)


def identify(head: bytes) -> Magic | None:
    """The known format `head` (a file's first bytes) starts, if any."""
    return next((m for m in MAGICS if head.startswith(m.prefix)), None)


def describe(head: bytes) -> str:
    """What a file's first bytes look like, as the end of "its bytes ..."."""
    magic = identify(head)
    if magic is not None:
        return f"are {magic.kind}"
    if not head:
        return "are none (the file is empty)"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 3:  # not just a character cut off by the head's end
            return f"start {head.hex(' ')}, a format tokenize does not know"
        text = head[: e.start].decode("utf-8")
    if all(c.isprintable() or c in "\t\r\n" for c in text):
        return "look like uncompressed text"
    return f"start {head.hex(' ')}, a format tokenize does not know"
