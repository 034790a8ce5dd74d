"""The compiled pipeline on a Kubeflow cluster made of doubles: KFP 2.5.0, a TFJob, GCS, MLMD.

`gptpipe compile` writes the YAML; tests/doubles/kfp/backend.py runs it as KFP's backend does (every
step a fresh process); train creates a TFJob in the Kubernetes API double, whose Training
Operator double runs 2 trainer workers as processes; every byte between steps goes through
gcp-storage-emulator, and every step records lineage in ml_metadata's gRPC service.
tests/doubles/cluster.py says which double stands for what.

Four runs share one cluster and one KFP cache: a run that trains and pushes, a second run on the
same data and config that KFP's cache serves train from, a run cancelled while its TFJob trains,
and a run whose train step is SIGKILLed while its TFJob trains. After each, the `release` exit
handler has deleted the run's TFJob and no worker process is left.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from components import lineage
from components.jobs.naming import job_name
from contracts.params import TrainJob
from pipelines.cli import lineage as lineage_cmd
from tests.doubles.cluster import (
    COMPLETION_INDEX_LABEL,
    NAMESPACE,
    PULL_SECRET,
    STEP_SERVICE_ACCOUNT,
    LocalCluster,
    local_cluster,
    wait_until,
)
from tests.doubles.kfp.backend import CACHED, FAILED, SKIPPED, SUCCEEDED, RunHandle, RunResult
from tests.tiny import PIPELINE_SMALL as SMALL
from trainer.config import config_to_dict, resolve_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.heavy]
# The tiny config of test_pipeline_e2e.py, shorter: 20 steps, a backup every 10.
OVERRIDES = (*SMALL, "train.train_steps=20", "train.checkpoint_every=10")
# For the runs that are stopped while they train: another config (so KFP's cache misses) that
# would train far longer than the test waits.
LONG = config_to_dict(resolve_config("tiny", (*OVERRIDES, "train.train_steps=100000")))
RUN_TIMEOUT = 600  # seconds; a hung run fails the test instead of hanging it
STEPS = ("tokenize", "train", "evaluate", "push")
IMAGES = json.loads((Path(__file__).parents[1] / "data" / "digests.json").read_text())


@pytest.fixture(scope="module")
def cluster(gcs_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory.mktemp("cluster"), gcs_server, OVERRIDES) as running:
        yield running


@pytest.fixture(scope="module")
def first(cluster: LocalCluster) -> RunResult:
    return cluster.backend.run(cluster.yaml, cluster.params(), timeout=RUN_TIMEOUT)


@pytest.fixture(scope="module")
def second(cluster: LocalCluster, first: RunResult) -> RunResult:
    return cluster.backend.run(cluster.yaml, cluster.params(), timeout=RUN_TIMEOUT)


def states(result: RunResult) -> dict[str, str]:
    return {name: result.tasks[name].state for name in (*STEPS, "release")}


def model_uri(result: RunResult) -> str:
    return result.tasks["train"].output_artifacts["model"].uri


def key(uri: str) -> str:
    """The object key of a gs:// URI, as a folder prefix."""
    return uri.split("/", 3)[3].rstrip("/") + "/"


def released(result: RunResult) -> str:
    """What the exit handler printed about the TFJobs it deleted (the line and the names)."""
    lines = result.tasks["release"].log.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("release: deleted"))
    names = [line.strip() for line in lines[at + 1 :] if line.startswith("  ")]
    return " ".join([lines[at], *names])


def assert_cleaned_up(cluster: LocalCluster, result: RunResult) -> None:
    """The exit handler ran; the run's TFJob and every worker process are gone."""
    assert result.tasks["release"].state == SUCCEEDED, result.tasks["release"].log
    assert wait_until(lambda: not cluster.tfjobs(result.run_id), timeout=60)
    assert wait_until(lambda: not cluster.live_worker_pids(), timeout=30)


# ---- a run that trains, evaluates and pushes ------------------------------------------------


