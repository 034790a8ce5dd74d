"""The TFJob launcher against the operator double running real processes: restarts counted
once per restart of the job, re-attaching, a Failed job run again, the deadline, cancellation.

The fast tests run tests/doubles/kubernetes/fake_worker.py; the slow ones run the trainer itself
(2 workers, the tiny config) and inject faults with its test-only `--fault-*` flags
(trainer/faults.py).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from components.jobs import kube as kube_api
from components.jobs.errors import LaunchCancelled, LaunchError, LaunchTimeout, WorkerInputError
from components.jobs.spec import JobSpec
from components.jobs.tfjob import launcher as tfjob
from components.jobs.tfjob import manifest
from components.jobs.tfjob.restarts import PODS_ANNOTATION as PODS
from components.train import executor
from tests.doubles.kubernetes.apiserver import FakeKube
from tests.doubles.kubernetes.fake_worker import BAD_SHARD
from tests.processes import alive
from tests.tiny import TINY_OVERRIDES
from trainer.config import resolve_config

REPO = Path(__file__).resolve().parents[2]
FAKE_WORKER = Path(__file__).parents[1] / "doubles" / "kubernetes" / "fake_worker.py"
IMAGE = "us-docker.pkg.dev/proj/gptpipe/trainer@sha256:" + "cd" * 32
RUN = "3f2a9c1e-5b7d-4e0a-9c1b-2d3e4f5a6b7c"
KEY = ("ml", "train-faults")
# The trainer image's environment (images/Dockerfile ENV), with this checkout on the path and
# this interpreter's folder first on PATH, where the pod's `python` is looked up.
IMAGE_ENV = {
    "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    "PYTHONPATH": str(REPO),
    "PYTHONUNBUFFERED": "1",
    "TF_USE_LEGACY_KERAS": "1",
    "TF_ENABLE_ONEDNN_OPTS": "1",
    "TF_CPP_MIN_LOG_LEVEL": "2",
}


def running(root: Path, **kwargs: Any) -> FakeKube:
    env = {**IMAGE_ENV, "HOME": str(root)}
    return FakeKube.running(root / "nodes", env, grace_seconds=3, **kwargs)


def launch(kube: FakeKube, spec: JobSpec, **kwargs: Any) -> tuple[Any, str]:
    out = io.StringIO()
    launcher = tfjob.TFJobLauncher(kube.api_client(), out=out, poll_seconds=2)
    try:
        return launcher.run(spec, **kwargs), out.getvalue()
    finally:
        kube.output = out.getvalue()


def fake_spec(records: Path, mode: str, **overrides: Any) -> JobSpec:
    fields: dict[str, Any] = dict(
        name=KEY[1],
        namespace="ml",
        image=IMAGE,
        command=[sys.executable, str(FAKE_WORKER), mode, str(records)],
        workers=2,
        run_id=RUN,
        backoff_limit=2,
    )
    fields.update(overrides)
    return JobSpec(**fields)


def annotations(kube: FakeKube) -> dict[str, str]:
    with kube.cluster.cond:
        return dict(kube.cluster.tfjobs[KEY]["metadata"].get("annotations") or {})


def pids(kube: FakeKube) -> list[int]:
    assert kube.kubelet is not None
    return list(kube.kubelet.all_pids)


def starts(records: Path, index: int) -> list[str]:
    path = records / f"starts-{index}.jsonl"
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def records(tmp_path: Path) -> Path:
    """The fake workers' records; `hold` keeps lose-peer's worker 1 alive (`release_when_seen`)."""
    folder = tmp_path / "rec"
    folder.mkdir()
    (folder / "hold").touch()
    return folder


def release_when_seen(kube: FakeKube, records: Path) -> None:
    """Let lose-peer's worker 1 die once the launcher has recorded every worker's first pod on
    the job (its ledger's annotation): a restart it could not see would not be counted."""

    def seen(cluster: Any) -> bool:
        job = cluster.tfjobs.get(KEY) or {}
        pods = json.loads((job.get("metadata", {}).get("annotations") or {}).get(PODS, "{}"))
        return all(pods.get(str(i), [""])[0] for i in (0, 1))

    def release() -> None:
        if kube.wait_for(seen, timeout=300):
            (records / "hold").unlink()

    threading.Thread(target=release, daemon=True).start()


# -- fast: fake workers --


@pytest.mark.fault("every pod of a TFJob fails at once")
def test_a_lost_worker_is_one_restart_however_many_pods_failed(tmp_path, records):
    with running(tmp_path) as kube:
        release_when_seen(kube, records)
        result, out = launch(kube, fake_spec(records, "lose-peer"))
        kept = annotations(kube)
    # Worker 1 was killed, worker 0 then lost it: both pods failed and were recreated once.
    assert [len(starts(records, i)) for i in (0, 1)] == [2, 2]
    assert (result.restarts, result.attempts) == (1, 2)
    assert "Restarting: TFJobRestarting" in out
    assert kept["gptpipe.dev/restarts"] == "1"
    assert {i: n for i, (_, n) in json.loads(kept["gptpipe.dev/worker-pods"]).items()} == {
        "0": 1,
        "1": 1,
    }


@pytest.mark.fault("the launcher re-attaches to a restarting job")
def test_a_reattached_launcher_counts_on_from_the_annotation(tmp_path, records):
    existing = manifest.build_manifest(fake_spec(records, "lose-peer"))
    existing["metadata"]["annotations"] = {"gptpipe.dev/restarts": "2"}  # an earlier launcher's
    with running(tmp_path, existing=existing) as kube:
        release_when_seen(kube, records)
        result, out = launch(kube, fake_spec(records, "lose-peer", backoff_limit=3))
        assert len(kube.calls("POST")) == 1 and not kube.calls("DELETE")
    assert result.reattached and result.restarts == 3
    assert "re-attached to existing TFJob ml/train-faults" in out


@pytest.mark.fault("a job keeps failing past its backoff limit")
def test_restarts_past_the_backoff_limit_delete_the_job(tmp_path, records):
    existing = manifest.build_manifest(fake_spec(records, "lose-peer"))
    existing["metadata"]["annotations"] = {"gptpipe.dev/restarts": "2"}
    with running(tmp_path, existing=existing) as kube:
        release_when_seen(kube, records)
        with pytest.raises(LaunchError) as err:
            launch(kube, fake_spec(records, "lose-peer", backoff_limit=2))
        assert kube.wait_for(lambda c: not c.tfjobs, timeout=15)
    assert err.value.reason == "BackoffLimitExceeded" and "restarted 3 times" in str(err.value)
    # Worker 1 was SIGKILLed, worker 0 lost it: the error says so, though the operator deleted
    # both pods at once (from its ExitedWithCode events, or a pod listing that came in time).
    assert (err.value.replica, err.value.exit_code) == ("worker-1", 137)
    assert "worker exits: worker-1 exited with code 137" in str(err.value)
    assert "; worker-0 exited with code 143" in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("wrote", "input_error"),
    [("record", True), ("long", True), ("overlong", False), ("text", False), ("nothing", False)],
)
def test_a_workers_termination_message_reaches_the_launcher(tmp_path, records, wrote, input_error):
    """Worker 1 exits 2 having written its termination-message file: the trainer's record
    (its message shortened to fit) is a WorkerInputError with its message; what the kubelet
    cut, text, or nothing is an ordinary failure, though the log says `error: ...` each time."""
    with running(tmp_path) as kube, pytest.raises(LaunchError) as err:
        launch(kube, fake_spec(records, f"wrote-{wrote}"))
    e = err.value
    assert (e.replica, e.exit_code) == ("worker-1", 2)
    assert isinstance(e, WorkerInputError) == input_error
    first = str(e).splitlines()[0]
    if input_error:
        head = f"TFJob ml/train-faults failed: worker-1 exited with code 2: {BAD_SHARD}"
        assert first == head if wrote == "record" else first.startswith(head + " yyy"), first
        assert len(first.encode()) < 4096 and (wrote == "record" or first.endswith("y…"))
    else:
        assert first.startswith("TFJob ml/train-faults failed: TFJobFailed: "), first
        assert f"  | error: {BAD_SHARD}" in str(e)


