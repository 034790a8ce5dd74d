"""A TF Serving destination: its model versions, publishing the next one, and rolling back.

A destination is a local folder or a `gs://` prefix holding one folder per version, named by
an increasing integer; TF Serving serves the highest. A version is complete once its SavedModel
graph (`READY`) is there, so every publish copies that file last (`storage.publish_dir`). A
rollback re-publishes an earlier version as the newest and retires the models it took out of
service, so that no later push puts one of them back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import time
from pathlib import Path

from components import storage
from contracts.artifacts import RETIRED_FILE, SAVED_MODEL_FILE
from contracts.errors import UserError

log = logging.getLogger(__name__)

READY = SAVED_MODEL_FILE  # TF Serving loads a version once this file is there: it is copied last
_MAX_RACES = 20  # how many concurrent publishers may take our version number before we give up
CLAIMS_DIR = ".claims"  # `<destination>/.claims/<N>`: created once, by the publisher of version N
IN_FLIGHT_WAIT_S = 300.0  # how long a push waits for the pushes claimed below it to end
IN_FLIGHT_POLL_S = 1.0  # how often it looks again meanwhile
STALE_CLAIM_S = 3600.0  # a claim this old whose version is not complete is a dead publisher's


def serving_versions(destination: str | os.PathLike[str]) -> list[int]:
    """Return the complete model versions under a TF Serving destination, ascending.

    A version is a folder named by an integer that holds the SavedModel graph (`READY`);
    anything else (temporaries, staging folders, half-copied folders, stray files) is ignored.
    """
    return sorted(int(n) for n in storage.folders_holding(destination, READY) if n.isdigit())


def next_serving_version(destination: str | os.PathLike[str]) -> int:
    """Return one more than the highest version taken: complete, staged, or claimed."""
    names = storage.names_taken(destination) + _claimed(str(destination))
    return max((int(n) for n in names if n.isdigit()), default=0) + 1


def latest_version_uri(destination: str) -> str | None:
    """The model in service: the highest complete version under `destination`, or None."""
    versions = serving_versions(destination)
    return storage.join(destination, str(versions[-1])) if versions else None


def version_of(version_uri: str) -> int:
    """The version number a version folder's URI ends with (`.../serving/7` -> 7)."""
    return int(version_uri.rstrip("/").rsplit("/", 1)[-1])


def normalize(destination: str) -> str:
    """One spelling per destination, as lineage records it: an absolute path, or gs:// with no
    trailing slash, so `serving/`, `./serving` and `/abs/serving` are one destination."""
    if storage.is_gcs(destination):
        return destination.rstrip("/")
    return str(Path(destination).expanduser().resolve())


def finish_interrupted(destination: str) -> dict[str, str]:
    """Finish or clean up the publishes a crash left under `destination` (gs:// only).

    Returns {version URI: "finished" | "cleaned"}, as `storage.finish_publishes` does.
    """
    return storage.finish_publishes(destination, ready=READY)


class ServedModelChanged(Exception):
    """The newest complete version is no longer the one a push was evaluated against."""

    def __init__(
        self, expected: int | None, found: int | None, retired: bool = False, coming: int = 0
    ) -> None:
        def name(v: int | None) -> str:
            return f"version {v}" if v is not None else "no model"

        now = f"a rollback is retiring {name(found)}" if retired else f"{name(found)} is served now"
        if coming:
            now = (
                f"another push is still publishing version {coming} on top of it (claimed "
                f"in {CLAIMS_DIR}/{coming}); run this one again once that push has ended, or, "
                f"if no push is running (one killed on another machine), once that claim is "
                f"{STALE_CLAIM_S / 3600:g} h old or after deleting it"
            )
        super().__init__(
            "the served model changed since evaluation: it was compared with "
            f"{name(expected)}, and {now}"
        )
        self.found = found


ANY_VERSION = -1  # `publish_next(expect_latest=ANY_VERSION)`: publish on top of whatever is served


def publish_next(source: str, destination: str, expect_latest: int | None = ANY_VERSION) -> int:
    """Publish `source` as the next free version; return it.

    The version is claimed first with a create-only marker (`.claims/<N>`), so two writers
    never share a number: the loser of a claim takes the next one. Only the claimant copies
    into `<N>/`, so a version never mixes two models' files. A claim whose publisher died
    stays, and its number is skipped (TF Serving serves the highest; gaps are harmless).

    With `expect_latest` (a version, or None for an empty destination), the publish is
    refused with `ServedModelChanged` if, once our version is claimed, the newest complete
    version is another, or a rollback has retired it: a push is only published on top of the
    model it was evaluated against. A rollback retires before it claims, so either it retired
    before this check (refused) or its version is claimed after ours (it stays on top). A push
    that claimed a number between that model's and ours and is still copying would land
    under ours unseen (both compared with the same model, ours never with its): the check
    waits for it to end (`_in_flight`), up to IN_FLIGHT_WAIT_S, and is refused if it still
    has not.
    """
    token = secrets.token_hex(8)
    for _ in range(_MAX_RACES):
        version = next_serving_version(destination)
        claim = storage.join(destination, CLAIMS_DIR, str(version))
        record = {
            "writer": token,
            "claimed_at": time.time(),
            "source": source,
            "process": storage.this_process(),  # so a push on this machine sees it die
        }
        if not storage.create_exclusive(claim, json.dumps(record).encode()):
            continue
        try:
            if expect_latest != ANY_VERSION:
                _check_on_top_of(destination, expect_latest, version)
            storage.publish_dir(source, storage.join(destination, str(version)), ready=READY)
        except (Exception, KeyboardInterrupt):  # refused, failed, or Ctrl-C while it waits
            # Nothing of ours is left at <N>/ (a gs:// staging that could still be finished
            # keeps the number taken by its name), so the number is free again. A killed
            # process cleans nothing: its claim and staging stay (`_in_flight` says when that
            # claim no longer holds a push back).
            with contextlib.suppress(Exception):
                storage.delete_file(claim)
            raise
        return version
    raise RuntimeError(f"could not claim a version under {destination} after {_MAX_RACES} tries")


