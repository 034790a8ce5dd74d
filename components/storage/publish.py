"""Atomic publishing: a folder appears at its final name whole, or not at all.

Locally a folder is written beside its final name and renamed into place. GCS has no rename, so
on `gs://` a folder goes through a staging protocol (`_publish_gcs`), and `finish_publishes`
completes or cleans up what a crashed publisher left.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

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

STAGING_PREFIX = ".staging-"  # gs:// publish: `<parent>/.staging-<name>~<writer>/` beside `<name>/`
WRITER_SEP = "~"  # between the final name and the publisher's token in a staging folder's name
STAGING_MANIFEST = ".publish.json"  # written last into a staging folder: the upload is complete
STALE_STAGING_S = 3600.0  # an unfinished staging upload older than this is abandoned


@contextlib.contextmanager
def atomic_dir(
    final: str | os.PathLike[str], ready: str = "", include: Mapping[str, str] | None = None
) -> Iterator[Path]:
    """Yield a local temporary folder that becomes `final` only if the block succeeds.

    Local: the folder is a sibling of `final`, renamed into place; if `final` already exists
    as an empty folder (KFP may create it) it is replaced. gs://: the folder is published
    with `publish_dir`, `ready` (a relative name, such as the manifest) copied last. A
    failure leaves nothing at `final`.

    `include` adds files already written elsewhere, {relative name in `final`: uri}, without
    passing them through this machine: hard-linked (else copied) beside the block's files on
    local disk, copied server-side into the staging folder on gs:// (tokenize's shards,
    written by its parts).
    """
    include = include or {}
    if not is_gcs(final):
        with local.atomic_dir(Path(final)) as tmp:
            yield tmp
            for rel, uri in include.items():
                if is_gcs(uri):
                    raise ValueError(f"cannot include {uri} in the local folder {final}")
                local.link_or_copy(Path(uri), tmp / rel)
        return
    with tempfile.TemporaryDirectory(prefix="gptpipe-") as tmp_name:
        # the local copy fills this machine's disk, not the bucket: say which, in one line
        with local.disk_errors(Path(tmp_name), f"the local copy of {final}"):
            yield Path(tmp_name)
        _publish_gcs(tmp_name, str(final), ready, include)


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


def staging_uri(final: str, writer: str = "") -> str:
    """Where `_publish_gcs` stages `final`: `<parent>/.staging-<name>~<writer>`.

    Each publisher stages under its own `writer` token, so two publishers of one name (two
    runs tokenizing the same data) never delete or mix each other's uploads.
    """
    parent, _, name = final.rstrip("/").rpartition("/")
    return f"{parent}/{STAGING_PREFIX}{name}{WRITER_SEP + writer if writer else ''}"


def staged_name(folder: str) -> str:
    """The final name a staging folder's name stands for (`.staging-3~ab12` -> `3`)."""
    name = folder.removeprefix(STAGING_PREFIX)
    return name.rpartition(WRITER_SEP)[0] if WRITER_SEP in name else name


def names_taken(parent: str | os.PathLike[str]) -> list[str]:
    """The names under `parent` that a new publish cannot take; none if it is missing.

    Every entry there and, on gs://, every folder still being staged, by its final name.
    """
    if is_gcs(parent):
        return sorted({staged_name(n) for n in gcs.subfolders(str(parent))})
    root = Path(parent)
    return [p.name for p in root.iterdir()] if root.is_dir() else []


def _publish_gcs(
    source: str, final: str, ready: str, include: Mapping[str, str] | None = None
) -> None:
    """Publish a folder to gs:// without a rename.

    1. upload (or server-side copy) every file to this publisher's own staging folder
       (`staging_uri(final, token)`), then write `.publish.json` there listing each name with
       its crc32c: the staging is complete;
    2. copy each staged object into `final/` create-only (`ifGenerationMatch=0`), `ready`
       last (TF Serving loads a version once its SavedModel graph appears). An object that
       is already there counts only if it holds the same bytes: two publishers of identical
       content (a content-addressed dataset) both succeed, different content never mixes;
    3. check `final/` holds exactly the listed names with the listed crc32c;
    4. delete the staging folder.

    An interruption before step 1 ends leaves only a staging folder without `.publish.json`;
    after it, a staging folder `finish_publishes` completes. `final/` never holds `ready`
    without everything else.
    """
    if _taken(final, ready):
        raise FileExistsError(final)
    staging = staging_uri(final, secrets.token_hex(6))
    try:
        expected = _stage(source, staging)
        expected.update(_stage_included(include or {}, staging))
        write_bytes(join(staging, STAGING_MANIFEST), json.dumps(expected, sort_keys=True).encode())
    except Exception:  # a killed publisher leaves it: `finish_publishes` cleans it once stale
        with contextlib.suppress(Exception):
            delete_tree(staging)
        raise
    _promote(staging, final, expected, ready)


