"""The indexed launchers, local processes and a batch/v1 Indexed Job on the Kubernetes double,
run the same parts (tests/doubles/kubernetes/fake_part.py) with the same semantics."""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from components.jobs import kube as kube_api
from components.jobs.errors import LaunchCancelled, LaunchError, WorkerInputError
from components.jobs.indexed import manifest
from components.jobs.indexed.cleanup import delete_run_jobs
from components.jobs.indexed.job import IndexedJobLauncher
from components.jobs.indexed.launcher import IndexedResult
from components.jobs.indexed.local import LocalIndexedLauncher
from components.jobs.indexed.make import make_indexed_launcher, place
from components.jobs.indexed.spec import IndexedJobSpec
from contracts.errors import UserError
from contracts.termination import INPUT_ERROR_EXIT
from tests.doubles.kubernetes.apiserver import IMAGE_DIGEST, FakeKube
from tests.doubles.kubernetes.fake_part import BAD_INPUT
from tests.doubles.kubernetes.pod_security import restricted_violations
from tests.processes import alive

FAKE_PART = Path(__file__).parents[2] / "doubles" / "kubernetes" / "fake_part.py"
IMAGE = f"us-docker.pkg.dev/proj/gptpipe/parts@{IMAGE_DIGEST}"
RUN = "run-1"
Run = Callable[..., IndexedResult]


def make_spec(records: Path, mode: str, **overrides: Any) -> IndexedJobSpec:
    fields: dict[str, Any] = dict(
        name="parts-run-1",
        namespace="ml",
        image=IMAGE,
        run_id=RUN,
        command=[sys.executable, str(FAKE_PART), mode, str(records)],
        completions=4,
        parallelism=2,
        env={"GPTPIPE_EXTRA": "extra"},
    )
    fields.update(overrides)
    return IndexedJobSpec(**fields)


def starts(records: Path, index: int) -> list[dict[str, Any]]:
    path = records / f"starts-{index}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def records(tmp_path: Path) -> Path:
    folder = tmp_path / "rec"
    folder.mkdir()
    return folder


@pytest.fixture(params=["local", "job"])
def launch(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Run, Any]]:
    """(kind, run(spec), the double or None): each launcher, the Job one on the double."""
    out = io.StringIO()
    if request.param == "local":
        local = LocalIndexedLauncher(tmp_path / "logs", out, kill_grace_seconds=2)
        yield "local", local.run, None
        return
    env = {"PATH": os.environ["PATH"]}
    with FakeKube.running(tmp_path / "nodes", env, grace_seconds=2, pod_failure_backoff=0.05) as k:
        job = IndexedJobLauncher(k.api_client(), out, poll_seconds=5)
        yield "job", job.run, k


@pytest.mark.slow
def test_every_index_succeeds_once_at_most_parallelism_at_a_time(launch, records):
    kind, run, kube = launch
    result = run(make_spec(records, "ok"))
    assert (result.launcher, result.job_name, result.completions) == (kind, "parts-run-1", 4)
    assert result.retries == 0 and result.wall_seconds >= 0
    for index in range(4):
        (once,) = starts(records, index)
        assert once["extra"] == "extra" and once["running"] <= 2
    if kube is not None:  # the pods ran the image pinned: their digests are the result's
        assert len(result.image_digests) == 4
        assert set(result.image_digests.values()) == {IMAGE_DIGEST}


@pytest.mark.slow
def test_a_killed_part_is_run_again(launch, records):
    _, run, _ = launch
    result = run(make_spec(records, "flaky-2"))
    assert result.retries == 1
    assert [len(starts(records, i)) for i in range(4)] == [1, 1, 2, 1]


@pytest.mark.slow
@pytest.mark.bad_input("a part exits 2 naming its bad input")
def test_bad_input_fails_the_job_at_once_with_the_parts_message_first(launch, records):
    _, run, _ = launch
    spec = make_spec(records, "bad-1", env={"FAKE_PARTS": "2"}, backoff_limit_per_index=3)
    with pytest.raises(WorkerInputError) as err:
        run(spec)
    assert isinstance(err.value, UserError)  # the step prints it as the user's to fix
    first = str(err.value).splitlines()[0]
    assert first.endswith(f"index-1 exited with code 2: {BAD_INPUT}")
    assert err.value.exit_code == INPUT_ERROR_EXIT and err.value.replica == "index-1"
    assert len(starts(records, 1)) == 1  # not run again
    others = [s["pid"] for s in starts(records, 0)]
    assert others and not any(alive(p) for p in others)  # the running one was stopped
    assert not starts(records, 3)  # nor was any other index started


@pytest.mark.slow
def test_an_index_failing_past_its_retries_fails_the_job_once_all_ended(launch, records):
    kind, run, _ = launch
    with pytest.raises(LaunchError) as err:
        run(make_spec(records, "fail-3", backoff_limit_per_index=1))
    assert err.value.reason == "FailedIndexes"
    assert "failed indexes: 3" in str(err.value) or "indexes 3 failed" in str(err.value)
    assert err.value.replica == "index-3" and err.value.exit_code == 1
    assert "error: part failed" in err.value.log_tail
    assert [len(starts(records, i)) for i in range(4)] == [1, 1, 1, 2]


@pytest.mark.slow
def test_sigterm_stops_every_part_and_deletes_the_job(launch, records):
    kind, run, kube = launch
    started = threading.Event()

    def cancel_once_started() -> None:
        while not (starts(records, 0) and starts(records, 1)):
            if started.wait(0.02):
                return
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=cancel_once_started, daemon=True)
    thread.start()
    try:
        with pytest.raises(LaunchCancelled):
            run(make_spec(records, "hang"))
    finally:
        started.set()
        thread.join()
    if kube is not None:
        (delete,) = kube.calls("DELETE", "/jobs/parts-run-1")
        assert delete.query["propagationPolicy"] == "Foreground"
        assert kube.wait_for(lambda c: not c.jobs and not c.pods, timeout=30)
    pids = [s["pid"] for i in (0, 1) for s in starts(records, i)]
    assert not any(alive(p) for p in pids)


