"""Train's run(), its job spec and cluster placement, and its KFP component's parameters."""

import dataclasses
import inspect
import io
import json
import sys

import pytest
import yaml

from components.jobs import kube
from components.jobs.local import LocalLauncher
from components.jobs.naming import job_name
from components.train import component, executor
from contracts.artifacts import SAVED_MODEL_FILE, SERVING_DIR, TRAIN_METRICS
from contracts.errors import UserError
from contracts.params import TrainJob
from tests.doubles.kubernetes.apiserver import FakeKube
from tests.tiny import TINY_OVERRIDES
from trainer.config import config_from_dict, config_hash, resolve_config

PINNED = "r/t@sha256:" + "a" * 64


@pytest.mark.slow
def test_local_run_trains_exports_and_reports(tmp_path, examples):
    model, work = tmp_path / "model", tmp_path / "work"
    steps = ("train.train_steps=10", "train.warmup_steps=2", "train.checkpoint_every=5")
    cfg = resolve_config("tiny", TINY_OVERRIDES + steps)
    spec = executor.job_spec(
        str(examples), str(model), str(work), cfg, launcher="local", run_id="run-1", workers=1
    )
    result = executor.run(
        spec, cfg, str(model), str(work), executor.make_launcher("local", str(work))
    )
    assert (model / SERVING_DIR / SAVED_MODEL_FILE).is_file()
    assert json.loads((model / TRAIN_METRICS).read_text())["steps"] == 10
    assert result.model_properties["steps"] == 10 and result.model_properties["diverged"] == 0
    assert result.model_properties["config_hash"] == config_hash(cfg)
    assert result.model_properties["gpu_hours"] == 0
    assert result.model_properties["precision_policy"] in ("float32", "mixed_bfloat16")
    assert result.execution_properties["job_name"] == job_name("run-1", "train")
    assert result.execution_properties["attempts"] == 1
    assert list((work / "worker-logs").rglob("worker-0.log"))
    # The job succeeded: the train step, not a worker, removed the training backup.
    assert (work / "checkpoints").is_dir() and not (work / "backup").exists()


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


def test_local_workers_start_with_the_trainers_environment(tmp_path, monkeypatch):
    # The train job's spec sets WORKER_ENV (oneDNN on) and the local launcher starts each worker
    # with it, over the parent's environment: a worker sees it before it imports TensorFlow.
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")  # the parent's own setting does not leak
    cfg = resolve_config("tiny")
    spec = executor.job_spec(
        "ex", "model", "work", cfg, launcher="local", run_id="run-1", workers=2, backoff_limit=0
    )
    assert dict(spec.env)["TF_ENABLE_ONEDNN_OPTS"] == "1"
    seen = tmp_path / "seen"
    script = (
        "import json, os, sys; i = json.loads(os.environ.get('TF_CONFIG') or "
        "'{\"task\": {\"index\": 0}}')['task']['index']; "
        "open(sys.argv[1] + str(i), 'w').write(os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset'))"
    )
    worker = dataclasses.replace(spec, command=[sys.executable, "-c", script, str(seen)])
    LocalLauncher(log_dir=tmp_path / "logs", out=io.StringIO()).run(worker)
    assert [(tmp_path / f"seen{i}").read_text() for i in range(2)] == ["1", "1"]


def test_a_jobs_own_env_is_set_over_the_workers_environment():
    spec = executor.job_spec(
        "ex", "m", "w", resolve_config("tiny"), launcher="local", run_id="r", env={"A": "b"}
    )
    assert dict(spec.env) == {**executor.WORKER_ENV, "A": "b"}


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
    with FakeKube() as cluster:
        cluster.cluster.add_pod(
            "team-a",
            "run-train-123",
            {"main": (PINNED, PINNED)},
            service_account="pipeline-runner",
            image_pull_secrets=("regcred", "mirror"),
        )
        placement = executor.cluster_placement(pod, api_client=cluster.api_client())
        chosen = executor.cluster_placement(pod, "trainer", api_client=cluster.api_client())
        (get, _) = cluster.calls("GET", "/api/v1/namespaces/team-a/pods/run-train-123")
    assert placement["namespace"] == "team-a"
    assert (placement["owner"].name, placement["owner"].uid) == ("run-train-123", "uid-9")
    # The workers run as the step does, and pull the image as the step did.
    assert placement["service_account"] == "pipeline-runner"
    assert placement["image_pull_secrets"] == ("regcred", "mirror")
    assert (chosen["service_account"], chosen["image_pull_secrets"]) == (
        "trainer",
        ("regcred", "mirror"),
    )
    spec = executor.job_spec(
        "gs://b/e", "gs://b/m", "gs://b/w", resolve_config("tiny"), launcher="tfjob",
        run_id="run-1", image=PINNED, **placement,
    )  # fmt: skip
    assert (spec.service_account, spec.image_pull_secrets) == (
        "pipeline-runner",
        ("regcred", "mirror"),
    )
    outside = kube.pod_identity({}, str(tmp_path / "none"))
    assert outside == kube.PodIdentity() and executor.cluster_placement(outside) == {}
    assert executor.cluster_placement(outside, "trainer") == {"service_account": "trainer"}


