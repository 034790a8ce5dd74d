"""Train's run() with the local launcher: the trainer as a real worker process."""

import json

import pytest
from trainer_fixtures import TINY_OVERRIDES, make_examples_dir

from components import kube
from components.train import executor
from components.train.launcher import job_name
from contracts.artifacts import SAVED_MODEL_FILE, SERVING_DIR, TRAIN_METRICS
from trainer.config import config_from_dict, config_hash, resolve_config

PINNED = "r/t@sha256:" + "a" * 64


@pytest.mark.slow
def test_local_run_trains_exports_and_reports(tmp_path):
    examples = make_examples_dir(tmp_path / "examples")
    model, work = tmp_path / "model", tmp_path / "work"
    cfg = resolve_config("tiny", TINY_OVERRIDES + ("train.train_steps=10", "train.warmup_steps=2"))
    spec = executor.job_spec(
        str(examples), str(model), str(work), cfg, launcher="local", run_id="run-1", workers=1
    )
    result = executor.run(spec, cfg, str(model), executor.make_launcher("local", str(work)))
    assert (model / SERVING_DIR / SAVED_MODEL_FILE).is_file()
    assert json.loads((model / TRAIN_METRICS).read_text())["steps"] == 10
    assert result.model_properties["steps"] == 10 and result.model_properties["diverged"] == 0
    assert result.model_properties["config_hash"] == config_hash(cfg)
    assert result.model_properties["gpu_hours"] == 0
    assert result.execution_properties["job_name"] == job_name("run-1", "train")
    assert result.execution_properties["attempts"] == 1
    assert list((work / "worker-logs").rglob("worker-0.log"))


def test_workers_get_the_resolved_config_as_canonical_json():
    cfg = resolve_config("tiny", ["train.train_steps=77"])
    spec = executor.job_spec(
        "gs://b/examples", "gs://b/model", "gs://b/work", cfg, launcher="tfjob", run_id="run-1"
    )
    command = list(spec.command)
    assert command[:3] == [executor.CONTAINER_PYTHON, "-m", "trainer.task"]
    assert "--config" not in command and "--set" not in command  # nothing left to resolve
    sent = command[command.index("--config-json") + 1]
    assert config_from_dict(json.loads(sent)) == cfg
    assert sent == json.dumps(json.loads(sent), sort_keys=True, separators=(",", ":"))


def test_job_options_keep_jobspec_names_and_the_derived_fields():
    cfg = resolve_config("tiny")
    spec = executor.job_spec(
        "gs://b/examples",
        "gs://b/model",
        "gs://b/work",
        cfg,
        launcher="tfjob",
        run_id="Run 1/retry",
        image=PINNED,
        workers=3,
        active_deadline_seconds=600,
    )
    assert (spec.name, spec.run_id) == (job_name("Run 1/retry", "train"), "Run-1-retry")
    assert (spec.image, spec.workers, spec.active_deadline_seconds) == (PINNED, 3, 600)
    assert not spec.allow_unpinned  # only a local run accepts an image by tag


def test_cluster_placement_reads_the_pod_identity(tmp_path):
    namespace = tmp_path / "namespace"
    namespace.write_text("team-a\n")
    env = {kube.POD_NAME_ENV: "run-train-123", kube.POD_UID_ENV: "uid-9"}
    pod = kube.pod_identity(env, str(namespace))
    assert pod == kube.PodIdentity("run-train-123", "uid-9", "team-a")
    placement = executor.cluster_placement(pod)
    assert placement["namespace"] == "team-a"
    assert (placement["owner"].name, placement["owner"].uid) == ("run-train-123", "uid-9")
    outside = kube.pod_identity({}, str(tmp_path / "none"))
    assert outside == kube.PodIdentity() and executor.cluster_placement(outside) == {}