@pytest.mark.slow
def test_a_retried_launcher_reattaches_to_its_job_after_a_409(tmp_path, records):
    env = {"PATH": os.environ["PATH"]}
    spec = make_spec(records, "ok")
    with FakeKube.running(tmp_path / "nodes", env, grace_seconds=2) as kube:
        client.BatchV1Api(kube.api_client()).create_namespaced_job(
            "ml", manifest.build_manifest(spec)
        )
        out = io.StringIO()
        result = IndexedJobLauncher(kube.api_client(), out, poll_seconds=5).run(spec)
        posts = kube.calls("POST", "/jobs")
    assert result.reattached and result.completions == 4
    assert len(posts) == 2 and "re-attached to existing Job ml/parts-run-1" in out.getvalue()
    assert [len(starts(records, i)) for i in range(4)] == [1, 1, 1, 1]  # one Job ran


@pytest.mark.slow
def test_the_exit_handler_deletes_a_runs_unfinished_jobs(tmp_path, records):
    with FakeKube() as kube:
        for name, run_id in (("parts-a", RUN), ("parts-b", "run-2")):
            body = manifest.build_manifest(make_spec(records, "ok", name=name, run_id=run_id))
            client.BatchV1Api(kube.api_client()).create_namespaced_job("ml", body)
        assert delete_run_jobs(kube.api_client(), "ml", RUN) == ["parts-a"]
        assert set(kube.cluster.jobs) == {("ml", "parts-b")}
        (delete,) = kube.calls("DELETE", "/jobs/parts-a")
        assert delete.query["propagationPolicy"] == "Foreground"


def test_the_manifest_is_an_indexed_job_kubernetes_runs_as_asked():
    spec = make_spec(Path("/r"), "ok", active_deadline_seconds=600, ttl_seconds_after_finished=60)
    job = manifest.build_manifest(spec)
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    body = job["spec"]
    assert (body["completionMode"], body["completions"], body["parallelism"]) == ("Indexed", 4, 2)
    assert body["backoffLimitPerIndex"] == 2
    assert (body["activeDeadlineSeconds"], body["ttlSecondsAfterFinished"]) == (600, 60)
    fail_job, ignore = body["podFailurePolicy"]["rules"]
    assert fail_job["action"] == "FailJob" and fail_job["onExitCodes"]["values"] == [2]
    assert ignore == {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    template = body["template"]
    assert template["spec"]["restartPolicy"] == "Never"
    assert template["metadata"]["labels"]["gptpipe.dev/run-id"] == RUN
    assert template["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
    assert restricted_violations(dict(template["spec"]), None) == []
    (container,) = template["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["GPTPIPE_TERMINATION_MESSAGE"] == container["terminationMessagePath"]
    assert container["resources"]["requests"] == container["resources"]["limits"]
    with pytest.raises(UserError, match="not pinned by digest"):
        manifest.build_manifest(make_spec(Path("/r"), "ok", image="parts:latest"))


@pytest.mark.parametrize(
    "field, value",
    [("completions", 0), ("parallelism", 0), ("backoff_limit_per_index", -1), ("cpu", "two")],
)
def test_a_spec_kubernetes_would_refuse_is_a_user_error(field, value):
    with pytest.raises(UserError, match=f"IndexedJobSpec {field}"):
        make_spec(Path("/r"), "ok", **{field: value})


def test_the_launcher_is_chosen_by_name_and_placed_from_the_steps_pod(tmp_path):
    assert isinstance(make_indexed_launcher("local", str(tmp_path)), LocalIndexedLauncher)
    with pytest.raises(UserError, match="use one of job, local"):
        make_indexed_launcher("tfjob", None)
    pod = kube_api.PodIdentity("run-tokenize-1", "uid-7", "team-a")
    with FakeKube() as kube:
        kube.cluster.add_pod(
            "team-a", "run-tokenize-1", {"main": (IMAGE, IMAGE)}, image_pull_secrets=("regcred",)
        )
        placed = place(make_spec(tmp_path, "ok"), pod, api_client=kube.api_client())
    assert (placed.namespace, placed.owner.uid) == ("team-a", "uid-7")
    assert (placed.service_account, placed.image_pull_secrets) == ("default", ("regcred",))
    assert place(make_spec(tmp_path, "ok"), kube_api.PodIdentity()) == make_spec(tmp_path, "ok")


@pytest.mark.slow
def test_the_release_exit_handler_deletes_the_runs_indexed_jobs_in_a_pod(
    tmp_path, records, monkeypatch
):
    from components.train import release
    from contracts.params import TrainJob

    with FakeKube() as kube:
        body = manifest.build_manifest(make_spec(records, "ok"))
        client.BatchV1Api(kube.api_client()).create_namespaced_job("ml", body)
        monkeypatch.setattr(kube_api, "default_api_client", kube.api_client)
        monkeypatch.setenv("KFP_RUN_ID", RUN)
        monkeypatch.setenv(kube_api.POD_NAMESPACE_ENV, "ml")
        monkeypatch.delenv(kube_api.POD_NAME_ENV, raising=False)
        store = str(tmp_path / "metadata.sqlite")
        local = TrainJob(launcher="local").to_dict()
        assert release.release(local, store) == 0  # not in a pod: no cluster to clean
        monkeypatch.setenv(kube_api.POD_NAME_ENV, "run-release-pod")
        assert release.release(local, store) == 1
        assert not kube.cluster.jobs