def test_a_step_pod_that_cannot_be_read_is_a_clear_error():
    pod = kube.PodIdentity("gone", "uid-1", "team-a")
    with FakeKube() as cluster, pytest.raises(UserError, match="grant .* 'get' on pods"):
        executor.cluster_placement(pod, api_client=cluster.api_client())


def test_the_component_takes_its_job_as_one_object_and_copies_no_default():
    """The train job's knobs live in contracts.params.TrainJob alone: the component takes the
    object whole, by the pipeline's name for it, and repeats none of its defaults."""
    params = inspect.signature(component.train).parameters
    assert {"examples_uri", "config", "train_job", "artifact_root"} <= set(params)
    assert not {"workers", "worker_cpu", "launcher"} & set(params)
    assert all(p.default is inspect.Parameter.empty for p in params.values())


def test_a_pipeline_compiled_with_allow_unpinned_may_start_workers_from_its_tags():
    """`gptpipe compile --allow-unpinned` makes a pipeline whose train step starts its workers
    from the unpinned trainer tag; one compiled from the lock refuses a tag."""
    from components.jobs.tfjob import manifest
    from pipelines import compiler

    unpinned = compiler.UNPINNED_IMAGES
    assert executor.allows_unpinned("tfjob", unpinned.pipeline)
    assert not executor.allows_unpinned("tfjob", PINNED)
    assert executor.allows_unpinned("local", PINNED)
    spec = executor.job_spec(
        "gs://b/examples",
        "gs://b/model",
        "gs://b/work",
        resolve_config("tiny"),
        launcher="tfjob",
        run_id="run-1",
        image=unpinned.trainer,
        allow_unpinned=executor.allows_unpinned("tfjob", unpinned.pipeline),
    )
    pod = manifest.build_manifest(spec)["spec"]["tfReplicaSpecs"]["Worker"]["template"]
    assert pod["spec"]["containers"][0]["image"] == unpinned.trainer


class _Artifact:
    """What KFP passes for an output artifact: a URI and metadata."""

    def __init__(self, uri: str) -> None:
        self.uri, self.metadata = uri, {}


@pytest.mark.bad_input("gpt2-xl asked for on 16 GB GPUs (T4) without recomputation")
def test_a_run_that_cannot_fit_its_gpus_is_refused_before_any_tfjob(tmp_path, monkeypatch):
    from components import lineage, provenance, step
    from tests.doubles.cluster import write_kubeconfig
    from trainer.config import config_to_dict

    store = str(tmp_path / "metadata.sqlite")
    monkeypatch.setenv("KFP_RUN_ID", "run-1")
    t4 = {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}
    inputs = {
        "examples_uri": str(tmp_path / "examples"),
        "dataset_version": "d" * 64,
        "config": config_to_dict(resolve_config("gpt2-xl")),
        "train_job": {"workers": 8, "gpus_per_worker": 1, "node_selector": t4},
        "trainer_image": PINNED,
        "artifact_root": str(tmp_path / "root"),
        "model": _Artifact(str(tmp_path / "model")),
        "metadata": store,
        "pipeline_name": "gptpipe",
        "image": provenance.LOCAL_IMAGE,
    }
    with FakeKube() as cluster:
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kc", cluster.host)))
        with pytest.raises(SystemExit) as exited:
            step.run("train", executor.execute, inputs)
        assert not cluster.cluster.tfjobs and not cluster.calls("POST")
    assert exited.value.code == 2
    error = lineage.failure_of(store, "run-1")[1]
    assert "T4" in error and "more GPUs do not help" in error and "\n" not in error


