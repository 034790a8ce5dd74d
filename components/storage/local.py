"""Local disk: listing by path or glob, and writes that appear whole (a sibling, then a rename)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import os
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from components.storage.uris import FileInfo, ObjectChangedError, has_wildcard, sha256_file
from contracts.errors import UserError

# ---- listing --------------------------------------------------------------------------------


def list_files(pattern: str) -> list[FileInfo]:
    """`storage.list_files` for a local file, folder or glob; each file's sha256 is computed.

    A path that exists is taken as it is written, even when its name holds `[`, `?` or `*`
    (`notes[1].txt`) or starts with a dot: only a path that does not exist is a glob. Hidden
    files and folders under a folder or a glob are skipped (.git/, temps of a writer).
    """
    path = Path(pattern)
    if path.is_file():
        found = [path]
    elif path.is_dir():
        found = [p for p in path.rglob("*") if p.is_file() and not _hidden_path(p, path)]
    elif has_wildcard(pattern):
        anchor = Path(path.anchor) if path.is_absolute() else Path(".")
        relative = str(path.relative_to(path.anchor)) if path.is_absolute() else pattern
        base = Path(glob_root(pattern))
        found = [p for p in anchor.glob(relative) if p.is_file() and not _hidden_path(p, base)]
    else:
        raise UserError(
            f"corpus not found: {pattern!r} is not a file, folder or matching glob (relative "
            f"paths start at {Path.cwd()}); check the path, or give a gs:// URI"
        )
    files = sorted({p.resolve() for p in found})
    return [FileInfo(str(p), p.stat().st_size, sha256_file(p)) for p in files]


def glob_root(pattern: str) -> str:
    """The fixed folder part of a glob: everything before the first wildcard segment."""
    parts = Path(pattern).parts
    fixed = [p for p in parts[: next(i for i, p in enumerate(parts) if has_wildcard(p))]]
    return str(Path(*fixed)) if fixed else "."


def _hidden_path(path: Path, base: Path) -> bool:
    """True if any part of `path` below `base` starts with '.' (.git/, .staging-*, temps)."""
    try:
        parts = path.resolve().relative_to(base.resolve()).parts
    except ValueError:
        parts = path.parts[-1:]
    return any(part.startswith(".") for part in parts)


def list_tree(uri: str) -> dict[str, FileInfo]:
    """`storage.list_tree` for a local folder: every file under it, by '/'-separated name."""
    root = Path(uri)
    if not root.is_dir():
        return {}
    found = {}
    # Another process may remove what was just listed: a temp file `create_exclusive` renames
    # away, or a folder a promoter deletes. What is gone is not part of the tree (os.walk skips
    # a folder that vanished; a file that did is skipped here).
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder, name)
            try:
                info = path.stat()
            except OSError:  # gone meanwhile; or a link to nowhere, in a loop, not ours to read
                continue
            if stat.S_ISREG(info.st_mode):
                found[path.relative_to(root).as_posix()] = FileInfo(str(path), info.st_size, "")
    return dict(sorted(found.items()))


def has_content(uri: str) -> bool:
    """True if `uri` is a file, or a folder holding anything."""
    path = Path(uri)
    return path.exists() and not (path.is_dir() and not any(path.iterdir()))


def folders_holding(uri: str, name: str) -> list[str]:
    """Names of the immediate sub-folders of a local folder that hold a file `name`."""
    root = Path(uri)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / name).is_file())


# ---- reads checked against the listing ------------------------------------------------------


class _CheckedFileReader(io.RawIOBase):
    """A read of one local file that checks, at its end, it read the bytes that were listed.

    The dataset version is named from the listing's sha256; a file edited between listing and
    reading (or while being read) would put new text under the old bytes' name.
    """

    def __init__(self, path: str, expect: FileInfo) -> None:
        super().__init__()
        self._path = path
        self._expect = expect
        self._file = open(path, "rb")  # noqa: SIM115 (closed by close())
        self._digest = hashlib.sha256()
        self._size = 0
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._file.readinto(buffer)
        if n:
            self._digest.update(memoryview(buffer)[:n])
            self._size += n
        elif not self._done:
            self._done = True
            self._verify()
        return n or 0

    def _verify(self) -> None:
        digest = self._digest.hexdigest()
        if self._size != self._expect.size or digest != self._expect.sha256:
            raise ObjectChangedError(
                f"file {self._path} changed while it was read ({self._expect.size} bytes with "
                f"sha256 {self._expect.sha256[:12]}… when listed, {self._size} bytes with "
                f"{digest[:12]}… read); rerun once nothing writes to it"
            )

    def close(self) -> None:
        if not self.closed:
            self._file.close()
        super().close()


def open_read(path: str, expect: FileInfo | None, buffer_size: int) -> IO[bytes]:
    """Open a local file; with `expect` (a listing with its sha256) the read is checked."""
    if expect is None or not expect.sha256:
        return open(path, "rb")  # noqa: SIM115 (the caller closes it)
    return io.BufferedReader(_CheckedFileReader(path, expect), buffer_size=buffer_size)


# ---- writes that appear whole ---------------------------------------------------------------


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # no space, over quota, over a size limit


@contextlib.contextmanager
def disk_errors(target: Path, what: str = "") -> Iterator[None]:
    """Turn "no space left" (or a quota or file-size limit) while writing `target` (`what` it
    is, when its name does not say) into one UserError that names it; the writers here remove
    their temporaries on the way out."""
    try:
        yield
    except OSError as e:
        if e.errno not in _DISK_FULL:
            raise
        named = f"{target} ({what})" if what else str(target)
        raise UserError(
            f"disk full while writing {named}: {e.strerror}; free space there (or raise the "
            "quota) and run the step again: nothing half-written was left"
        ) from None


STALE_TEMP_S = 6 * 3600.0  # a temporary sibling untouched this long belongs to a dead writer


def _temp_sibling(final: Path) -> Path:
    return final.parent / f".{final.name}.tmp-{secrets.token_hex(4)}"


def _clear_stale_temps(folder: Path) -> None:
    """Remove the temporaries killed writers (SIGKILL, OOM) left in `folder`, whatever name
    each was for: a run started again after a killed one writes the same name once, and a
    killed push's number is never written again.

    Listings skip hidden names, so they were never read; this only gives the space back. A
    temporary is stale when nothing in it changed for STALE_TEMP_S: a live writer adding files
    to a sub-folder (tokenize's shards) leaves the top folder's mtime as it was.
    """
    cutoff = time.time() - STALE_TEMP_S
    for old in folder.glob(".*.tmp-*"):
        with contextlib.suppress(OSError):
            if _untouched_since(old, cutoff):
                shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()


def _untouched_since(path: Path, cutoff: float) -> bool:
    """True if `path` and, for a folder, everything under it last changed before `cutoff`."""
    if path.lstat().st_mtime >= cutoff:
        return False
    if path.is_dir() and not path.is_symlink():
        for root, dirs, files in os.walk(path):
            for name in (*dirs, *files):
                if os.lstat(os.path.join(root, name)).st_mtime >= cutoff:
                    return False
    return True


def write_bytes(final_path: Path, data: bytes) -> None:
    """Write a file through a temporary sibling and one rename: readers never see half."""
    final_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_sibling(final_path)
    try:
        with disk_errors(final_path):
            tmp.write_bytes(data)
        os.replace(tmp, final_path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_dir(final_path: Path) -> Iterator[Path]:
    """Yield a temporary sibling folder renamed to `final_path` if the block succeeds.

    If `final_path` already exists as an empty folder (KFP may create it) it is replaced.
    """
    final_path.parent.mkdir(parents=True, exist_ok=True)
    _clear_stale_temps(final_path.parent)
    tmp_path = _temp_sibling(final_path)
    tmp_path.mkdir()
    try:
        with disk_errors(final_path):
            yield tmp_path
        if final_path.is_dir() and not any(final_path.iterdir()):
            final_path.rmdir()
        _rename_new(tmp_path, final_path)
    except BaseException:
        shutil.rmtree(tmp_path, ignore_errors=True)
        raise


def link_or_copy(source: Path, destination: Path) -> None:
    """Put `source` at `destination` (a new name): a hard link on the same file system, which
    costs nothing whatever the size, else a copy."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, destination)
    except OSError:
        shutil.copyfile(source, destination)


def create_file(final_path: Path, data: bytes) -> bool:
    """Create a file only if none exists, whole (a temporary sibling, then a hard link).

    `link` fails if the name exists, atomically, so of two writers exactly one returns True.
    """
    final_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_sibling(final_path)
    try:
        with disk_errors(final_path):
            tmp.write_bytes(data)
        os.link(tmp, final_path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def update_file(final_path: Path, change: Callable[[bytes | None], bytes]) -> bytes:
    """Read, change and rewrite a file while holding an exclusive lock beside it.

    Every updater takes the same `flock` on `.<name>.lock`, so none loses another's change;
    the write itself is a temporary sibling and a rename, so readers never see half.
    """
    with exclusive_lock(final_path):
        old = final_path.read_bytes() if final_path.is_file() else None
        new = change(old)
        write_bytes(final_path, new)
        return new


def lock_path(path: Path) -> Path:
    """The file whose `flock` guards `path` (exclusive_lock creates it and leaves it)."""
    return path.parent / f".{path.name}.lock"


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold the exclusive `flock` every updater of `path` takes (`.<name>.lock` beside it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path(path), "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _rename_new(tmp: Path, final_path: Path) -> None:
    """Rename a folder into place; FileExistsError if another writer's folder got there first.

    rename(2) onto a non-empty folder fails with ENOTEMPTY (or EEXIST), not FileExistsError.
    """
    try:
        os.rename(tmp, final_path)
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
            taken = FileExistsError(errno.EEXIST, "published by another writer", str(final_path))
            raise taken from e
        raise


def _copy_tree(source: Path, target: Path) -> None:
    """Copy a folder file by file; unlike `shutil.copytree`, the first OSError is raised as is
    (copytree gathers them into one `shutil.Error` with no errno)."""
    target.mkdir()
    for path in sorted(source.rglob("*")):
        copy = target / path.relative_to(source)
        if path.is_dir():
            copy.mkdir()
        else:
            shutil.copy2(path, copy)


def publish_dir(source: Path, final_path: Path) -> None:
    """Copy local folder `source` beside `final_path`, then rename it into place.

    Raises FileExistsError if `final_path` exists, so two publishers never overwrite each other.
    """
    final_path.parent.mkdir(parents=True, exist_ok=True)
    _clear_stale_temps(final_path.parent)
    tmp = _temp_sibling(final_path)
    try:
        with disk_errors(final_path):
            _copy_tree(source, tmp)
        if final_path.exists():
            raise FileExistsError(final_path)
        _rename_new(tmp, final_path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
