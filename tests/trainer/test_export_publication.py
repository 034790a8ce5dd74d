"""trainer.export's publication of the Model: MODEL_COMPLETE goes last, and first goes away.

The SavedModel itself is stubbed (`save_serving`), so these run without a network to save;
tests/components/train/test_run_on_gcs.py watches the same order in TensorFlow's own requests
to GCS.
"""

import pytest
import tensorflow as tf

from components import model_artifact
from contracts.artifacts import MODEL_COMPLETE, MODEL_CONFIG, SERVING_DIR, TRAIN_METRICS
from contracts.errors import UserError
from contracts.training import TrainMetrics
from trainer import export
from trainer.config import resolve_config

METRICS = TrainMetrics(20, 3.5, False, None, 100.0, 8, 1, 1, "float32")


def parts() -> export.ModelParts:
    return export.ModelParts(None, resolve_config("tiny"), "tokenizer.model", METRICS)


@pytest.fixture
def saved(monkeypatch):
    """`save_serving` writes a stand-in graph; the moves into place are recorded with whether
    the marker was there at that moment."""
    moves = []

    def save_serving(gpt, cfg, tokenizer, directory, history=None, extras=None):
        tf.io.gfile.makedirs(directory)
        with tf.io.gfile.GFile(f"{directory}/saved_model.pb", "w") as f:
            f.write("graph")

    real_move = export._move_into_place

    def move(tmp, path):
        moves.append(tf.io.gfile.exists(f"{path}/{MODEL_COMPLETE}"))
        real_move(tmp, path)
        moves.append(tf.io.gfile.exists(f"{path}/{MODEL_COMPLETE}"))

    monkeypatch.setattr(export, "save_serving", save_serving)
    monkeypatch.setattr(export, "_move_into_place", move)
    return moves


def test_the_marker_is_written_after_the_model_is_in_place(tmp_path, saved):
    model = tmp_path / "model"
    export.write_model_dir(parts(), str(model))
    assert saved == [False, False]  # not there while the folder moved
    names = {p.relative_to(model).as_posix() for p in model.rglob("*") if p.is_file()}
    assert names == {MODEL_COMPLETE, MODEL_CONFIG, TRAIN_METRICS, f"{SERVING_DIR}/saved_model.pb"}
    model_artifact.require_complete(str(model))
    assert not [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_replacing_a_model_removes_its_marker_first(tmp_path, saved, monkeypatch):
    model = tmp_path / "model"
    export.write_model_dir(parts(), str(model))

    def unavailable(*args, **kwargs):
        raise tf.errors.UnavailableError(None, None, "storage is briefly unavailable")

    monkeypatch.setattr(export, "save_serving", unavailable)
    with pytest.raises(tf.errors.UnavailableError):
        export.write_model_dir(parts(), str(model))
    # The old Model's files are still there, but no reader takes them for a Model any more.
    assert (model / TRAIN_METRICS).is_file() and not (model / MODEL_COMPLETE).exists()
    with pytest.raises(UserError, match="is incomplete"):
        model_artifact.require_complete(str(model))
