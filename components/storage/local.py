"""Local disk: listing by path or glob, and writes that appear whole (a sibling, then a rename)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

from components.storage.uris import FileInfo, has_wildcard, sha256_file
from contracts.errors import UserError

# ---- listing --------------------------------------------------------------------------------


def list_files(pattern: str) -> list[FileInfo]:
    """`storage.list_files` for a local file, folder or glob; each file's sha256 is computed."""
    path = Path(pattern)
    if has_wildcard(pattern):
        anchor = Path(path.anchor) if path.is_absolute() else Path(".")
        relative = str(path.relative_to(path.anchor)) if path.is_absolute() else pattern
        found = [p for p in anchor.glob(relative) if p.is_file()]
    elif path.is_dir():
        found = [p for p in path.rglob("*") if p.is_file()]
    elif path.is_file():
        found = [path]
    else:
        raise UserError(f"corpus not found: {pattern!r} is not a file, folder or matching glob")
    base = path.parent if path.is_file() else (path if path.is_dir() else Path(_glob_root(pattern)))
    found = [p for p in found if not _hidden_path(p, base)]
    files = sorted({p.resolve() for p in found})
    return [FileInfo(str(p), p.stat().st_size, sha256_file(p)) for p in files]


def _glob_root(pattern: str) -> str:
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
    return {
        p.relative_to(root).as_posix(): FileInfo(str(p), p.stat().st_size, "")
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


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


# ---- writes that appear whole ---------------------------------------------------------------


def _temp_sibling(final: Path) -> Path:
    return final.parent / f".{final.name}.tmp-{secrets.token_hex(4)}"


def write_bytes(final_path: Path, data: bytes) -> None:
    """Write a file through a temporary sibling and one rename: readers never see half."""
    final_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_sibling(final_path)
    try:
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
    tmp_path = _temp_sibling(final_path)
    tmp_path.mkdir()
    try:
        yield tmp_path
        if final_path.is_dir() and not any(final_path.iterdir()):
            final_path.rmdir()
        os.rename(tmp_path, final_path)
    except BaseException:
        shutil.rmtree(tmp_path, ignore_errors=True)
        raise


def publish_dir(source: Path, final_path: Path) -> None:
    """Copy local folder `source` beside `final_path`, then rename it into place.

    Raises FileExistsError if `final_path` exists, so two publishers never overwrite each other.
    """
    final_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_sibling(final_path)
    try:
        shutil.copytree(source, tmp)
        if final_path.exists():
            raise FileExistsError(final_path)
        os.rename(tmp, final_path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
