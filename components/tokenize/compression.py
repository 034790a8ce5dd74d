"""Compressed corpus files: a streamed decompression chosen by the file's suffix.

Before the first byte is decompressed, the file's head must be the compression its name says
(a `.zst` that is really gzip, or plain text, is named as such); while it streams, a stream
that stops short (a truncated download) or fails to decompress is one `UserError` naming the
file. Memory stays flat: every decompressor here is read in bounded blocks.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import zlib
from collections.abc import Callable
from typing import IO, Any, cast

import zstandard

from components.tokenize import sniff
from contracts.errors import UserError

COMPRESSIONS = ("gz", "bz2", "xz", "zst")  # file suffixes, without the dot
_NAMES = {"gz": "gzip", "bz2": "bzip2", "xz": "xz", "zst": "zstd"}
# What each decompressor raises for bytes that are not a valid stream (a truncated one raises
# EOFError in all of the standard library's; zstd's is found by `_ZstdFrames`). bz2 raises a
# bare OSError, told apart from a disk's by having no errno.
_CORRUPT: dict[str, tuple[type[Exception], ...]] = {
    "gz": (gzip.BadGzipFile, zlib.error),
    "bz2": (OSError,),
    "xz": (lzma.LZMAError,),
    "zst": (zstandard.ZstdError,),
}
BLOCK_BYTES = 1 << 16  # compressed bytes read at a time


def open_stream(
    uri: str, compression: str, raw: IO[bytes], count: Callable[[int], None]
) -> IO[bytes]:
    """`raw` (the file's bytes) decompressed as `compression` ("" for none), as a stream.

    `count` hears how many bytes of `raw` each read takes, for progress.
    """
    counted = _Counted(raw, count)
    if compression:
        _check_magic(uri, compression, counted.head(sniff.HEAD_BYTES))
        return io.BufferedReader(_Decompressed(uri, compression, counted), BLOCK_BYTES)
    return io.BufferedReader(counted, BLOCK_BYTES)


def _check_magic(uri: str, compression: str, head: bytes) -> None:
    magic = sniff.identify(head)
    if magic is not None and magic.suffix == f".{compression}":
        return
    name = uri.rstrip("/").rsplit("/", 1)[-1]
    base = name[: -len(compression) - 1]
    if magic is not None and magic.suffix:
        fix = f"rename it to `{base}{magic.suffix}`"
    elif magic is not None:
        fix = magic.fix.format(name=base)
    elif head:
        fix = f"if it is not compressed, rename it to `{base}`; else download it again"
    else:
        fix = "download it again, or remove it from the corpus"
    raise UserError(
        f"corpus file {uri!r} is named `.{compression}` but is not "
        f"{_NAMES[compression]}-compressed: its bytes {sniff.describe(head)}; {fix}"
    )


class _Counted(io.RawIOBase):
    """The raw file, counting the bytes read; `head` peeks at its first bytes."""

    def __init__(self, raw: IO[bytes], count: Callable[[int], None]) -> None:
        super().__init__()
        self._raw = raw
        self._count = count
        self._held = b""  # bytes peeked at and not yet read
        self.observe: Callable[[bytes], None] | None = None  # sees every byte read

    def head(self, size: int) -> bytes:
        """The first `size` bytes (fewer if the file is shorter), still to be read."""
        while len(self._held) < size and (more := self._raw.read(size - len(self._held))):
            self._held += more
        return self._held

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._held:
            data, self._held = self._held[: len(buffer)], self._held[len(buffer) :]
        else:
            data = self._raw.read(len(buffer))
        buffer[: len(data)] = data
        self._count(len(data))
        if self.observe is not None:
            self.observe(data)
        return len(data)


class _Decompressed(io.RawIOBase):
    """A decompressing read that turns a bad or truncated stream into one UserError.

    At the end, the raw file is read to its end, so the storage layer's check of the bytes
    against the listing runs.
    """

    def __init__(self, uri: str, compression: str, raw: _Counted) -> None:
        super().__init__()
        self._uri = uri
        self._compression = compression
        self._raw = raw
        self._frames = _ZstdFrames() if compression == "zst" else None
        if self._frames is not None:
            raw.observe = self._frames.feed
        self._stream = _decompressor(compression, cast(IO[bytes], raw))
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            n = self._stream.readinto(buffer)
        except EOFError:
            raise self._truncated() from None
        except _CORRUPT[self._compression] as e:
            if isinstance(e, OSError) and e.errno is not None:
                raise
            raise UserError(
                f"corpus file {self._uri!r} is corrupt: its {_NAMES[self._compression]} "
                f"stream fails to decompress ({e}); download it again"
            ) from None
        if not n and not self._done:
            self._done = True
            if self._frames is not None and not self._frames.complete:
                raise self._truncated()
            while self._raw.read(BLOCK_BYTES):
                pass
        return n

    def _truncated(self) -> UserError:
        return UserError(
            f"corpus file {self._uri!r} is truncated: its {_NAMES[self._compression]} stream "
            "stops before its end; download it again"
        )

    def close(self) -> None:
        if not self.closed:
            self._stream.close()
        super().close()


def _decompressor(compression: str, raw: IO[bytes]) -> io.BufferedIOBase:
    if compression == "gz":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if compression == "bz2":
        return bz2.BZ2File(raw)
    if compression == "xz":
        return lzma.LZMAFile(raw)
    reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    return reader  # type: ignore[return-value]  # a BufferedIOBase in all but name


class _ZstdFrames:
    """Follows the frames of a zstd stream (RFC 8878) over its compressed bytes.

    zstandard's stream reader ends quietly, without an error, when its input stops inside a
    frame, so a truncated file would pass for a shorter one; `complete` tells the two apart.
    Only headers are parsed; block contents are skipped, not decompressed a second time.
    """

    def __init__(self) -> None:
        self._buf = bytearray()  # bytes not yet parsed
        self._skip = 0  # bytes of block content (or a skippable frame) still to pass over
        self._state = "frame"  # what comes next: "frame", "block" or "checksum"
        self._checksum = False  # the current frame ends in a 4-byte content checksum
        self._lost = False  # not a zstd layout: leave the error to the decompressor

    @property
    def complete(self) -> bool:
        """True if the bytes so far end between frames."""
        return self._lost or (self._state == "frame" and not self._skip and not self._buf)

    def feed(self, data: bytes) -> None:
        if self._lost:
            return
        skipped = min(self._skip, len(data))
        self._skip -= skipped
        self._buf += data[skipped:]
        while not self._skip and self._step():
            pass

    def _step(self) -> bool:
        """Parse the next header if all its bytes are here; False if it needs more."""
        buf = self._buf
        if self._state == "block":
            if len(buf) < 3:
                return False
            header = int.from_bytes(buf[:3], "little")
            kind, size = (header >> 1) & 3, header >> 3
            self._take(3, 1 if kind == 1 else size)  # an RLE block holds one byte
            self._state = "checksum" if header & 1 else "block"
        elif self._state == "checksum":
            if self._checksum and len(buf) < 4:
                return False
            self._take(4 if self._checksum else 0, 0)
            self._state = "frame"
        elif len(buf) < 4:
            return False
        elif buf[:4] == b"\x28\xb5\x2f\xfd":
            if len(buf) < 5:
                return False
            descriptor = buf[4]
            single_segment = (descriptor >> 5) & 1
            size = 5 + (1 - single_segment) + (0, 1, 2, 4)[descriptor & 3]
            size += (single_segment, 2, 4, 8)[descriptor >> 6]
            if len(buf) < size:
                return False
            self._checksum = bool(descriptor & 4)
            self._take(size, 0)
            self._state = "block"
        elif buf[1:4] == b"\x2a\x4d\x18" and buf[0] & 0xF0 == 0x50:  # a skippable frame
            if len(buf) < 8:
                return False
            self._take(8, int.from_bytes(buf[4:8], "little"))
        else:
            self._lost = True
            return False
        return True

    def _take(self, header: int, skip: int) -> None:
        """Consume a header of `header` bytes, then pass over `skip` bytes."""
        del self._buf[:header]
        skipped = min(skip, len(self._buf))
        del self._buf[:skipped]
        self._skip = skip - skipped
