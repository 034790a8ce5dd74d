"""Push: publish a blessed SavedModel to a TF Serving destination, atomically.

The blessing gate lives here, as in the TFX Pusher: an unblessed model is an outcome, not an
error, and the step succeeds with `pushed=0`.

The destination is a local folder or a `gs://` prefix. On GCS, which has no rename, a version
is staged in `<destination>/.staging-<version>/` and copied into `<destination>/<version>/`
with `saved_model.pb` last (storage.publish_dir), so TF Serving, which loads a version once
`saved_model.pb` appears, never loads one with missing variables. Before choosing a version,
a push finishes (or cleans up) whatever an interrupted push left (storage.finish_publishes);
if that was this same model, the re-run reports the version it finished instead of
publishing the model twice.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from components import storage
from components.evaluate.executor import SERVING_SUBDIR, read_blessing
from contracts.errors import UserError

log = logging.getLogger(__name__)

READY = "saved_model.pb"  # TF Serving's sign that a version folder is complete
_MAX_RACES = 5  # how many concurrent pushers may take our version number before we give up


@dataclass(frozen=True)
class PushResult:
    """What the push did, in TFX PushedModel terms."""

    pushed: int  # 1 if a new version was published, else 0
    pushed_destination: str  # the serving destination folder
    pushed_version: str  # the integer version as a string, "" when not pushed
    reason: str  # why it was or was not pushed


def run(model_dir: str, blessing_dir: str, destination: str, pushed_dir: str) -> PushResult:
    """Publish `<model_dir>/Format-Serving` as `<destination>/<version>/` if the model is blessed.

    The version is one more than the highest at the destination. The copy is written beside
    the destination and renamed into place (gs://: staged and copied with saved_model.pb
    last), so TF Serving never sees a half-written version.
    The outcome is written to `pushed_dir` (TFX PushedModel: a `PUSHED` or `NOT_PUSHED` file).
    """
    blessed, reason = read_blessing(blessing_dir)
    saved_model = Path(model_dir) / SERVING_SUBDIR
    if blessed and not (saved_model / "saved_model.pb").is_file():
        raise UserError(f"model has no SavedModel: {saved_model}/saved_model.pb is missing")
    retired = _retired_as(str(saved_model), destination) if blessed else None
    if retired is not None:
        reason = f"rolled back from version {retired}; a rollback retired this model"
        result = PushResult(0, destination, "", f"not pushed: {reason}")
        log.info("not pushing %s: %s", model_dir, reason)
    elif blessed:
        version, new = _publish(str(saved_model), destination)
        why = "blessed" if new else f"blessed; already served as version {version}"
        result = PushResult(1, destination, str(version), why)
        log.info("pushed %s as version %d under %s (%s)", model_dir, version, destination, why)
    else:
        result = PushResult(0, destination, "", f"not blessed: {reason}")
        log.info("not pushing %s: %s", model_dir, reason)
    _write_outcome(pushed_dir, result)
    return result


def _publish(saved_model: str, destination: str) -> tuple[int, bool]:
    """Publish the SavedModel as the next version; (version, True if newly published).

    Interrupted pushes are finished first. A model that one of them, or the newest version,
    already holds is not published again: a retried push step (it failed after publishing) or
    a run served from KFP's cache must not add a duplicate version.
    """
    storage.check_folder(destination, "push destination")
    finished = storage.finish_publishes(destination, ready=READY)
    for final in finished:
        log.info("finished an interrupted push: %s", final)
        if finished[final] == "finished" and storage.same_files(saved_model, final):
            return int(final.rstrip("/").rsplit("/", 1)[-1]), False
    versions = storage.serving_versions(destination)
    if versions and storage.same_files(saved_model, storage.join(destination, str(versions[-1]))):
        return versions[-1], False
    return _publish_next(saved_model, destination), True


def _publish_next(source: str, destination: str) -> int:
    """Publish `source` as the next free version, retrying if another pusher took it."""
    for _ in range(_MAX_RACES):
        version = storage.next_serving_version(destination)
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
    versions = storage.serving_versions(destination)
    if to_version not in versions:
        raise UserError(
            f"cannot roll back {destination} to version {to_version}: it is not a complete "
            f"version there; complete versions are {versions or 'none'}"
        )
    source = storage.join(destination, str(to_version))
    storage.finish_publishes(destination, ready=READY)
    version = _publish_next(source, destination)
    _retire(destination, [v for v in versions if v > to_version], restored=to_version)
    log.info("rolled %s back to version %d as version %d", destination, to_version, version)
    return version


RETIRED = ".retired.json"  # beside the versions: models a rollback took out of service


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
    storage.write_text_atomic(storage.join(destination, RETIRED), json.dumps(retired, indent=2))


def _read_retired(destination: str) -> dict[str, dict[str, str]]:
    path = storage.join(destination, RETIRED)
    return json.loads(storage.read_bytes(path)) if storage.has_content(path) else {}


def _retired_as(saved_model: str, destination: str) -> int | None:
    """The version a rollback retired that holds the same files as `saved_model`, if any."""
    if not storage.has_content(destination):
        return None
    files = storage.tree_crc32c(saved_model)
    matches = [int(v) for v, crcs in _read_retired(destination).items() if crcs == files]
    return min(matches) if matches else None


def _write_outcome(pushed_dir: str, result: PushResult) -> None:
    with storage.atomic_dir(pushed_dir) as tmp:
        (tmp / ("PUSHED" if result.pushed else "NOT_PUSHED")).write_text("")
        (tmp / "push.json").write_text(json.dumps(asdict(result), indent=2) + "\n")


def pushed_uri(result: PushResult) -> str:
    """The URI lineage records for a push: the published version folder, or the destination."""
    if not result.pushed:
        return result.pushed_destination
    return f"{result.pushed_destination.rstrip('/')}/{result.pushed_version}"
