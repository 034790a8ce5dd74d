"""model_artifact: a Model is complete only with MODEL_COMPLETE; train, evaluate and push refuse
one without it (on local disk and on GCS, where the export's move is not atomic)."""

import re
import shutil

import pytest

from components import model_artifact
from components.push import executor as push
from contracts.artifacts import MODEL_COMPLETE, SERVING_DIR, TRAIN_METRICS
from contracts.errors import UserError


def _model_without_marker(folder):
    (folder / SERVING_DIR / "variables").mkdir(parents=True)
    (folder / SERVING_DIR / "saved_model.pb").write_bytes(b"graph")
    (folder / TRAIN_METRICS).write_text("{}")
    return folder


@pytest.mark.bad_input("a Model folder with everything but its COMPLETE marker")
def test_a_model_without_its_marker_is_refused_in_one_line(tmp_path):
    model = _model_without_marker(tmp_path / "model")
    with pytest.raises(UserError) as raised:
        model_artifact.require_complete(str(model))
    said = str(raised.value)
    assert said == (
        f"the Model at {model} is incomplete: it has no {MODEL_COMPLETE} file, which its export "
        "writes last (the export was interrupted, or the folder was copied in part); re-run the "
        "train step"
    )
    (model / MODEL_COMPLETE).write_text("")
    model_artifact.require_complete(str(model))
    with pytest.raises(UserError, match=re.escape(f"no Model at {tmp_path / 'gone'}: ")):
        model_artifact.require_complete(str(tmp_path / "gone"))


@pytest.mark.bad_input("a Model on GCS with everything but its COMPLETE marker")
def test_a_model_on_gcs_without_its_marker_is_refused(gcs):
    gcs.put("model/Format-Serving/saved_model.pb", b"graph")
    gcs.put("model/train_metrics.json", b"{}")
    with pytest.raises(UserError, match="is incomplete: it has no COMPLETE file"):
        model_artifact.require_complete(gcs.uri("model"))
    gcs.put(f"model/{MODEL_COMPLETE}", b"")
    model_artifact.require_complete(gcs.uri("model"))


@pytest.mark.bad_input("push given a Model without its COMPLETE marker")
def test_push_refuses_an_incomplete_model_and_publishes_nothing(tmp_path):
    model = _model_without_marker(tmp_path / "model")
    blessing = tmp_path / "blessing"
    blessing.mkdir()
    (blessing / "BLESSED").write_text("")
    destination = tmp_path / "serving"
    with pytest.raises(UserError, match="is incomplete"):
        push.run(str(model), str(blessing), str(destination), str(tmp_path / "pushed"))
    assert not destination.exists() and not (tmp_path / "pushed").exists()


@pytest.mark.slow
@pytest.mark.bad_input("evaluate given a Model without its COMPLETE marker")
def test_evaluate_refuses_an_incomplete_model(tiny_model, examples, tmp_path):
    from components.evaluate import executor as evaluate
    from contracts.params import EvalPolicy

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    (model / MODEL_COMPLETE).unlink()
    blessing = tmp_path / "blessing"
    with pytest.raises(UserError, match="is incomplete"):
        evaluate.run(
            str(model),
            str(examples),
            str(tmp_path / "serving"),
            str(blessing),
            str(tmp_path / "report.md"),
            policy=EvalPolicy(),
        )
    assert not blessing.exists()


class _ChiefWithoutMarker:
    """A launcher whose job 'succeeded' leaving a Model without its marker."""

    def __init__(self, model):
        self.model = model

    def run(self, spec, *, timeout_seconds=None):
        from components.jobs.launcher import LaunchResult

        _model_without_marker(self.model)
        return LaunchResult("local", spec.name, 1, 1, 0, 0.0, 0.0)


@pytest.mark.bad_input("a train job that succeeded without writing the Model's COMPLETE marker")
def test_train_refuses_a_model_its_job_left_incomplete(tmp_path):
    from components.train import executor as train
    from trainer.config import resolve_config

    cfg = resolve_config("tiny")
    model, work = tmp_path / "model", tmp_path / "work"
    spec = train.job_spec("ex", str(model), str(work), cfg, launcher="local", run_id="r-1")
    with pytest.raises(UserError, match="is incomplete"):
        train.run(spec, cfg, str(model), str(work), _ChiefWithoutMarker(model))
