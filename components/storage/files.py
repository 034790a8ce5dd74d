"""File and folder operations on either kind of address: each picks local disk or GCS.

Every function takes a local path or a `gs://bucket/key` URI, and does the same thing on both;
`local.py` and `gcs.py` hold the two ways of doing it.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from components.storage import gcs, local
from components.storage.uris import CHUNK, FileInfo, crc32c_file, is_gcs, join, unsafe_name
from contracts.errors import UserError

# ---- list -----------------------------------------------------------------------------------


def list_files(pattern: str) -> list[FileInfo]:
    """Resolve a file, a folder (recursively) or a glob into sorted files with fingerprints.

    Works for local paths and gs:// URIs. Hidden files and folders (names starting with '.')
    are skipped, so half-written temporaries and staging folders are never read as input. A
    gs:// listing downloads nothing: the fingerprints are GCS's own crc32c and md5.
    """
    return gcs.list_files(pattern) if is_gcs(pattern) else local.list_files(pattern)


def list_tree(uri: str) -> dict[str, FileInfo]:
    """Every file under a folder (hidden ones included), keyed by its '/'-separated relative name.

    A missing folder is empty.
    """
    return gcs.list_tree(uri) if is_gcs(uri) else local.list_tree(uri)


def has_content(uri: str) -> bool:
    """True if `uri` is a file or object, or a folder holding anything."""
    return gcs.has_content(uri) if is_gcs(uri) else local.has_content(uri)


def check_folder(uri: str, what: str) -> None:
    """Raise UserError if `uri` is a file or an object, so it cannot be a folder."""
    if not is_gcs(uri):
        if Path(uri).exists() and not Path(uri).is_dir():
            raise UserError(f"{what} is not a folder: {uri} is a file")
        return
    if gcs.is_object(uri):
        raise UserError(f"{what} is not a folder: {uri} is an object; give a prefix")


def folders_holding(uri: str | os.PathLike[str], name: str) -> list[str]:
    """Names of the immediate sub-folders of `uri` that hold a file `name`, sorted; [] if none."""
    if is_gcs(uri):
        return gcs.folders_holding(str(uri), name)
    return local.folders_holding(str(uri), name)


def tree_crc32c(uri: str) -> dict[str, str]:
    """{relative name: crc32c} of every file under a folder (GCS's listing for gs://)."""
    files = list_tree(uri)
    if is_gcs(uri):
        return {rel: info.crc32c for rel, info in files.items()}
    return {rel: crc32c_file(info.uri) for rel, info in files.items()}


def same_files(a: str, b: str) -> bool:
    """True if two folders (local or gs://) hold the same names with the same bytes (crc32c)."""
    return tree_crc32c(a) == tree_crc32c(b)


# ---- read -----------------------------------------------------------------------------------


@contextlib.contextmanager
def open_read(uri: str, expect: FileInfo | None = None) -> Iterator[IO[bytes]]:
    """Open a file or object for a streamed binary read.

    The read is checked against `expect` (a FileInfo from `list_files`): if a gs:// object's
    generation or bytes, or a local file's size or sha256, differ from the listing, reaching
    the end raises ObjectChangedError, so a step never mixes a fingerprint of one version with
    the bytes of another.
    """
    reader = (
        gcs.open_read(uri, expect, buffer_size=CHUNK)
        if is_gcs(uri)
        else local.open_read(uri, expect, buffer_size=CHUNK)
    )
    with reader as f:
        yield f


def read_bytes(uri: str, expect: FileInfo | None = None) -> bytes:
    """Read a whole file or object (checked as `open_read` does)."""
    with open_read(uri, expect) as f:
        return f.read()


# ---- write, copy and delete -----------------------------------------------------------------


def write_bytes(uri: str, data: bytes) -> None:
    """Write a file or object in one step: readers see the old bytes or the new, never half."""
    if not is_gcs(uri):
        local.write_bytes(Path(uri), data)
        return
    gcs.write_bytes(uri, data)


def create_exclusive(uri: str, data: bytes) -> bool:
    """Create a file or object only if none exists: True if this call created it.

    Of any number of concurrent callers exactly one gets True (local: a hard link, which
    fails on an existing name; gs://: `ifGenerationMatch=0`). Make `data` unique to the
    caller: a retried GCS create that had landed reads back as its own.
    """
    if is_gcs(uri):
        return gcs.create_object(uri, data)
    return local.create_file(Path(uri), data)


def update_bytes(uri: str, change: Callable[[bytes | None], bytes], tries: int = 30) -> bytes:
    """Read-modify-write one file or object so that no concurrent update is lost.

    `change` gets the current bytes (None if absent) and returns the new ones; it may run
    more than once, so it must be a pure function of its input. Local: under an exclusive
    lock. gs://: written only if the generation read is still current, else read again.
    """
    if not is_gcs(uri):
        return local.update_file(Path(uri), change)
    for attempt in range(tries):
        old, generation = gcs.read_generation(uri)
        new = change(old)
        if gcs.write_if_generation(uri, new, generation):
            return new
        time.sleep(random.uniform(0, min(0.05 * 2**attempt, 2.0)))
    raise RuntimeError(f"{uri} kept changing: {tries} conditional writes lost their race")


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write a UTF-8 text file (local: a temporary sibling and a rename; gs://: one upload)."""
    write_bytes(str(path), text.encode("utf-8"))


def copy(source: str, destination: str) -> None:
    """Copy one file or object; gs:// to gs:// is a server-side copy (no bytes through here)."""
    if is_gcs(source) and is_gcs(destination):
        gcs.copy_object(source, destination)
    elif is_gcs(destination):
        gcs.upload_file(source, destination)
    elif is_gcs(source):
        gcs.download_file(source, destination)
    else:
        Path(destination).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination)


def upload_dir(
    source: str | os.PathLike[str], destination: str, workers: int = gcs.WORKERS
) -> dict[str, FileInfo]:
    """Upload every file under a local folder to a gs:// prefix on a thread pool."""
    files = list_tree(str(source))
    infos = gcs.parallel(
        lambda rel: gcs.upload_file(files[rel].uri, join(destination, rel)), files, workers
    )
    return dict(zip(files, infos, strict=True))


def download_dir(
    source: str, destination: str | os.PathLike[str], workers: int = gcs.WORKERS
) -> int:
    """Download every object under a gs:// prefix into a local folder; return the count."""
    objects = list_tree(source)
    if not objects:
        raise UserError(f"nothing to download: no objects under {source}; check the prefix")
    escaping = sorted(rel for rel in objects if unsafe_name(rel))
    if escaping:
        raise UserError(
            f"refusing to download {source}: object {escaping[0]!r} under it would be written "
            f"outside {destination} ('..', '.' or a leading '/' in its name); rename or remove it"
        )
    gcs.parallel(
        lambda rel: gcs.download_file(objects[rel].uri, Path(destination, rel)), objects, workers
    )
    return len(objects)


def delete_tree(uri: str, workers: int = gcs.WORKERS) -> None:
    """Delete a folder and everything under it, folder markers too; a missing one is fine."""
    if not is_gcs(uri):
        shutil.rmtree(uri, ignore_errors=True)
        return
    objects = [info.uri for info in list_tree(uri).values()] + gcs.folder_markers(uri)
    gcs.parallel(gcs.delete_object, objects, workers)


def delete_file(uri: str) -> None:
    """Delete one file or object; a missing one is fine."""
    if is_gcs(uri):
        gcs.delete_object(uri)
    else:
        Path(uri).unlink(missing_ok=True)


def delete_folder_markers(uri: str) -> int:
    """Delete the empty `<folder>/` objects under a gs:// folder; return how many.

    TensorFlow's GCS file system writes one for every folder it creates (`tf.io.gfile.makedirs`,
    and a rename copies them); tools that map objects to files, as KFP's launcher does when it
    downloads an artifact, turn each into a file where a folder must go. Local paths: nothing.
    """
    if not is_gcs(uri):
        return 0
    markers = gcs.folder_markers(uri)
    gcs.parallel(gcs.delete_object, markers, gcs.WORKERS)
    return len(markers)


@contextlib.contextmanager
def local_copy(uri: str) -> Iterator[Path]:
    """Yield a local folder with the files of `uri`: itself, or a temporary download."""
    if not is_gcs(uri):
        yield Path(uri)
        return
    with tempfile.TemporaryDirectory(prefix="gptpipe-") as tmp:
        download_dir(uri, tmp)
        yield Path(tmp)