@pytest.mark.fault("a worker's bad input, with no restarts allowed")
def test_a_backoff_limit_of_zero_still_reads_why_the_worker_failed(tmp_path, records):
    """The worker's bad input is still named: backoff_limit=0 is the launcher's alone.

    Were it the TFJob's runPolicy.backoffLimit, the operator would fail the job at the first
    failed pod and delete every pod, the failed one with its termination message (common/
    job.go; manifest.py `operator_backoff_limit`)."""
    with running(tmp_path) as kube, pytest.raises(WorkerInputError) as err:
        launch(kube, fake_spec(records, "wrote-record", backoff_limit=0))
    assert (err.value.replica, err.value.exit_code) == ("worker-1", 2)
    assert str(err.value).splitlines()[0].endswith(BAD_SHARD)


@pytest.mark.fault("a worker is killed, with no restarts allowed")
def test_a_backoff_limit_of_zero_fails_at_the_first_restart_naming_the_exits(tmp_path, records):
    with running(tmp_path) as kube:
        release_when_seen(kube, records)
        with pytest.raises(LaunchError) as err:
            launch(kube, fake_spec(records, "lose-peer", backoff_limit=0))
        assert kube.wait_for(lambda c: not c.tfjobs, timeout=15)
    assert err.value.reason == "BackoffLimitExceeded" and "restarted 1 times" in str(err.value)
    assert (err.value.replica, err.value.exit_code) == ("worker-1", 137)


