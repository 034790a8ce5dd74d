"""Local paths a command will write under, checked before it writes anything.

A path a user names that cannot be written (a file where a folder must be, a folder where a
file must be) is one line naming the option and the fix, not the NotADirectoryError or
FileExistsError a mkdir deep in the run would end in. A gs:// path is not checked here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from contracts.errors import UserError


def check_folder(path: str | Path, option: str) -> None:
    """Refuse `path` as the folder option `option` names (created if missing) where it, or a
    folder above it, is a file, or where the folder it would go in cannot be written."""
    wanted = Path(path).absolute()
    at = _existing(wanted)
    if at == wanted and not at.is_dir():
        raise UserError(f"{option} {path} is a file, not a folder: give a folder")
    _check_writable(at, path, option)


def check_output(path: str | Path, option: str, suffixes: Sequence[str]) -> None:
    """Refuse `path` as the file option `option` names, to be written with one of `suffixes`
    (".yaml"), where it is a folder, has another suffix, or its folder cannot be made."""
    if Path(path).is_dir():
        raise UserError(f"{option} {path} is a folder: give a file, e.g. {path}/out{suffixes[0]}")
    if Path(path).suffix not in suffixes:
        raise UserError(f"{option} {path}: give a file name ending {' or '.join(suffixes)}")
    _check_writable(_existing(Path(path).absolute().parent), path, option)


def _existing(path: Path) -> Path:
    """`path` or its nearest ancestor that exists."""
    return next((at for at in (path, *path.parents) if at.exists()), Path(path.anchor))


def _check_writable(at: Path, path: str | Path, option: str) -> None:
    """Refuse `path` when `at`, the folder that exists nearest it, is not a folder or cannot
    be written into."""
    if not at.is_dir():
        raise UserError(f"{option} {path}: {at} is a file, not a folder; give a path in a folder")
    if not os.access(at, os.W_OK | os.X_OK):
        raise UserError(f"{option} {path}: {at} cannot be written; give a path you can write")
