"""Push: publish a blessed SavedModel to a TF Serving destination, atomically.

The blessing gate lives here, as in the TFX Pusher: an unblessed model is an outcome, not an
error, and the step succeeds with `pushed=0`. So is a model a rollback retired. A blessed model
TF Serving could not load (an op its model server lacks: `components.servability`) is a build
defect, not an outcome: the step fails naming the op, before it claims or writes anything.

The destination is a local folder or a `gs://` prefix (`components.serving`). A push claims its
version number first, so concurrent pushes never share one. On GCS, which has no rename, a
version is staged in the pusher's own `<destination>/.staging-<version>~<token>/` and copied
into `<destination>/<version>/` create-only, with the SavedModel graph last
(storage.publish_dir), so TF Serving, which loads a version once that file appears, never loads
one with missing variables. Before choosing a version, a push finishes (or cleans up) whatever
an interrupted push left (serving.finish_interrupted); if that was this same model, the re-run
reports the version it finished instead of publishing the model twice. A push whose evaluated
baseline is no longer the served model (a rollback or another push got there first) records
`pushed=0` with that reason: it was never compared with what it would replace.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components import model_artifact, servability, serving, storage
from contracts import progress as events
from contracts.artifacts import SAVED_MODEL_FILE, SERVING_DIR, write_pushed
from contracts.blessing import ModelBlessing, read_blessing
from contracts.errors import UserError

if TYPE_CHECKING:
    from components.step import Step

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PushResult:
    """What the push did, in TFX PushedModel terms."""

    pushed: int  # 1 if a new version was published, else 0
    pushed_destination: str  # the serving destination folder
    pushed_version: str  # the integer version as a string, "" when not pushed
    reason: str  # why it was or was not pushed


def execute(step: Step, *, model: Any, blessing: Any, serving_dir: str, pushed_model: Any) -> None:
    """The push step: `run`, with lineage telling which models were pushed before."""
    from components import kfp_metadata, lineage

    # The serving folder is shared with TF Serving and later runs: gs:// in a cluster.
    step.check_shared(serving_dir, "serving_dir")
    step.rec.input("model", lineage.MODEL_TYPE, model.uri, upstream=True)
    step.rec.input("blessing", lineage.MODEL_BLESSING_TYPE, blessing.uri, upstream=True)
    result = run(
        model.path,
        blessing.path,
        serving_dir,
        pushed_model.path,
        already_pushed=lambda uri: (
            lineage.find_artifact(step.edge.store, uri, lineage.PUSHED_MODEL_TYPE) is not None
        ),
        reporter=step.progress,
    )
    props = asdict(result)
    pushed_model.metadata.update(kfp_metadata.recordable(props))
    step.rec.output("pushed_model", lineage.PUSHED_MODEL_TYPE, pushed_uri(result), props)
    step.rec.dataset_version = model.metadata.get("dataset_version")


def run(
    model_dir: str,
    blessing_dir: str,
    destination: str,
    pushed_dir: str,
    already_pushed: Callable[[str], bool] = lambda version_uri: False,
    reporter: events.Progress | None = None,
) -> PushResult:
    """Publish the Model's SavedModel as `<destination>/<version>/` if the model is blessed.

    A model the newest version already holds is not published again. It still counts as this
    push's (`pushed=1`), since this step may be the retry of a push that published and then
    failed, unless `already_pushed(version_uri)`: lineage holds an earlier push of it (a run
    whose train KFP served from its cache), and then nothing is pushed.

    An incomplete Model (no MODEL_COMPLETE: components/model_artifact.py) is refused, blessed
    or not. A blessed model TF Serving could not load is refused first (`servability.check`, a
    UserError naming the op), so the destination is never touched.

    The version is one more than the highest at the destination. The copy is written beside
    the destination and renamed into place (gs://: staged and copied with the SavedModel graph
    last), so TF Serving never sees a half-written version.
    The outcome is written to `pushed_dir` (TFX PushedModel, `contracts.artifacts.write_pushed`).
    `reporter` (default: none) gets the SavedModel's objects published, and the outcome as a note.
    """
    reporter = reporter or events.Progress(None, "push")
    destination = serving.normalize(destination)
    blessing = read_blessing(blessing_dir)
    model_artifact.require_complete(model_dir)
    blessed = bool(blessing.blessed)
    saved_model = Path(model_dir) / SERVING_DIR
    if blessed:
        _check_servable(saved_model)
    retired = serving.retired_as(str(saved_model), destination) if blessed else None
    if not blessed:
        result = _not_pushed(destination, f"not blessed: {blessing.reason}")
    elif retired is not None:
        why = f"rolled back from version {retired}; a rollback retired this model"
        result = _not_pushed(destination, f"not pushed: {why}")
    else:
        objects = len(storage.list_tree(str(saved_model)))
        reporter.update(0, objects, "objects", final=True)
        try:
            version, new = _publish(str(saved_model), destination, _baseline(blessing))
        except serving.ServedModelChanged as e:
            result = _not_pushed(destination, f"not pushed: {e}; run again to evaluate against it")
        else:
            if not new and already_pushed(storage.join(destination, str(version))):
                why = f"already served as version {version}, pushed by an earlier run"
                result = _not_pushed(destination, f"not pushed: {why}")
            else:
                why = "blessed" if new else f"blessed; already served as version {version}"
                result = PushResult(1, destination, str(version), why)
            if new:
                reporter.update(objects, objects, "objects", final=True)
    log.info("push of %s under %s: %s", model_dir, destination, result.reason)
    reporter.note(f"pushed as version {result.pushed_version}" if result.pushed else result.reason)
    _write_outcome(pushed_dir, result)
    return result


def _check_servable(saved_model: Path) -> None:
    """Refuse, as a UserError, a SavedModel TF Serving could not load: missing, or using an op
    its model server lacks."""
    if not (saved_model / SAVED_MODEL_FILE).is_file():
        raise UserError(f"model has no SavedModel: {saved_model / SAVED_MODEL_FILE} is missing")
    servability.check(str(saved_model))


def _not_pushed(destination: str, reason: str) -> PushResult:
    return PushResult(0, destination, "", reason)


def _baseline(blessing: ModelBlessing) -> int | None:
    """The version evaluate compared the model with (None: none was served), or
    `serving.ANY_VERSION` if the blessing does not say (written before evaluate recorded it)."""
    baseline = blessing.baseline_model
    if baseline is None:
        return serving.ANY_VERSION
    return serving.version_of(baseline) if baseline else None


def _publish(saved_model: str, destination: str, baseline: int | None) -> tuple[int, bool]:
    """Publish the SavedModel as the next version; (version, True if newly published).

    Interrupted pushes are finished first. A model that one of them, or the newest version,
    already holds is not published again: a retried push step (it failed after publishing) or
    a run served from KFP's cache must not add a duplicate version. Otherwise the model is
    published only on top of `baseline`, the version evaluate compared it with
    (`serving.ServedModelChanged` if another is served now).
    """
    storage.check_folder(destination, "push destination")
    finished = serving.finish_interrupted(destination)
    for final in finished:
        log.info("finished an interrupted push: %s", final)
        if finished[final] == "finished" and storage.same_files(saved_model, final):
            return serving.version_of(final), False
    versions = serving.serving_versions(destination)
    if versions and storage.same_files(saved_model, storage.join(destination, str(versions[-1]))):
        return versions[-1], False
    return serving.publish_next(saved_model, destination, expect_latest=baseline), True


def _write_outcome(pushed_dir: str, result: PushResult) -> None:
    with storage.atomic_dir(pushed_dir) as tmp:
        write_pushed(tmp, bool(result.pushed), asdict(result))


def pushed_uri(result: PushResult) -> str:
    """The URI lineage records for a push: the published version folder, or the destination."""
    if not result.pushed:
        return result.pushed_destination
    return f"{result.pushed_destination.rstrip('/')}/{result.pushed_version}"