@pytest.mark.fault("every worker goes over its memory limit")
def test_workers_killed_for_memory_fail_the_job_saying_how_much_they_had(tmp_path, records):
    """The job fails naming exit 137 and the memory each worker had (backoff.py).

    The kubelet double OOM-kills a container over its limit (137, OOMKilled)."""
    job = fake_spec(records, "eat-256", memory="64Mi", shm_size="", backoff_limit=0)
    with running(tmp_path) as kube:
        with pytest.raises(LaunchError) as err:
            launch(kube, job)
        assert kube.wait_for(lambda c: not c.tfjobs, timeout=15)
    assert err.value.reason == "BackoffLimitExceeded" and err.value.exit_code == 137
    assert "each worker has 64Mi of memory (train_job.memory)" in str(err.value)


@pytest.mark.fault("a retried launcher finds its job Failed")
def test_a_reattach_to_a_failed_job_deletes_it_and_runs_it_again(tmp_path, records):
    spec = fake_spec(records, "fail-until-fixed")
    with running(tmp_path) as kube:
        with pytest.raises(LaunchError) as err:
            launch(kube, spec)
        assert err.value.exit_code == 2 and KEY in kube.cluster.tfjobs  # kept for its TTL
        first_uid = kube.cluster.tfjobs[KEY]["metadata"]["uid"]
        (records / "fixed").touch()  # what a retry is for: the cause went away
        result, out = launch(kube, spec)
        assert kube.cluster.tfjobs[KEY]["metadata"]["uid"] != first_uid
        (delete,) = kube.calls("DELETE")
    assert delete.query["propagationPolicy"] == "Foreground"
    assert "failed in an earlier attempt" in out and not result.reattached
    assert result.restarts == 0


@pytest.mark.fault("a job runs past its active deadline")
def test_the_active_deadline_fails_the_job_and_the_launcher_reports_it(tmp_path, records):
    with running(tmp_path) as kube:
        with pytest.raises(LaunchTimeout) as err:
            launch(kube, fake_spec(records, "hang", active_deadline_seconds=1))
        assert kube.wait_for(lambda c: not c.pods, timeout=15)
        assert KEY in kube.cluster.tfjobs and not kube.calls("DELETE")  # the operator's doing
    assert err.value.reason == "DeadlineExceeded"
    assert "active longer than specified deadline" in str(err.value)
    assert not any(alive(p) for p in pids(kube))


@pytest.mark.fault("a retried launcher finds its job failed past its deadline")
def test_a_retry_does_not_run_again_a_job_that_ran_past_its_deadline(tmp_path, records):
    spec = fake_spec(records, "hang", active_deadline_seconds=1)
    with running(tmp_path) as kube:
        with pytest.raises(LaunchTimeout):
            launch(kube, spec)
        assert kube.wait_for(lambda c: not c.pods, timeout=15)
        first_uid = kube.cluster.tfjobs[KEY]["metadata"]["uid"]
        with pytest.raises(LaunchTimeout) as err:
            launch(kube, spec)  # KFP's retry of the train step: its create answered 409
        assert kube.cluster.tfjobs[KEY]["metadata"]["uid"] == first_uid  # no fresh deadline
        assert not kube.calls("DELETE") and not kube.cluster.pods
    assert err.value.reason == "DeadlineExceeded"
    assert "ran past its deadline in an earlier attempt" in str(err.value)
    assert not any(alive(p) for p in pids(kube))


def sigterm_when(kube: FakeKube, predicate: Any) -> threading.Thread:
    """SIGTERM this process once predicate(cluster) holds: Kubernetes cancelling the step."""

    def fire() -> None:
        if kube.wait_for(predicate, timeout=120):
            os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=fire, daemon=True)
    thread.start()
    return thread


