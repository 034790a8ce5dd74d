"""Atomic publishing: a folder appears at its final name whole, or not at all.

Locally a folder is written beside its final name and renamed into place. GCS has no rename, so
on `gs://` a folder goes through a staging protocol (`_publish_gcs`), and `finish_publishes`
completes or cleans up what a crashed publisher left.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from google.api_core import exceptions as gexc

from components.storage import gcs, local
from components.storage.files import (
    delete_tree,
    list_tree,
    local_copy,
    read_bytes,
    upload_dir,
    write_bytes,
)
from components.storage.uris import GS, crc32c_file, folder_key, is_gcs, join, split_gcs
from contracts.errors import UserError

STAGING_PREFIX = ".staging-"  # gs:// publish: `<parent>/.staging-<name>/` beside `<parent>/<name>/`
STAGING_MANIFEST = ".publish.json"  # written last into a staging folder: the upload is complete
STALE_STAGING_S = 3600.0  # an unfinished staging upload older than this is abandoned


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike[str], ready: str = "") -> Iterator[Path]:
    """Yield a local temporary folder that becomes `final` only if the block succeeds.

    Local: the folder is a sibling of `final`, renamed into place; if `final` already exists
    as an empty folder (KFP may create it) it is replaced. gs://: the folder is published
    with `publish_dir`, `ready` (a relative name, such as the manifest) copied last. A
    failure leaves nothing at `final`.
    """
    if not is_gcs(final):
        with local.atomic_dir(Path(final)) as tmp:
            yield tmp
        return
    with tempfile.TemporaryDirectory(prefix="gptpipe-") as tmp_name:
        yield Path(tmp_name)
        publish_dir(tmp_name, str(final), ready=ready)


def publish_dir(
    source: str | os.PathLike[str], final: str | os.PathLike[str], ready: str = ""
) -> None:
    """Copy folder `source` to `final` atomically, so no reader sees part of it.

    Local: a copy beside `final`, then one rename. gs:// (GCS has no rename) follows the
    staging protocol of `_publish_gcs`; readers must treat `ready` (a relative name) as the
    signal that the folder is complete. `source` may be local or gs:// in either case.

    Raises FileExistsError if `final` exists (gs://: holds `ready`, or anything when
    `ready` is ""), so two publishers never overwrite each other.
    """
    if is_gcs(final):
        _publish_gcs(str(source), str(final), ready)
        return
    with local_copy(str(source)) as local_source:
        local.publish_dir(local_source, Path(final))


def staging_uri(final: str) -> str:
    """Where `_publish_gcs` stages `final`: `<parent>/.staging-<name>`."""
    parent, _, name = final.rstrip("/").rpartition("/")
    return f"{parent}/{STAGING_PREFIX}{name}"


def names_taken(parent: str | os.PathLike[str]) -> list[str]:
    """The names under `parent` that a new publish cannot take; none if it is missing.

    Every entry there and, on gs://, every folder still being staged, by its final name.
    """
    if is_gcs(parent):
        return [n.removeprefix(STAGING_PREFIX) for n in gcs.subfolders(str(parent))]
    root = Path(parent)
    return [p.name for p in root.iterdir()] if root.is_dir() else []


def _publish_gcs(source: str, final: str, ready: str) -> None:
    """Publish a folder to gs:// without a rename.

    1. upload (or server-side copy) every file to `<parent>/.staging-<name>/`, then write
       `.publish.json` there listing each name with its crc32c: the staging is complete;
    2. copy each staged object into `final/`, `ready` last (TF Serving loads a version once
       its SavedModel graph appears), `ready` only if no one else published it (precondition);
    3. check `final/` holds exactly the listed names with the listed crc32c;
    4. delete the staging folder.

    An interruption before step 1 ends leaves only a staging folder without `.publish.json`;
    after it, a staging folder `finish_publishes` completes. `final/` never holds `ready`
    without everything else.
    """
    staging = staging_uri(final)
    if _taken(final, ready):
        raise FileExistsError(final)
    expected = _stage(source, staging)
    write_bytes(join(staging, STAGING_MANIFEST), json.dumps(expected, sort_keys=True).encode())
    _promote(staging, final, expected, ready)


def _taken(final: str, ready: str) -> bool:
    existing = list_tree(final)
    return ready in existing if ready else bool(existing)


def _stage(source: str, staging: str) -> dict[str, str]:
    """Put every file of `source` under `staging`; return {relative name: crc32c}."""
    delete_tree(staging)
    if is_gcs(source):
        objects = list_tree(source)
        if not objects:
            raise UserError(f"nothing to publish: no objects under {source}")
        infos = gcs.parallel(
            lambda rel: gcs.copy_object(objects[rel].uri, join(staging, rel)),
            objects,
            gcs.WORKERS,
        )
        return {rel: info.crc32c for rel, info in zip(objects, infos, strict=True)}
    files = list_tree(source)
    if not files:
        raise UserError(f"nothing to publish: folder {source} is empty")
    expected = {rel: crc32c_file(info.uri) for rel, info in files.items()}
    uploaded = upload_dir(source, staging)
    _check_same(staging, expected, {rel: info.crc32c for rel, info in uploaded.items()})
    return expected


def _promote(staging: str, final: str, expected: dict[str, str], ready: str) -> None:
    """Copy the staged objects into `final` (`ready` last), verify, delete the staging."""
    rest = sorted(rel for rel in expected if rel != ready)
    gcs.parallel(
        lambda rel: gcs.copy_object(join(staging, rel), join(final, rel)), rest, gcs.WORKERS
    )
    if ready in expected:
        try:
            gcs.copy_object(join(staging, ready), join(final, ready), if_generation_match=0)
        except gexc.PreconditionFailed:
            raise FileExistsError(final) from None
    found = {rel: info.crc32c for rel, info in list_tree(final).items()}
    _check_same(final, expected, found)
    delete_tree(staging)


def _check_same(where: str, expected: dict[str, str], found: dict[str, str]) -> None:
    if found != expected:
        missing = sorted(set(expected) - set(found))
        extra = sorted(set(found) - set(expected))
        differ = sorted(r for r in set(found) & set(expected) if found[r] != expected[r])
        raise RuntimeError(
            f"publish check failed at {where}: {len(found)} objects, expected {len(expected)}; "
            f"missing {missing}, unexpected {extra}, crc32c differs for {differ}"
        )


def finish_publishes(
    parent: str, ready: str = "", stale_after_s: float = STALE_STAGING_S
) -> dict[str, str]:
    """Complete or clean up the gs:// publishes under `parent` that a crash interrupted.

    A staging folder with `.publish.json` was fully uploaded: its copy into place is
    finished. One without it is abandoned once its newest object is older than
    `stale_after_s` (younger ones may belong to a publisher still uploading): the staging and
    any objects already in its final folder (never `ready`, which is only copied after the
    manifest exists) are deleted. Returns {final URI: "finished" | "cleaned"}.
    Local publishes need nothing: a dead publisher leaves only a hidden temporary folder.
    """
    if not is_gcs(parent):
        return {}
    bucket, key = split_gcs(parent)
    folder = folder_key(key)
    done: dict[str, str] = {}
    for name in sorted(gcs.subfolders(parent)):
        if name.startswith(STAGING_PREFIX):
            final = f"{GS}{bucket}/{folder}{name[len(STAGING_PREFIX) :]}"
            staging = f"{GS}{bucket}/{folder}{name}"
            outcome = _finish_one(staging, final, ready, stale_after_s)
            if outcome:
                done[final] = outcome
    return done


def _finish_one(staging: str, final: str, ready: str, stale_after_s: float) -> str:
    staged = list_tree(staging)
    if STAGING_MANIFEST in staged:
        expected = json.loads(read_bytes(staged[STAGING_MANIFEST].uri))
        if ready in list_tree(final):
            _check_same(final, expected, {r: i.crc32c for r, i in list_tree(final).items()})
            delete_tree(staging)
        else:
            _promote(staging, final, expected, ready)
        return "finished"
    newest = max((gcs.updated(info.uri) for info in staged.values()), default=0.0)
    if time.time() - newest < stale_after_s:
        return ""
    if ready and ready not in list_tree(final):
        delete_tree(final)
    delete_tree(staging)
    return "cleaned"