def _check_on_top_of(destination: str, expect_latest: int | None, version: int) -> None:
    """Raise ServedModelChanged unless `version` (claimed) would go on top of `expect_latest`:
    the newest complete version, not retired, once the pushes claimed between them have ended
    (waited for up to IN_FLIGHT_WAIT_S)."""
    coming = _in_flight(destination, expect_latest, version)
    until = time.monotonic() + IN_FLIGHT_WAIT_S
    while coming and time.monotonic() < until:
        time.sleep(IN_FLIGHT_POLL_S)
        coming = _in_flight(destination, expect_latest, version)
    versions = serving_versions(destination)
    latest = versions[-1] if versions else None
    retired = latest is not None and str(latest) in _read_retired(destination)
    if latest != expect_latest or retired or coming:
        late = coming[0] if coming and latest == expect_latest and not retired else 0
        raise ServedModelChanged(expect_latest, latest, retired, late)


def _claimed(destination: str) -> list[str]:
    return list(storage.list_tree(storage.join(destination, CLAIMS_DIR)))


def _in_flight(destination: str, above: int | None, below: int) -> list[int]:
    """The versions between `above` and `below` that are claimed and not yet complete, by a
    publisher that may still be running, ascending. A claim is a dead publisher's (its number
    stays skipped) when it is older than STALE_CLAIM_S, or when it names a process on this
    machine that has ended (`storage.holder_gone`: a local push killed mid-copy). A claim's
    time is its publisher's clock: a skew of minutes does not matter at that scale."""
    complete = set(serving_versions(destination))
    here = storage.this_process()
    coming = []
    for name in _claimed(destination):
        if not name.isdigit() or not (above or 0) < int(name) < below or int(name) in complete:
            continue
        try:
            raw = storage.read_bytes(storage.join(destination, CLAIMS_DIR, name))
            claimed_at = float(json.loads(raw)["claimed_at"])
        except (UserError, OSError, ValueError, TypeError, KeyError):
            continue  # gone meanwhile (its publisher failed and freed it), or not ours
        if time.time() - claimed_at < STALE_CLAIM_S and not storage.holder_gone(raw, here):
            coming.append(int(name))
    return sorted(coming)


def rollback(destination: str, to_version: int) -> int:
    """Re-publish version `to_version` of `destination` as a new, highest version; return it.

    TF Serving serves the highest version, so this puts the earlier model back in service
    while keeping every version for audit; the copy is atomic as a push is (server-side on
    GCS). The versions it takes out of service are retired *before* the new one is
    published: a crash in between leaves them refused by every later push, and running the
    rollback again completes it. If a push published above our version meanwhile, that
    version is retired too and the restored model published again on top, so a rollback
    always ends with its model served. Recording it in lineage is the caller's job.
    """
    # First: a push interrupted after its upload is finished here, and is then a version
    # above `to_version` like any other, retired with them.
    finish_interrupted(destination)
    versions = serving_versions(destination)
    if to_version not in versions:
        raise UserError(
            f"cannot roll back {destination} to version {to_version}: it is not a complete "
            f"version there; complete versions are {versions or 'none'}"
        )
    source = storage.join(destination, str(to_version))
    _retire(destination, [v for v in versions if v > to_version], restored=to_version)
    for _ in range(_MAX_RACES):
        version = publish_next(source, destination)
        above = [v for v in serving_versions(destination) if v > version]
        above = _retire(destination, above, restored=to_version)
        if not above:
            log.info("rolled %s back to version %d as version %d", destination, to_version, version)
            return version
        log.info("versions %s were pushed during the rollback: retired them too", above)
    raise RuntimeError(f"pushes to {destination} kept overtaking the rollback")


def _retire(destination: str, versions: list[int], restored: int) -> list[int]:
    """Remember the models of `versions` (by their files' crc32c) so no push restores them.

    A rollback says "these models are bad"; without this, a later run on unchanged data (its
    train served from KFP's cache) would be blessed against the restored model and put one
    back. Rolling back *to* a retired model un-retires it (under every number it was retired
    as), and a version holding the restored model (another rollback's copy of it) is never
    retired. The file is updated under a precondition (`storage.update_bytes`), so two
    rollbacks at once both keep their entries. Returns the versions retired.
    """
    keep = storage.tree_crc32c(storage.join(destination, str(restored)))
    files = {
        str(v): crcs
        for v in versions
        if (crcs := storage.tree_crc32c(storage.join(destination, str(v)))) != keep
    }

    def change(old: bytes | None) -> bytes:
        retired = json.loads(old) if old else {}
        # The restored model is in service again, under whichever numbers it was retired.
        retired = {v: crcs for v, crcs in retired.items() if v != str(restored) and crcs != keep}
        retired.update(files)
        return json.dumps(retired, indent=2).encode()

    storage.update_bytes(storage.join(destination, RETIRED_FILE), change)
    return [int(v) for v in files]


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
