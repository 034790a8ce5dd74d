"""The storage layer: the only module that moves bytes for the pipeline steps.

Every function takes a local path. `gs://` URIs go through google-cloud-storage (a later
change adds them behind these same functions); the trainer reads `gs://` itself through
`tf.io.gfile`, never through this module.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trainer.errors import UserError

_CHUNK = 1 << 20


@dataclass(frozen=True)
class FileInfo:
    """One source file: where it is, how big, and a content fingerprint."""

    uri: str  # the path as given (absolute)
    size: int  # bytes
    sha256: str  # hex digest of the content


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Return the hex sha256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def list_files(pattern: str) -> list[FileInfo]:
    """Resolve a file, a folder (recursively) or a glob into sorted files with fingerprints.

    Hidden files and folders (names starting with '.') are skipped, so half-written
    temporaries are never read as input.
    """
    path = Path(pattern)
    if any(ch in pattern for ch in "*?["):
        anchor = Path(path.anchor) if path.is_absolute() else Path(".")
        relative = str(path.relative_to(path.anchor)) if path.is_absolute() else pattern
        found = [p for p in anchor.glob(relative) if p.is_file()]
    elif path.is_dir():
        found = [p for p in path.rglob("*") if p.is_file()]
    elif path.is_file():
        found = [path]
    else:
        raise UserError(f"corpus not found: {pattern!r} is not a file, folder or matching glob")
    found = [p for p in found if not any(part.startswith(".") for part in p.parts[-1:])]
    files = sorted({p.resolve() for p in found})
    return [FileInfo(str(p), p.stat().st_size, sha256_file(p)) for p in files]


def _temp_sibling(final: Path) -> Path:
    return final.parent / f".{final.name}.tmp-{secrets.token_hex(4)}"


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary folder beside `final`; rename it to `final` only if the block succeeds.

    A failure removes the temporary folder, so no reader ever sees a half-written output. If
    `final` already exists as an empty folder (KFP may create it) it is replaced.
    """
    final_path = Path(final)
    final_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_sibling(final_path)
    tmp.mkdir()
    try:
        yield tmp
        if final_path.is_dir() and not any(final_path.iterdir()):
            final_path.rmdir()
        os.rename(tmp, final_path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def publish_dir(source: str | os.PathLike[str], final: str | os.PathLike[str]) -> None:
    """Copy folder `source` to `final` atomically: a copy beside it, then one rename.

    Raises FileExistsError if `final` exists, so two publishers never overwrite each other.
    """
    final_path = Path(final)
    final_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_sibling(final_path)
    try:
        shutil.copytree(source, tmp)
        if final_path.exists():
            raise FileExistsError(final_path)
        os.rename(tmp, final_path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write a text file through a temporary sibling and a rename."""
    final_path = Path(path)
    final_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_sibling(final_path)
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, final_path)
    finally:
        tmp.unlink(missing_ok=True)


def serving_versions(destination: str | os.PathLike[str]) -> list[int]:
    """Return the complete model versions under a TF Serving destination, ascending.

    A version is a folder named by an integer that holds `saved_model.pb`; anything else
    (temporaries, half-copied folders, stray files) is ignored.
    """
    root = Path(destination)
    if not root.is_dir():
        return []
    return sorted(
        int(p.name)
        for p in root.iterdir()
        if p.name.isdigit() and (p / "saved_model.pb").is_file()
    )


def next_serving_version(destination: str | os.PathLike[str]) -> int:
    """Return one more than the highest integer-named entry, complete or not."""
    root = Path(destination)
    taken = [int(p.name) for p in root.iterdir() if p.name.isdigit()] if root.is_dir() else []
    return max(taken, default=0) + 1
