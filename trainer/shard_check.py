"""Checking the Examples' shards before training: each is read to the end of its GZIP stream
and its TFRecords counted, so a damaged, cut or miscounted shard stops the worker at the start
with one line naming the file.

TensorFlow reports a damaged shard as a DataLossError mid-training without naming the file,
and reads a shard cut at its GZIP trailer, or cut to nothing, without any error, so training
would quietly run on less data; and a resumed run finds its place in the input from the
windows the manifest gives each shard (data.TrainOrder), so those must be what the shard holds.
Each input pipeline records the shards it found whole in the job's work folder, and a restarted
worker reads again only those that changed since.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import posixpath
import struct
import uuid
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import tensorflow as tf

from contracts.errors import UserError

log = logging.getLogger("trainer")
_T = TypeVar("_T")
_I = TypeVar("_I")

# Compressed bytes read at a time while checking a shard: small, since GZIP level 1 inflates
# repetitive text up to ~170 times, and each of the threads holds one piece inflated.
_VERIFY_CHUNK = 1 << 16
# Shards checked at once: zlib and TensorFlow's file reads release the GIL (the records are
# counted in Python, by their length fields only, at about 4 M records/s).
VERIFY_THREADS = 8
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # zlib's gzip mode: header, deflate data, CRC-32 and length
_RECORD_HEADER = 12  # a TFRecord: uint64 length, its masked CRC-32C, the data, the data's CRC
_RECORD_FOOTER = 4
_LENGTH = struct.Struct("<Q")


class CorruptShardError(UserError):
    """A listed TFRecord shard is not the whole GZIP stream of the windows tokenize wrote."""


def verify_shards(
    examples_dir: str,
    files: Sequence[str],
    record: str | None = None,
    windows: Sequence[int] | None = None,
) -> None:
    """Read each shard to the end of its GZIP stream; raise CorruptShardError naming the first
    that is damaged (its CRC-32 or length check fails), truncated (its stream does not end),
    or, given `windows` (the manifest's count for each file), holding another number of
    TFRecords.

    It reads the compressed bytes once (zlib, in C: about 0.1 GB/s on one CPU core, on up to
    VERIFY_THREADS shards at once). With `record` (a JSON file in the job's work folder), the
    shards it lists unchanged (`_stat`) and checked for the same count are not read again, and
    those found whole are added to it: a restarted worker reads only what changed since.
    """
    expected = list(windows) if windows is not None else [None] * len(files)
    # What a shard is recorded by: its _stat, and the count it was checked for (None: any).
    stats = _parallel(_stat, files) if record else [[]] * len(files)
    keys = [[*stat, count] for stat, count in zip(stats, expected, strict=True)]
    checked = _read_record(record) if record else {}
    todo = [
        (path, count)
        for path, count, key in zip(files, expected, keys, strict=True)
        if not record or checked.get(path) != key
    ]
    problems = _parallel(lambda item: _shard_problem(*item), todo, until=bool)
    for (path, _), problem in zip(todo, problems, strict=False):
        if problem:
            raise CorruptShardError(
                f"corrupt TFRecord shard {path}: {problem}; the Examples are damaged: delete the "
                f"folder {examples_dir} and run again, so that tokenize writes them anew"
            )
    if record and todo:
        _write_record(record, {**checked, **dict(zip(files, keys, strict=True))})


def _parallel(
    fn: Callable[[_I], _T], items: Sequence[_I], until: Callable[[_T], bool] | None = None
) -> list[_T]:
    """fn over `items` on up to VERIFY_THREADS threads, in order; stops after the first result
    that `until` holds, dropping what has not started."""
    if not items:
        return []
    results: list[_T] = []
    pool = ThreadPoolExecutor(min(VERIFY_THREADS, len(items)), thread_name_prefix="verify")
    try:
        for result in pool.map(fn, items):
            results.append(result)
            if until is not None and until(result):
                break
    finally:
        pool.shutdown(cancel_futures=True)
    return results


def _stat(path: str) -> list[int]:
    """What a shard is recorded by: a local file's size, modification and change times (ns) and
    inode, which no copy or `touch` keeps; a gs:// object's size and update time (ms), as
    TensorFlow's file system gives them (it gives whole seconds for a local file's mtime)."""
    if "://" not in path:
        info = os.stat(path)
        return [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]
    stat = tf.io.gfile.stat(path)
    return [stat.length, stat.mtime_nsec]


def _read_record(record: str) -> dict[str, list[int | None]]:
    """The shards `record` lists as checked: {path: [*_stat(path), the count checked for]};
    none when it is absent or cannot be read (then every shard is read again: the record only
    saves time)."""
    try:
        with tf.io.gfile.GFile(record, "r") as f:
            checked = json.load(f)["checked"]
        return {str(k): list(v) for k, v in checked.items()}
    except tf.errors.NotFoundError:
        return {}
    except (tf.errors.OpError, ValueError, KeyError, TypeError, AttributeError) as err:
        log.warning("reading every shard again: the record %s cannot be read (%s)", record, err)
        return {}


def _write_record(record: str, checked: dict[str, list[int | None]]) -> None:
    """Replace `record` whole: written beside it under a name of its own, then renamed over it.
    A failure only costs the next start a read of every shard, so it is logged, not raised."""
    partial = f"{record}.{uuid.uuid4().hex}.partial"
    try:
        tf.io.gfile.makedirs(posixpath.dirname(record))
        with tf.io.gfile.GFile(partial, "w") as f:
            json.dump({"checked": checked}, f)
        tf.io.gfile.rename(partial, record, overwrite=True)
    except tf.errors.OpError as err:
        log.warning("shards checked, but not recorded in %s (%s)", record, err)
        with contextlib.suppress(tf.errors.OpError):
            tf.io.gfile.remove(partial)


def _shard_problem(path: str, windows: int | None) -> str:
    """Why `path` is not whole GZIP data (complete members only) of `windows` TFRecords (any
    number when None), or "" when it is."""
    inflate = zlib.decompressobj(_GZIP_WBITS)
    records = _RecordCounter()
    offset = 0  # compressed bytes checked so far
    pending = False  # a member has begun and not yet ended
    with tf.io.gfile.GFile(path, "rb") as f:
        while chunk := f.read(_VERIFY_CHUNK):
            size = len(chunk)
            try:
                while chunk:
                    records.feed(inflate.decompress(chunk))  # checks each member's CRC-32, length
                    pending = not inflate.eof
                    if pending:
                        break
                    chunk = inflate.unused_data  # another member follows
                    inflate = zlib.decompressobj(_GZIP_WBITS)
            except zlib.error as err:
                return f"{err} (in its bytes {offset}-{offset + size})"
            offset += size
    if offset == 0:
        return "the file is empty; a shard holds at least one window"
    if pending:
        return f"truncated: the file ends inside its GZIP stream, after {offset} bytes"
    if not records.whole():
        return f"its data ends inside TFRecord {records.cut()}"
    if windows is not None and records.count != windows:
        return (
            f"it holds {records.count} windows where the manifest's counts (shard_windows, "
            f"windows) give it {windows}"
        )
    return ""


class _RecordCounter:
    """Counts the TFRecords in a stream fed piece by piece, by their length fields alone (the
    CRCs are TensorFlow's to check as it reads them)."""

    def __init__(self) -> None:
        self.count = 0
        self._header = b""  # the start of a record's header, split across pieces
        self._skip = 0  # bytes left of the current record's data and footer

    def feed(self, data: bytes) -> None:
        end = len(data)
        at = min(self._skip, end)  # the rest of a record begun in an earlier piece
        self._skip -= at
        if self._header:  # a header begun in an earlier piece
            taken = min(_RECORD_HEADER - len(self._header), end - at)
            self._header += data[at : at + taken]
            at += taken
            if len(self._header) < _RECORD_HEADER:
                return
            self.count += 1
            at += _LENGTH.unpack_from(self._header)[0] + _RECORD_FOOTER
            self._header = b""
        count, unpack = self.count, _LENGTH.unpack_from
        while at + _RECORD_HEADER <= end:  # whole headers in this piece
            count += 1
            at += _RECORD_HEADER + unpack(data, at)[0] + _RECORD_FOOTER
        self.count = count
        if at > end:
            self._skip = at - end
        elif at < end:
            self._header = data[at:end]

    def whole(self) -> bool:
        """The stream so far ends where a record ends."""
        return not self._skip and not self._header

    def cut(self) -> int:
        """The number (from 1) of the record the stream ends inside."""
        return self.count if self._skip else self.count + 1
