"""Failures no restart can mend: a full disk or quota, a read-only file system, a denied
permission, a file size limit.

A restarted worker meets the same wall again, after training again from its backup (or from
step 1, when the backup could not be written either). So the trainer exits
`PERMANENT_ERROR_EXIT` with a record naming the path and the fix (contracts/termination.py),
and both launchers fail the job at once (docs/training.md, "Exit codes").

What is recognised, anywhere in an exception's chain (`ExportFailed` wraps the storage error):
- Python's `OSError`, by errno;
- TensorFlow's `OpError`, which its file systems raise with the errno's text
  (tsl/platform/errors.cc: `IOError(context, errno)` is "<context>; <strerror>", its code
  from `ErrnoToCode`): `ResourceExhaustedError` saying "No space left on device" or "Disk
  quota exceeded" (the class also means out of memory, which is not judged here),
  `PermissionDeniedError` (EACCES, EPERM, EROFS; on gs://, HTTP 403), and `OutOfRangeError`
  saying "File too large" (EFBIG: a file size limit).
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass

import tensorflow as tf


@dataclass(frozen=True)
class _Wall:
    """One kind of unmendable failure: how it is named, and the fix."""

    name: str  # lowercase, as the message says it
    fix: str


_ROOM = _Wall("no space left on device", "free space there, or give the run a root with room")
_QUOTA = _Wall("disk quota exceeded", "raise the quota, free space there, or use another root")
_READ_ONLY = _Wall("read-only file system", "give the run a root it can write")
_DENIED = _Wall(
    "permission denied",
    "let the workers' user (or service account) write there, or give the run another root",
)
_TOO_LARGE = _Wall("file too large", "raise the file size limit the workers run under (ulimit -f)")

_BY_ERRNO = {
    errno.ENOSPC: _ROOM,
    errno.EDQUOT: _QUOTA,
    errno.EROFS: _READ_ONLY,
    errno.EACCES: _DENIED,
    errno.EPERM: _DENIED,
    errno.EFBIG: _TOO_LARGE,
}
# strerror's text, as TensorFlow's messages carry it, for the errnos above
_BY_TEXT = {
    "No space left on device": _ROOM,
    "Disk quota exceeded": _QUOTA,
    "Read-only file system": _READ_ONLY,
    "Permission denied": _DENIED,
    "Operation not permitted": _DENIED,
    "File too large": _TOO_LARGE,
}
_TF_CLASSES = (
    tf.errors.ResourceExhaustedError,
    tf.errors.PermissionDeniedError,
    tf.errors.OutOfRangeError,
)
# "<path>; <strerror>": the path TensorFlow's IOError names (a local path or a gs:// URI)
_TF_PATH = re.compile(r"((?:[a-z][a-z0-9+.-]*://|/)[^\s;]+); (" + "|".join(_BY_TEXT) + ")")


def describe(err: BaseException) -> str | None:
    """One line naming the failure, where it struck and the fix, if `err` (or what caused it)
    is one no restart can mend; None otherwise."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        said = _said(cause)
        if said is not None:
            return said
        cause = cause.__cause__ or cause.__context__
    return None


def _said(err: BaseException) -> str | None:
    if isinstance(err, OSError) and err.errno in _BY_ERRNO:
        wall = _BY_ERRNO[err.errno]
        # a write's error, raised at the flush, names no file
        where = err.filename if err.filename is not None else "a file it wrote (unnamed)"
        return _line(wall, str(where))
    if isinstance(err, _TF_CLASSES):
        text = err.message if isinstance(err, tf.errors.OpError) else str(err)
        found = _TF_PATH.search(text)
        if found:
            return _line(_BY_TEXT[found.group(2)], found.group(1))
        if isinstance(err, tf.errors.PermissionDeniedError):  # gs://: HTTP 403, no strerror
            return _line(_DENIED, text.splitlines()[0] if text else type(err).__name__)
        named = next((w for t, w in _BY_TEXT.items() if t in text), None)
        if named is not None:
            return _line(named, text.splitlines()[0])
    return None


def _line(wall: _Wall, where: str) -> str:
    return f"{wall.name} at {where}: a restart cannot mend this; {wall.fix}"
