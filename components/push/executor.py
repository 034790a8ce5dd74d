"""Push: publish a blessed SavedModel to a TF Serving destination, atomically.

The blessing gate lives here, as in the TFX Pusher: an unblessed model is an outcome, not an
error, and the step succeeds with `pushed=0`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from components import storage
from components.evaluate.executor import read_blessing
from trainer.errors import UserError

log = logging.getLogger(__name__)

SERVING_SUBDIR = "Format-Serving"  # TFX Model layout: the SavedModel inside the Model artifact
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
    the destination and renamed into place, so TF Serving never sees a half-written version.
    The outcome is written to `pushed_dir` (TFX PushedModel: a `PUSHED` or `NOT_PUSHED` file).
    """
    blessed, reason = read_blessing(blessing_dir)
    saved_model = Path(model_dir) / SERVING_SUBDIR
    if blessed and not (saved_model / "saved_model.pb").is_file():
        raise UserError(f"model has no SavedModel: {saved_model}/saved_model.pb is missing")
    if blessed:
        version = _publish(saved_model, Path(destination))
        result = PushResult(1, destination, str(version), "blessed")
        log.info("pushed %s as version %d under %s", model_dir, version, destination)
    else:
        result = PushResult(0, destination, "", f"not blessed: {reason}")
        log.info("not pushing %s: %s", model_dir, reason)
    _write_outcome(pushed_dir, result)
    return result


def _publish(saved_model: Path, destination: Path) -> int:
    """Copy the SavedModel to the next free version, retrying if another pusher took it."""
    if destination.exists() and not destination.is_dir():
        raise UserError(f"push destination is not a folder: {destination}")
    for _ in range(_MAX_RACES):
        version = storage.next_serving_version(destination)
        try:
            storage.publish_dir(saved_model, destination / str(version))
            return version
        except FileExistsError:
            continue
    raise RuntimeError(f"could not claim a version under {destination} after {_MAX_RACES} tries")


def _write_outcome(pushed_dir: str, result: PushResult) -> None:
    with storage.atomic_dir(pushed_dir) as tmp:
        (tmp / ("PUSHED" if result.pushed else "NOT_PUSHED")).write_text("")
        (tmp / "push.json").write_text(json.dumps(asdict(result), indent=2) + "\n")


def pushed_uri(result: PushResult) -> str:
    """The URI lineage records for a push: the published version folder, or the destination."""
    if not result.pushed:
        return result.pushed_destination
    return f"{result.pushed_destination.rstrip('/')}/{result.pushed_version}"