def test_the_run_trains_on_a_tfjob_and_pushes_version_1(cluster, first):
    assert first.state == SUCCEEDED, first.error
    assert states(first) == dict.fromkeys((*STEPS, "release"), SUCCEEDED)
    pushed = first.tasks["push"].output_artifacts["pushed_model"].metadata
    assert (pushed["pushed"], pushed["pushed_version"]) == (1, "1")
    version = cluster.names("serving/gpt/1/")
    assert "serving/gpt/1/saved_model.pb" in version
    assert any(name.startswith("serving/gpt/1/variables/") for name in version)
    assert not cluster.names("serving/gpt/.staging")


def test_worker_0_wrote_the_model_and_the_work_folder_to_gcs(cluster, first):
    model = cluster.names(key(model_uri(first)))
    assert {n.rsplit("/", 1)[-1] for n in model} >= {"saved_model.pb", "train_metrics.json"}
    metrics = json.loads(
        cluster.gcs.bucket(cluster.bucket)
        .blob(key(model_uri(first)) + "train_metrics.json")
        .download_as_bytes()
    )
    assert (metrics["steps"], metrics["workers"]) == (20, 2)
    work = cluster.names(f"root/work/{first.run_id}/train/")
    assert any("/checkpoints/" in name for name in work)
    assert not [n for n in work if "/backup/" in n]  # the train step removed it after the job
    # The workers wrote through TensorFlow's own GCS file system, which leaves an empty
    # "<folder>/" object per folder it makes; the train step removed the Model's, which KFP's
    # launcher could not have downloaded for evaluate and push.
    assert f"root/work/{first.run_id}/train/checkpoints/" in work
    assert not [n for n in model if n.endswith("/")]
    assert not [n for n in work if "scratch-model" in n or "workertemp" in n]


