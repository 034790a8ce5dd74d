"""Windows and shards: one split's token stream, cut into windows of seq_len + 1 ids with stride
seq_len (consecutive windows share one token), written as GZIP TFRecords of tf.train.Example
as the shards fill (docs/design.md, the Examples artifact). TensorFlow-free: a part of the
tokenize step imports numpy, SentencePiece and the readers only.
"""

from __future__ import annotations

import contextlib
import functools
import struct
import zlib
from pathlib import Path

import google_crc32c
import numpy as np

from contracts.artifacts import split_dir
from contracts.examples import SplitStats

# zlib's fastest level: a fifth of the default level's time (the step's largest cost after
# encoding) for shards about 15% larger.
GZIP_LEVEL = 1


class SplitWriter:
    """Takes one split's ids in order, chunk by chunk; writes each shard once it is full.

    Memory holds one chunk's windows and the open shard's compressor, whatever the split's
    size. Shards are `<folder>/Split-<split>/part-<k>.gz`; the step names them for the whole
    dataset (`-of-0000N`) when it merges the parts.
    """

    def __init__(self, folder: Path, split: str, seq_len: int, shard_windows: int) -> None:
        self.folder = folder
        self.split = split
        self.seq_len = seq_len
        self.shard_windows = shard_windows
        self.tokens = 0  # ids taken
        self.windows = 0  # windows written
        self._carry = np.zeros(0, np.int64)  # ids from the next window's first one
        self._shards: list[str] = []  # shard files, written or being written, relative names
        self._open: _GzipRecords | None = None  # the shard being written
        self._in_shard = 0  # windows in it

    def add(self, ids: np.ndarray) -> None:
        """Append the next ids of the split; write every window they complete."""
        self.tokens += len(ids)
        stream = np.concatenate([self._carry, ids.astype(np.int64)])
        count = max(0, (len(stream) - 1) // self.seq_len)
        if count:
            view = np.lib.stride_tricks.sliding_window_view(stream, self.seq_len + 1)
            self._write(serialize(view[:: self.seq_len][:count]))  # (count, seq_len + 1)
        self._carry = stream[count * self.seq_len :]

    def finish(self, chars: int) -> SplitStats:
        """Close the last shard; the split's counts, with the `chars` of text it was encoded
        from, and its shards relative to `folder`."""
        self._close_shard()
        counts = [self.shard_windows] * len(self._shards)
        if counts:
            counts[-1] = self.windows - self.shard_windows * (len(counts) - 1)
        return SplitStats(tuple(self._shards), self.windows, self.tokens, chars, tuple(counts))

    def abort(self) -> None:
        """Close the open shard, if any, after a failure (its error is not this one's to tell)."""
        with contextlib.suppress(Exception):
            self._close_shard()

    def _write(self, records: list[bytes]) -> None:
        done = 0
        while done < len(records):
            if self._open is None:
                self._open_shard()
            assert self._open is not None
            take = min(len(records) - done, self.shard_windows - self._in_shard)
            self._open.write(records[done : done + take])
            done += take
            self._in_shard += take
            self.windows += take
            if self._in_shard == self.shard_windows:
                self._close_shard()

    def _open_shard(self) -> None:
        name = f"{split_dir(self.split)}/part-{len(self._shards):05d}.gz"
        (self.folder / name).parent.mkdir(exist_ok=True)
        self._open = _GzipRecords(self.folder / name)
        self._shards.append(name)
        self._in_shard = 0

    def _close_shard(self) -> None:
        opened, self._open = self._open, None
        if opened is not None:
            opened.close()  # the shard is whole once it returns


# ---- TFRecord files, GZIP-compressed, without TensorFlow --------------------------------------

# TensorFlow's record framing (tensorflow/core/lib/io/record_writer.cc): each record is its
# length as a little-endian uint64, the masked CRC32C of those 8 bytes, the data, and the masked
# CRC32C of the data; a GZIP file is one gzip stream of the records (zlib_outputbuffer.cc, window
# bits 31). Written here with zlib and google-crc32c (google-cloud-storage's own dependency), so
# a part that packs shards never imports TensorFlow: 0.5 GB less memory and 2-4 s less start, and
# SentencePiece encodes about 30% slower in a process that has loaded it.
# tests/components/tokenize/test_stream.py reads the files back with tf.data.TFRecordDataset.
_CRC_MASK_DELTA = 0xA282EAD8


def _masked(crcs: np.ndarray) -> np.ndarray:
    """CRC32Cs as TFRecord stores them: rotated right by 15 bits, plus a constant."""
    crcs = crcs.astype(np.uint32)
    return ((crcs >> np.uint32(15)) | (crcs << np.uint32(17))) + np.uint32(_CRC_MASK_DELTA)


@functools.cache
def _length_header(length: int) -> bytes:
    """A record's first 12 bytes: its length and that length's masked CRC32C (the same for
    every record of that length, and a shard's records have few lengths)."""
    packed = struct.pack("<Q", length)
    crc = _masked(np.array([google_crc32c.value(packed)], np.uint32))
    return packed + crc.astype("<u4").tobytes()


def frame(records: list[bytes]) -> bytes:
    """The records as a TFRecord file holds them, one after another."""
    crcs = np.fromiter(map(google_crc32c.value, records), np.uint32, len(records))
    tails = _masked(crcs).astype("<u4").tobytes()
    return b"".join(
        piece
        for i, record in enumerate(records)
        for piece in (_length_header(len(record)), record, tails[4 * i : 4 * i + 4])
    )


class _GzipRecords:
    """One shard: TFRecords through one gzip stream (zlib's gzip header has no name or time,
    so the same records always give the same bytes), written to a file as they compress."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("wb")
        self._zip = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)

    def write(self, records: list[bytes]) -> None:
        self._file.write(self._zip.compress(frame(records)))

    def close(self) -> None:
        try:
            self._file.write(self._zip.flush())
        finally:
            self._file.close()


# ---- tf.train.Example, serialized with numpy ------------------------------------------------

# tf.train.Example{features{feature{key: "input_ids", value{int64_list{value: [...]}}}}}: each
# message is a tag, a length and its fields, and every field but the ids is a prefix. So a
# record is a header that depends only on the packed ids' byte count, then the ids as packed
# varints, which numpy writes for a whole chunk at once.
# tests/components/tokenize/test_stream.py checks that the bytes equal tf.train.Example's own
# serialization.
_KEY = b"\x0a\x09input_ids"  # map entry field 1 (key), length 9, the feature's name


def serialize(windows: np.ndarray) -> list[bytes]:
    """Each row of `windows` (ids in [0, 2**32)) as a serialized tf.train.Example."""
    values = windows.astype(np.uint32)  # (n, seq_len + 1)
    width = _varint_size(int(values.max()))  # the most bytes one id takes
    sizes = np.ones(values.shape, np.uint8)  # the bytes each id takes
    for k in range(1, width):
        sizes += values >= 1 << (7 * k)
    varints = np.empty((*values.shape, width), np.uint8)  # each id's 7-bit groups, low first
    for k in range(width):
        more = (sizes > k + 1).astype(np.uint8) << 7  # the continuation bit
        varints[..., k] = ((values >> 7 * k) & 0x7F).astype(np.uint8) | more
    packed = varints[np.arange(width) < sizes[..., None]].tobytes()  # all windows, in order
    records: list[bytes] = []
    start, headers = 0, {}
    for length in sizes.sum(axis=1, dtype=np.int64).tolist():
        if length not in headers:
            headers[length] = _header(length)
        records.append(headers[length] + packed[start : start + length])
        start += length
    return records


def _header(packed: int) -> bytes:
    """Everything of one serialized Example before its `packed` bytes of ids."""
    int64_list = b"\x0a" + _varint(packed)  # Int64List.value (field 1), packed
    feature = b"\x1a" + _varint(len(int64_list) + packed)  # Feature.int64_list (field 3)
    value = b"\x12" + _varint(len(feature) + len(int64_list) + packed)  # map entry's value
    entry = _KEY + value
    entry_size = len(entry) + len(feature) + len(int64_list) + packed
    features = b"\x0a" + _varint(entry_size)  # Features.feature (field 1), one entry
    example = b"\x0a" + _varint(len(features) + entry_size)  # Example.features (field 1)
    return example + features + entry + feature + int64_list


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _varint_size(n: int) -> int:
    return max(1, -(-n.bit_length() // 7))
