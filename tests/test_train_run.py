"""Train's run() with the local launcher: the trainer as a real worker process."""

import json

import pytest
from trainer_fixtures import TINY_OVERRIDES, make_examples_dir

from components.train import executor, tfjob
from trainer.config import ConfigError

pytestmark = pytest.mark.slow


def test_local_run_trains_exports_and_reports(tmp_path):
    examples = make_examples_dir(tmp_path / "examples")
    model, work = tmp_path / "model", tmp_path / "work"
    result = executor.run(
        str(examples),
        str(model),
        str(work),
        config="tiny",
        overrides=TINY_OVERRIDES + ("train.train_steps=10", "train.warmup_steps=2"),
        job=executor.TrainJob(launcher="local", workers=1),
        run_id="run-1",
    )
    assert (model / "Format-Serving" / "saved_model.pb").is_file()
    assert json.loads((model / "train_metrics.json").read_text())["steps"] == 10
    assert result.model_properties["steps"] == 10 and result.model_properties["diverged"] == 0
    assert result.model_properties["gpu_hours"] == 0
    assert result.execution_properties["job_name"] == tfjob.job_name("run-1", "train")
    assert result.execution_properties["attempts"] == 1
    assert list((work / "worker-logs").rglob("worker-0.log"))


def test_bad_override_fails_before_any_worker_starts(tmp_path):
    with pytest.raises(ConfigError, match="unknown key"):
        executor.job_spec(
            "gs://b/examples",
            "gs://b/model",
            "gs://b/work",
            config="tiny",
            overrides=["model.n_heads=2"],
            job=executor.TrainJob(launcher="tfjob", image="r/t@sha256:" + "a" * 64),
            run_id="run-1",
        )


def test_cluster_placement_reads_the_pod_identity(tmp_path):
    namespace = tmp_path / "namespace"
    namespace.write_text("team-a\n")
    env = {"KFP_POD_NAME": "run-train-123", "KFP_POD_UID": "uid-9"}
    placement = executor.cluster_placement(env, str(namespace))
    assert placement["namespace"] == "team-a"
    assert (placement["owner"].name, placement["owner"].uid) == ("run-train-123", "uid-9")
    assert executor.cluster_placement({}, str(tmp_path / "none")) == {}