def test_the_tfjob_ran_two_workers_as_the_train_step(cluster, first):
    pods = cluster.worker_pods(first.run_id)
    labels = [p["metadata"]["labels"] for p in pods]
    assert sorted(lab["training.kubeflow.org/replica-index"] for lab in labels) == ["0", "1"]
    assert {lab["training.kubeflow.org/job-name"] for lab in labels} == {
        job_name(first.run_id, "train")
    }
    for pod in pods:
        spec = pod["spec"]
        assert pod["metadata"]["namespace"] == NAMESPACE
        assert spec["serviceAccountName"] == STEP_SERVICE_ACCOUNT
        assert spec["imagePullSecrets"] == [{"name": PULL_SECRET}]
        (container,) = spec["containers"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
        shm = next(v for v in spec["volumes"] if v["name"] == "dshm")
        assert shm["emptyDir"]["medium"] == "Memory"
        command = container["command"]  # gs:// as compiled: only the process gets local copies
        assert command[:3] == ["python", "-m", "trainer.task"]
        assert command[command.index("--model-dir") + 1] == model_uri(first)
    train = first.tasks["train"]
    name = job_name(first.run_id, "train")
    assert f"created TFJob {NAMESPACE}/{name} (2 workers)" in train.log
    (created,) = [
        r.body for r in cluster.kube.calls("POST", "/tfjobs") if r.body["metadata"]["name"] == name
    ]
    (owner,) = created["metadata"]["ownerReferences"]  # the train step's own pod
    assert (owner["name"], owner["uid"]) == (train.attempts[0].pod_name, train.attempts[0].pod_uid)


def test_tokenize_ran_as_two_indexed_jobs_of_four_parts_with_a_one_part_runs_bytes(
    cluster, first, tmp_path
):
    from components import storage
    from components.storage import gcs as storage_gcs
    from components.tokenize import executor as tokenize
    from contracts.examples import parse_manifest

    pods = cluster.part_pods(first.run_id)
    indexes = sorted(p["metadata"]["labels"][COMPLETION_INDEX_LABEL] for p in pods)
    assert indexes == ["0", "0", "1", "1", "2", "2", "3", "3"]  # phase 1, then phase 2
    for pod in pods:
        assert pod["metadata"]["namespace"] == NAMESPACE
        assert pod["spec"]["serviceAccountName"] == STEP_SERVICE_ACCOUNT
        assert pod["spec"]["containers"][0]["command"][:3] == [
            "python",
            "-m",
            "components.tokenize.parts",
        ]
    # The same corpus, tokenized here in one part: the same dataset, byte for byte (but the
    # manifest, whose sources are named where they were read).
    storage_gcs.set_client(cluster.gcs)
    try:
        examples = first.tasks["tokenize"].output_parameters["examples_uri"]
        manifest = parse_manifest(storage.read_bytes(f"{examples}/manifest.json"), "manifest")
        assert manifest.formats == {"jsonl": 3, "jsonl+gz": 1}
        corpus = tmp_path / "corpus"
        storage.download_dir(cluster.uri("corpus"), corpus)
        params = manifest.parameters
        local = tokenize.run(
            str(corpus),
            str(tmp_path / "examples"),
            vocab_size=params.vocab_size,
            seq_len=params.seq_len,
            unit_bytes=params.unit_bytes,
            parts=1,
            progress=False,
        )
        there = storage.tree_crc32c(examples)
    finally:
        storage_gcs.set_client(None)
    here = storage.tree_crc32c(str(tmp_path / "examples"))
    # The versions differ (GCS fingerprints by crc32c), and on gs:// the manifest also records
    # each shard's crc32c as the store lists it: the local shards' own.
    unchecked = {k: dataclasses.replace(v, shard_crc32c=()) for k, v in manifest.splits.items()}
    assert local.splits == unchecked
    for split in manifest.splits.values():
        assert split.shard_crc32c == tuple(here[shard] for shard in split.shards)
    assert {k: v for k, v in here.items() if k != "manifest.json"} == {
        k: v for k, v in there.items() if k != "manifest.json"
    }


def test_lineage_over_grpc_links_the_pushed_model_to_its_dataset(cluster, first):
    address = cluster.mlmd.address
    summary = lineage.run_summary(address, first.run_id)
    version = first.tasks["tokenize"].output_parameters["dataset_version"]
    assert summary["dataset_version"] == version
    assert [e["state"] for e in summary["executions"]] == ["COMPLETE"] * 4
    train = summary["steps"]["train"]["properties"]
    assert (train["job_name"], train["restarts"]) == (job_name(first.run_id, "train"), 0)
    # Each worker's image as the kubelet reported it, and the step's own pod, read by the step.
    workers = json.loads(train["worker_image_digests"])
    assert sorted(workers.values()) == [IMAGES["trainer"].split("@")[1]] * 2
    assert train["image_digest_observed"] == IMAGES["pipeline"].split("@")[1]
    assert train["image_digest_mismatch"] == 0
    chain = lineage_cmd.trace(address, cluster.uri("serving", "gpt", "1"))
    assert chain["dataset_version"] == version
    assert chain["model"]["uri"] == model_uri(first)
    assert chain["examples"]["uri"] == first.tasks["tokenize"].output_parameters["examples_uri"]
    assert chain["train"]["id"] == summary["steps"]["train"]["id"]


def test_the_exit_handler_leaves_a_finished_tfjob_to_its_ttl(cluster, first):
    # A Succeeded job holds no GPU: the operator deletes it after ttlSecondsAfterFinished, and
    # until then its pods' logs can be read. Only unfinished jobs are the exit handler's.
    assert released(first) == f"release: deleted 0 TFJob(s) of run {first.run_id}"
    assert first.tasks["release"].state == SUCCEEDED
    assert len(cluster.tfjobs(first.run_id)) == 1
    assert wait_until(lambda: not cluster.live_worker_pids(), timeout=30)


# ---- the same data and config again: KFP's cache serves train -------------------------------


def test_a_second_run_takes_train_from_kfps_cache(cluster, first, second):
    assert second.state == SUCCEEDED, second.error
    assert states(second) == {**dict.fromkeys((*STEPS, "release"), SUCCEEDED), "train": CACHED}
    assert second.tasks["train"].cached_from_run == first.run_id
    assert model_uri(second) == model_uri(first)
    assert not cluster.worker_pods(second.run_id)  # no TFJob: nothing trained
    pushed = second.tasks["push"].output_artifacts["pushed_model"].metadata
    # The push published nothing, and says so: version 1 stays credited to the first run.
    assert pushed["pushed"] == 0 and "already served as version 1" in pushed["reason"]
    assert cluster.names("serving/gpt/.claims/") == ["serving/gpt/.claims/1"]  # no new claim
    assert not [
        n
        for n in cluster.names("serving/gpt/")
        if not n.startswith(("serving/gpt/1/", "serving/gpt/.claims/"))
    ]
    summary = lineage.run_summary(cluster.mlmd.address, second.run_id)
    train = summary["steps"]["train"]
    assert train["state"] == "CACHED"
    assert train["properties"]["cached_from_run_id"] == first.run_id
    assert released(second).startswith("release: deleted 0 TFJob(s)")


# ---- runs stopped while their TFJob trains --------------------------------------------------


def start_and_wait_for_training(cluster: LocalCluster) -> RunHandle:
    """Start a run of the LONG config; return once both of its workers have trained a step."""
    handle = cluster.backend.start(cluster.yaml, cluster.params(config=LONG))

    def training() -> bool:
        pods = cluster.worker_pods(handle.run_id)
        logs = [cluster.worker_log(p) for p in pods]
        return len(pods) == 2 and all("step 1 loss" in log for log in logs)

    assert wait_until(training, timeout=RUN_TIMEOUT), "the TFJob's workers never trained"
    return handle


@pytest.mark.fault("a cluster run is cancelled through the KFP backend")
def test_a_cancelled_run_leaves_no_tfjob_and_no_worker(cluster):
    handle = start_and_wait_for_training(cluster)
    handle.cancel()
    result = handle.wait(timeout=RUN_TIMEOUT)
    assert result.state == FAILED  # KFP 2.5 reports a terminated run by its workflow: failed
    assert result.tasks["train"].state == FAILED
    assert (result.tasks["evaluate"].state, result.tasks["push"].state) == (SKIPPED, SKIPPED)
    assert_cleaned_up(cluster, result)


@pytest.mark.fault("the train step pod is SIGKILLed on the cluster")
def test_a_killed_train_step_fails_the_run_and_the_exit_handler_deletes_its_tfjob(cluster):
    handle = start_and_wait_for_training(cluster)
    handle.kill_task("train")  # the launcher's pod dies (OOM, node lost): nobody deletes the job
    result = handle.wait(timeout=RUN_TIMEOUT)
    assert result.state == FAILED
    train = result.tasks["train"]
    # KFP 2.5.0 ignores a retry policy inside an ExitHandler (docs/cluster-runner.md): one pod.
    assert train.state == FAILED and [a.exit_code for a in train.attempts] == [137]
    name = job_name(result.run_id, "train")
    assert released(result) == f"release: deleted 1 TFJob(s) of run {result.run_id} {name}"
    assert_cleaned_up(cluster, result)
    # The killed step could not complete its own execution; the exit handler recorded it.
    assert "recorded train as FAILED" in result.tasks["release"].log
    step, error = lineage.failure_of(cluster.mlmd.address, result.run_id)
    assert step == "train" and "killed" in error


def test_doctor_in_cluster_checks_as_a_steps_identity(cluster, tmp_path):
    """`gptpipe doctor --in-cluster`'s one-step pipeline, run by the backend as a step: its
    reviews are the step pod's, in its namespace; a denied verb fails the run."""
    from pipelines import doctor

    yaml = tmp_path / "doctor.yaml"
    doctor.compile_to(str(yaml), IMAGES["pipeline"])
    params = {
        "pipeline_root": cluster.uri("root"),
        "train_job": TrainJob(workers=2, gpus_per_worker=0).to_dict(),
    }
    kept = len(cluster.kube.access.reviews)
    result = cluster.backend.run(yaml, params, timeout=RUN_TIMEOUT)
    assert result.state == SUCCEEDED, result.error
    log = result.tasks["doctor"].attempts[-1].log
    assert "✔ access in" in log and "✔ pipeline root" in log and "✔ metadata service" in log
    assert {r["namespace"] for r in cluster.kube.access.reviews[kept:]} == {NAMESPACE}

    cluster.kube.access.deny(NAMESPACE, "create", "kubeflow.org", "tfjobs")
    try:
        result = cluster.backend.run(yaml, params, timeout=RUN_TIMEOUT)
    finally:
        cluster.kube.access.denied.clear()
    assert result.state == FAILED
    assert "✘ access in" in result.tasks["doctor"].attempts[-1].log