def test_the_plan_check_needs_a_gpu_label_for_memory_and_checks_the_batch_always():
    xl = resolve_config("gpt2-xl")
    executor.check_plan(xl, TrainJob(workers=8, gpus_per_worker=1))  # no label: not known
    with pytest.raises(UserError, match="nearest"):
        executor.check_plan(xl, TrainJob(workers=100, gpus_per_worker=1))
    h100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    executor.check_plan(xl, TrainJob(workers=8, gpus_per_worker=1, node_selector=h100))
    # Locally a worker is one replica, whatever gpus_per_worker says (the local launcher
    # ignores it): 3 workers do not split gpt2-xl's batch, 3 x 2 "GPUs" would not be asked.
    with pytest.raises(UserError, match="seq_len 1024 x 3 replicas"):
        executor.check_plan(xl, TrainJob(launcher="local", workers=3, gpus_per_worker=2))
    executor.check_plan(xl, TrainJob(launcher="local", workers=2, gpus_per_worker=3))


@pytest.mark.slow
def test_tfjob_manifest_prints_the_job_the_train_step_submits(tmp_path, monkeypatch, capsys):
    """For the same parameters, `gptpipe tfjob-manifest` is the TFJob the step POSTs from a
    KFP step pod (KFP's own account, in its namespace), but for the owner reference to that
    pod, which only a running step has: the deadline, the identity and every default alike."""
    from kubernetes.config import kube_config

    from components import provenance, step, storage
    from components.jobs.errors import LaunchError
    from components.jobs.placement import kfp_step_account
    from components.train.executor import step_work_dir
    from pipelines.cli.main import main
    from tests.doubles.cluster import write_kubeconfig
    from tests.doubles.kubernetes.apiserver import scenarios
    from trainer.config import config_to_dict

    namespace, run_id = "team-a", "run-7"
    root, model, examples = "gs://b/root", "gs://b/root/model", "gs://b/root/examples"
    inputs = {
        "examples_uri": examples,
        "dataset_version": "d" * 64,
        "config": config_to_dict(resolve_config("tiny")),
        "train_job": {"workers": 3, "gpus_per_worker": 2},
        "trainer_image": PINNED,
        "artifact_root": root,
        "model": _Artifact(model),
        "metadata": str(tmp_path / "metadata.sqlite"),
        "pipeline_name": "gptpipe",
        "image": provenance.LOCAL_IMAGE,
    }
    monkeypatch.setenv("KFP_RUN_ID", run_id)
    monkeypatch.setenv(kube.POD_NAME_ENV, "run-7-train")
    monkeypatch.setenv(kube.POD_UID_ENV, "uid-7")
    monkeypatch.setenv(kube.POD_NAMESPACE_ENV, namespace)
    monkeypatch.setattr(executor, "check_cache_inputs", lambda *args: None)
    monkeypatch.setattr(step.Step, "check_shared", lambda *args: None)
    with FakeKube(scenarios.failure(index=0, code=1)) as cluster:
        cluster.cluster.add_pod(
            namespace, "run-7-train", {"main": (PINNED, PINNED)},
            service_account=kfp_step_account(namespace),
        )  # fmt: skip
        kubeconfig = str(write_kubeconfig(tmp_path / "kc", cluster.host))
        monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", kubeconfig)
        with pytest.raises(LaunchError, match="worker-0, exit code: 1"):  # scripted to fail
            step.run("train", executor.execute, inputs)
        (created,) = cluster.calls("POST", "/tfjobs")
    submitted = created.body
    assert submitted["metadata"].pop("ownerReferences")[0]["name"] == "run-7-train"
    args = ["tfjob-manifest", "--image", PINNED, "--config", "tiny", "--namespace", namespace]
    args += ["--examples", examples, "--model-dir", model, "--run-id", run_id]
    args += ["--work-dir", storage.join(root, step_work_dir(run_id, "train"))]
    args += ["--workers", "3", "--gpus-per-worker", "2"]
    capsys.readouterr()
    assert main(args) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed == submitted
    spec = printed["spec"]
    assert spec["runPolicy"]["activeDeadlineSeconds"] == 24 * 3600
    worker = spec["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker["serviceAccountName"] == "default-editor"
