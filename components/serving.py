"""A TF Serving destination: its model versions, publishing the next one, and rolling back.

A destination is a local folder or a `gs://` prefix holding one folder per version, named by
an increasing integer; TF Serving serves the highest. A version is complete once its SavedModel
graph (`READY`) is there, so every publish copies that file last (`storage.publish_dir`). A
rollback re-publishes an earlier version as the newest and retires the models it took out of
service, so that no later push puts one of them back.
"""

from __future__ import annotations

import json
import logging
import os

from components import storage
from contracts.artifacts import RETIRED_FILE, SAVED_MODEL_FILE
from contracts.errors import UserError

log = logging.getLogger(__name__)

READY = SAVED_MODEL_FILE  # TF Serving loads a version once this file is there: it is copied last
_MAX_RACES = 5  # how many concurrent pushers may take our version number before we give up


def serving_versions(destination: str | os.PathLike[str]) -> list[int]:
    """Return the complete model versions under a TF Serving destination, ascending.

    A version is a folder named by an integer that holds the SavedModel graph (`READY`);
    anything else (temporaries, staging folders, half-copied folders, stray files) is ignored.
    """
    return sorted(int(n) for n in storage.folders_holding(destination, READY) if n.isdigit())


def next_serving_version(destination: str | os.PathLike[str]) -> int:
    """Return one more than the highest integer-named entry, complete, staged or not."""
    names = storage.names_taken(destination)
    return max((int(n) for n in names if n.isdigit()), default=0) + 1


def latest_version_uri(destination: str) -> str | None:
    """The model in service: the highest complete version under `destination`, or None."""
    versions = serving_versions(destination)
    return storage.join(destination, str(versions[-1])) if versions else None


def finish_interrupted(destination: str) -> dict[str, str]:
    """Finish or clean up the publishes a crash left under `destination` (gs:// only).

    Returns {version URI: "finished" | "cleaned"}, as `storage.finish_publishes` does.
    """
    return storage.finish_publishes(destination, ready=READY)


def publish_next(source: str, destination: str) -> int:
    """Publish `source` as the next free version, retrying if another pusher took it."""
    for _ in range(_MAX_RACES):
        version = next_serving_version(destination)
        try:
            storage.publish_dir(source, storage.join(destination, str(version)), ready=READY)
            return version
        except FileExistsError:
            continue
    raise RuntimeError(f"could not claim a version under {destination} after {_MAX_RACES} tries")


def rollback(destination: str, to_version: int) -> int:
    """Re-publish version `to_version` of `destination` as a new, highest version; return it.

    TF Serving serves the highest version, so this puts the earlier model back in service
    while keeping every version for audit; the copy is atomic as a push is (server-side on
    GCS). Recording it in lineage (as a push) is the caller's job.
    """
    versions = serving_versions(destination)
    if to_version not in versions:
        raise UserError(
            f"cannot roll back {destination} to version {to_version}: it is not a complete "
            f"version there; complete versions are {versions or 'none'}"
        )
    source = storage.join(destination, str(to_version))
    finish_interrupted(destination)
    version = publish_next(source, destination)
    _retire(destination, [v for v in versions if v > to_version], restored=to_version)
    log.info("rolled %s back to version %d as version %d", destination, to_version, version)
    return version


def _retire(destination: str, versions: list[int], restored: int) -> None:
    """Remember the models of `versions` (by their files' crc32c) so no push restores them.

    A rollback says "these models are bad"; without this, a later run on unchanged data (its
    train served from KFP's cache) would be blessed against the restored model and put one
    back. Rolling back *to* a retired version un-retires it.
    """
    retired = _read_retired(destination)
    retired.pop(str(restored), None)
    for version in versions:
        retired[str(version)] = storage.tree_crc32c(storage.join(destination, str(version)))
    storage.write_text_atomic(
        storage.join(destination, RETIRED_FILE), json.dumps(retired, indent=2)
    )


def _read_retired(destination: str) -> dict[str, dict[str, str]]:
    path = storage.join(destination, RETIRED_FILE)
    return json.loads(storage.read_bytes(path)) if storage.has_content(path) else {}


def retired_as(saved_model: str, destination: str) -> int | None:
    """The version a rollback retired that holds the same files as `saved_model`, if any."""
    if not storage.has_content(destination):
        return None
    files = storage.tree_crc32c(saved_model)
    matches = [int(v) for v, crcs in _read_retired(destination).items() if crcs == files]
    return min(matches) if matches else None