def _taken(final: str, ready: str) -> bool:
    existing = list_tree(final)
    return ready in existing if ready else bool(existing)


def _stage(source: str, staging: str) -> dict[str, str]:
    """Put every file of `source` under `staging`; return {relative name: crc32c}."""
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


def _stage_included(include: Mapping[str, str], staging: str) -> dict[str, str]:
    """Copy each {relative name: uri} into `staging` (server-side from gs://, else uploaded)."""

    def put(rel: str) -> str:
        uri, there = include[rel], join(staging, rel)
        info = gcs.copy_object(uri, there) if is_gcs(uri) else gcs.upload_file(uri, there)
        return info.crc32c

    names = list(include)
    return dict(zip(names, gcs.parallel(put, names, gcs.WORKERS), strict=True))


def _promote(staging: str, final: str, expected: dict[str, str], ready: str) -> None:
    """Copy the staged objects into `final` create-only (`ready` last), verify, clean up."""
    rest = sorted(rel for rel in expected if rel != ready)
    gcs.parallel(
        lambda rel: _copy_new(join(staging, rel), join(final, rel), expected[rel]),
        rest,
        gcs.WORKERS,
    )
    if ready in expected:
        _copy_new(join(staging, ready), join(final, ready), expected[ready])
    found = {rel: info.crc32c for rel, info in list_tree(final).items()}
    _check_same(final, expected, found)
    delete_tree(staging)


def _copy_new(source: str, destination: str, crc32c: str) -> None:
    """Copy an object to a name no one has written, or that already holds the same bytes.

    Raises FileExistsError when another publisher put different bytes there first. A staged
    object gone meanwhile is fine where `destination` holds its bytes: a staging folder can
    have two promoters (its publisher, and `finish_publishes` run by another step that took
    it for interrupted), and whichever finishes first deletes it, having copied everything.
    """
    try:
        gcs.copy_object(source, destination, if_generation_match=0)
    except gcs.api_errors().PreconditionFailed:
        there = gcs.stat(destination)
        if there is None or there.crc32c != crc32c:
            raise FileExistsError(
                f"{destination} was written by another publisher with different bytes"
            ) from None
    except gcs.ObjectNotFound:
        there = gcs.stat(destination)
        if there is None or there.crc32c != crc32c:
            raise


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
    finished (create-only, so a publisher still promoting it and this call agree, and
    whichever ends first deletes the staging, which the other then finds gone: `_copy_new`),
    or, if its final folder already holds `ready`, the staging is simply deleted: that folder
    is complete, whoever completed it. One without `.publish.json` is abandoned once its newest
    object is older than `stale_after_s` (younger ones may belong to a publisher still
    uploading), and deleted; its publisher never started copying into the final folder.
    Returns {final URI: "finished" | "cleaned"}. Local publishes need nothing: a dead
    publisher leaves only a hidden temporary folder.
    """
    if not is_gcs(parent):
        return {}
    bucket, key = split_gcs(parent)
    folder = folder_key(key)
    done: dict[str, str] = {}
    for name in sorted(gcs.subfolders(parent)):
        if name.startswith(STAGING_PREFIX):
            final = f"{GS}{bucket}/{folder}{staged_name(name)}"
            staging = f"{GS}{bucket}/{folder}{name}"
            try:
                outcome = _finish_one(staging, final, ready, stale_after_s)
            except gcs.ObjectNotFound:
                # The staging went while we read it: its publisher, or another step's call,
                # promoted or cleaned it (`_copy_new`): nothing is left for this call to do.
                continue
            if outcome:
                done[final] = outcome
    return done


def _finish_one(staging: str, final: str, ready: str, stale_after_s: float) -> str:
    staged = list_tree(staging)
    if STAGING_MANIFEST in staged:
        expected = json.loads(read_bytes(staged[STAGING_MANIFEST].uri))
        if ready and ready in list_tree(final):
            same = {r: i.crc32c for r, i in list_tree(final).items()} == expected
            delete_tree(staging)
            return "finished" if same else "cleaned"
        _promote(staging, final, expected, ready)
        return "finished"
    newest = max((gcs.updated(info.uri) for info in staged.values()), default=0.0)
    if time.time() - newest < stale_after_s:
        return ""
    delete_tree(staging)
    return "cleaned"