@pytest.mark.fault("a run is cancelled while its TFJob runs")
def test_cancel_deletes_the_job_and_its_worker_processes(tmp_path, records):
    with running(tmp_path) as kube:
        sigterm_when(kube, lambda c: len(c.pods) == 2 and len(pids(kube)) == 2)
        with pytest.raises(LaunchCancelled):
            launch(kube, fake_spec(records, "hang"))
        assert kube.calls("DELETE")[0].query["propagationPolicy"] == "Foreground"
        assert kube.wait_for(lambda c: not c.tfjobs and not c.pods, timeout=15)
    assert len(pids(kube)) == 2 and not any(alive(p) for p in pids(kube))


# -- slow: the trainer itself --


def trainer_spec(root: Path, examples: Path, *flags: str, **overrides: Any) -> JobSpec:
    """The train step's JobSpec for a TFJob (executor.job_spec), plus fault flags."""
    cfg = resolve_config("tiny", TINY_OVERRIDES)
    spec = executor.job_spec(
        str(examples),
        str(root / "model"),
        str(root / "work"),
        cfg,
        launcher="tfjob",
        run_id=RUN,
        image=IMAGE,
        namespace="ml",
        workers=2,
        backoff_limit=2,
        env={"TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    return dataclasses.replace(spec, name=KEY[1], command=(*spec.command, *flags), **overrides)


@pytest.mark.heavy
@pytest.mark.slow
def test_the_train_step_runs_a_tfjob_as_its_own_identity(tmp_path, examples):
    with running(tmp_path) as kube:
        kube.cluster.add_pod(
            "ml",
            "run-train-pod",
            {"main": (IMAGE, IMAGE)},
            service_account="pipeline-runner",
            image_pull_secrets=("regcred",),
        )
        # Every worker pod as admitted: one still running when worker 0 ends the job is
        # deleted by cleanPodPolicy Running (on a loaded machine worker 1 can be that one).
        pod_specs: list[dict[str, Any]] = []
        admit = kube.cluster.create_pod

        def recording(pod: dict[str, Any]) -> dict[str, Any]:
            created = admit(pod)
            pod_specs.append(created["spec"])
            return created  # what create_pod returns, as before

        kube.cluster.create_pod = recording
        identity = kube_api.PodIdentity("run-train-pod", "uid-1", "ml")
        placement = executor.cluster_placement(identity, api_client=kube.api_client())
        spec = dataclasses.replace(trainer_spec(tmp_path, examples), **placement)
        out = io.StringIO()
        launcher = tfjob.TFJobLauncher(kube.api_client(), out=out, poll_seconds=2)
        cfg = resolve_config("tiny", TINY_OVERRIDES)
        trained = executor.run(spec, cfg, str(tmp_path / "model"), str(tmp_path / "work"), launcher)
    assert trained.model_properties["steps"] == 40
    assert trained.execution_properties["restarts"] == 0
    assert (tmp_path / "model" / "Format-Serving" / "saved_model.pb").is_file()
    assert len(pod_specs) == 2
    for pod in pod_specs:
        assert pod["serviceAccountName"] == "pipeline-runner"
        assert pod["imagePullSecrets"] == [{"name": "regcred"}]


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.fault("a TFJob worker SIGKILLed mid-training")
def test_a_killed_worker_costs_exactly_one_restart(tmp_path, examples):
    """SIGKILL (a node lost, OOM). test_a_launcher_that_died... preempts with SIGTERM."""
    flags = ("--fault-at-step", "25", "--fault-signal", "KILL")
    with running(tmp_path) as kube:
        result, out = launch(kube, trainer_spec(tmp_path, examples, *flags))
        kept = annotations(kube)
        texts = ["\n".join(lines) for lines in kube.cluster.logs.values()]
    assert (result.restarts, result.attempts) == (1, 2)
    assert kept["gptpipe.dev/restarts"] == "1"
    resumed = [t for t in texts if "resumed at step" in t]
    assert len(resumed) >= 2 and all("resumed at step 20 " in t for t in resumed)
    assert (tmp_path / "model" / "Format-Serving" / "saved_model.pb").is_file()


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.fault("the chief dies while exporting")
def test_a_chief_that_dies_during_export_restarts_the_whole_job(tmp_path, examples):
    flags = ("--fault-at-export", "--fault-worker", "0", "--fault-signal", "KILL")
    with running(tmp_path) as kube:
        result, out = launch(kube, trainer_spec(tmp_path, examples, *flags), timeout_seconds=240)
        texts = ["\n".join(lines) for lines in kube.cluster.logs.values()]
    assert (result.restarts, result.attempts) == (1, 2)
    assert sum("fault injection: SIGKILL at the export" in t for t in texts) == 1
    # Worker 1 was waiting at the export barrier: it lost the chief and exited retryably,
    # instead of exiting 0 and leaving a Succeeded pod the operator would never recreate.
    assert sum("exiting 143 to retry from the backup" in t for t in texts) == 1
    assert sum("resumed at step 40 " in t for t in texts) == 2  # and only exported again
    assert (tmp_path / "model" / "Format-Serving" / "saved_model.pb").is_file()


LAUNCHER = """
import json, sys
from kubernetes import client
from components.jobs.tfjob import launcher as tfjob
from components.jobs.spec import JobSpec
spec = JobSpec(**json.loads(sys.argv[2]))
api = client.ApiClient(client.Configuration(host=sys.argv[1]))
tfjob.TFJobLauncher(api, poll_seconds=2).run(spec)
"""


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.fault("the launcher killed and retried")
def test_a_launcher_that_died_is_continued_by_its_retry(tmp_path, examples):
    spec = trainer_spec(tmp_path, examples, "--fault-at-step", "25", "--fault-signal", "TERM")
    fields = {k: v for k, v in dataclasses.asdict(spec).items() if v is not None}
    with running(tmp_path) as kube:
        first = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, kube.host, json.dumps(fields)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:  # the first launcher counts the restart, then its pod dies (OOM, node lost)
            restarted = kube.wait_for(
                lambda c: (
                    (c.tfjobs.get(KEY, {}).get("metadata", {}).get("annotations") or {}).get(
                        "gptpipe.dev/restarts"
                    )
                    == "1"
                ),
                timeout=120,
            )
        finally:
            first.kill()
            first.wait()
        assert restarted
        result, out = launch(kube, spec)
        texts = ["\n".join(lines) for lines in kube.cluster.logs.values()]
    assert result.reattached and (result.restarts, result.attempts) == (1, 2)
    assert "re-attached to existing TFJob ml/train-faults" in out
    # The SIGTERM preemption: both workers backed up at step 25 and resumed there.
    assert sum("resumed at step 25 " in t for t in texts) == 2


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.fault("a retried launcher re-runs a Failed job")
def test_a_failed_job_is_run_again_by_a_retried_launcher(tmp_path, examples):
    missing = tmp_path / "examples"  # not there yet: every worker exits 2 (a user error)
    spec = trainer_spec(tmp_path, missing)
    with running(tmp_path) as kube:
        with pytest.raises(LaunchError) as err:
            launch(kube, spec)
        assert err.value.exit_code == 2 and KEY in kube.cluster.tfjobs
        missing.symlink_to(examples, target_is_directory=True)
        result, out = launch(kube, spec)
        assert len(kube.calls("DELETE")) == 1
    assert "failed in an earlier attempt" in out and not result.reattached
    assert (tmp_path / "model" / "Format-Serving" / "saved_model.pb").is_file()


@pytest.mark.slow
@pytest.mark.fault("the deadline passes while trainers run")
def test_the_deadline_stops_the_trainers(tmp_path, examples):
    with running(tmp_path) as kube:
        with pytest.raises(LaunchTimeout) as err:
            launch(kube, trainer_spec(tmp_path, examples, active_deadline_seconds=3))
        assert kube.wait_for(lambda c: not c.pods, timeout=30)
    assert err.value.reason == "DeadlineExceeded"
    assert len(pids(kube)) == 2 and not any(alive(p) for p in pids(kube))


@pytest.mark.slow
@pytest.mark.fault("a run is cancelled while trainers run")
def test_cancel_stops_the_trainers(tmp_path, examples):
    with running(tmp_path) as kube:

        def training(cluster: Any) -> bool:
            lines = [line for log in cluster.logs.values() for line in log]
            return sum("trainer training" in line for line in lines) == 2

        sigterm_when(kube, training)
        with pytest.raises(LaunchCancelled):
            launch(kube, trainer_spec(tmp_path, examples))
        assert kube.wait_for(lambda c: not c.tfjobs and not c.pods, timeout=30)
    assert len(pids(kube)) == 2 and not any(alive(p) for p in pids(kube))
