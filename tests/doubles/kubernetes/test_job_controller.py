"""The Job controller double plays Kubernetes 1.31's Indexed Jobs and their TTL, with the kubelet
running each part as a process (fake_part.py), through the Kubernetes client."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from components.jobs.indexed import manifest as indexed_manifest
from components.jobs.indexed.spec import IndexedJobSpec
from contracts import termination
from tests.doubles.kubernetes.apiserver import FakeKube
from tests.doubles.kubernetes.fake_part import BAD_INPUT
from tests.doubles.kubernetes.job_controller import intervals, parse_intervals
from tests.processes import alive

FAKE_PART = Path(__file__).parent / "fake_part.py"
IMAGE = "us-docker.pkg.dev/proj/gptpipe/parts@sha256:" + "cd" * 32
KEY = ("ml", "parts")
INDEX = "batch.kubernetes.io/job-completion-index"


@pytest.fixture
def records(tmp_path: Path) -> Path:
    folder = tmp_path / "rec"
    folder.mkdir()
    return folder


def manifest(records: Path, mode: str, **overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = dict(
        name="parts",
        namespace="ml",
        image=IMAGE,
        command=[sys.executable, str(FAKE_PART), mode, str(records)],
        completions=3,
        parallelism=3,
        env={"GPTPIPE_EXTRA": "extra"},
    )
    fields.update(overrides)
    return indexed_manifest.build_manifest(IndexedJobSpec(**fields))


def running(tmp_path: Path) -> FakeKube:
    env = {"PATH": os.environ["PATH"]}
    return FakeKube.running(tmp_path / "nodes", env, grace_seconds=2, pod_failure_backoff=0.05)


def create(kube: FakeKube, body: dict[str, Any]) -> None:
    client.BatchV1Api(kube.api_client()).create_namespaced_job("ml", body)


def condition(kube: FakeKube, kind: str) -> dict[str, Any] | None:
    job = kube.cluster.jobs.get(KEY) or {}
    for cond in (job.get("status") or {}).get("conditions", []):
        if cond["type"] == kind and cond["status"] == "True":
            return dict(cond)
    return None


def starts(records: Path, index: int) -> list[dict[str, Any]]:
    path = records / f"starts-{index}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def pods_of(kube: FakeKube) -> list[dict[str, Any]]:
    return [p for p in kube.cluster.pods.values() if p["metadata"]["name"].startswith("parts-")]


@pytest.mark.slow
def test_every_index_runs_once_with_its_index_at_most_parallelism_at_a_time(tmp_path, records):
    with running(tmp_path) as kube:
        create(kube, manifest(records, "ok", completions=5, parallelism=2))
        assert kube.wait_for(lambda c: condition(kube, "Complete"), timeout=30)
        job = kube.cluster.jobs[KEY]
        pods = pods_of(kube)
    status = job["status"]
    types = [(c["type"], c["reason"]) for c in status["conditions"]]
    assert types == [
        ("SuccessCriteriaMet", "CompletionsReached"),
        ("Complete", "CompletionsReached"),
    ]
    assert (status["succeeded"], status["failed"], status["active"]) == (5, 0, 0)
    assert (status["completedIndexes"], status["failedIndexes"]) == ("0-4", "")
    assert "completionTime" in status
    uid = job["metadata"]["uid"]
    assert job["spec"]["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    assert sorted(int(p["metadata"]["annotations"][INDEX]) for p in pods) == [0, 1, 2, 3, 4]
    for pod in pods:
        index = pod["metadata"]["annotations"][INDEX]
        assert pod["metadata"]["name"].startswith(f"parts-{index}-")
        assert len(pod["metadata"]["name"]) == len(f"parts-{index}-") + 5
        labels = pod["metadata"]["labels"]
        assert labels[INDEX] == index and labels["batch.kubernetes.io/job-name"] == "parts"
        assert labels["batch.kubernetes.io/controller-uid"] == uid
        assert pod["metadata"]["annotations"]["batch.kubernetes.io/job-index-failure-count"] == "0"
        (owner,) = pod["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"], owner["controller"]) == ("Job", uid, True)
        assert pod["spec"]["hostname"] == f"parts-{index}"
        (container,) = pod["spec"]["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["JOB_COMPLETION_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == (
            f"metadata.annotations['{INDEX}']"
        )
    for index in range(5):
        (run,) = starts(records, index)  # once each, its index from the downward API
        assert (run["hostname"], run["extra"]) == (f"parts-{index}", "extra")
        assert run["running"] <= 2
    assert max(starts(records, i)[0]["running"] for i in range(5)) >= 1


@pytest.mark.slow
def test_a_killed_part_is_run_again_with_its_failure_counted(tmp_path, records):
    with running(tmp_path) as kube:
        create(kube, manifest(records, "flaky-1"))
        assert kube.wait_for(lambda c: condition(kube, "Complete"), timeout=30)
        job = kube.cluster.jobs[KEY]
        ones = [p for p in pods_of(kube) if p["metadata"]["annotations"][INDEX] == "1"]
    assert len(starts(records, 1)) == 2 and len(starts(records, 0)) == 1
    assert (job["status"]["failed"], job["status"]["completedIndexes"]) == (1, "0-2")
    exits = sorted(
        (p["metadata"]["annotations"]["batch.kubernetes.io/job-index-failure-count"],
         p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"])
        for p in ones
    )  # fmt: skip
    assert exits == [("0", 137), ("1", 0)]


@pytest.mark.slow
def test_bad_input_fails_the_job_at_once_by_its_pod_failure_policy(tmp_path, records):
    with running(tmp_path) as kube:
        create(kube, manifest(records, "bad-1", env={"FAKE_PARTS": "3"}))
        assert kube.wait_for(lambda c: condition(kube, "Failed"), timeout=30)
        job = kube.cluster.jobs[KEY]
        pods = pods_of(kube)
    target, failed = (condition(kube, kind) for kind in ("FailureTarget", "Failed"))
    assert target and failed
    assert (failed["reason"], failed["message"]) == (target["reason"], target["message"])
    assert failed["reason"] == "PodFailurePolicy"
    assert failed["message"].startswith("Container part for pod ml/parts-1-")
    assert failed["message"].endswith("failed with exit code 2 matching FailJob rule at index 0")
    assert "completionTime" not in job["status"]
    assert len(starts(records, 1)) == 1  # never run again
    (bad,) = [p for p in pods if p["metadata"]["annotations"][INDEX] == "1"]
    said = bad["status"]["containerStatuses"][0]["state"]["terminated"]["message"]
    assert termination.parse(said) == termination.TerminationMessage("input_error", BAD_INPUT)
    others = [s["pid"] for i in (0, 2) for s in starts(records, i)]
    assert len(others) == 2 and not any(alive(pid) for pid in others)  # deleted, stopped


@pytest.mark.slow
def test_an_index_past_its_backoff_limit_fails_and_the_job_after_every_index(tmp_path, records):
    with running(tmp_path) as kube:
        create(kube, manifest(records, "fail-2", backoff_limit_per_index=1))
        assert kube.wait_for(lambda c: condition(kube, "Failed"), timeout=30)
        status = kube.cluster.jobs[KEY]["status"]
    assert condition(kube, "Failed")["reason"] == "FailedIndexes"
    assert condition(kube, "Failed")["message"] == "Job has failed indexes"
    assert (status["failedIndexes"], status["completedIndexes"], status["failed"]) == (
        "2",
        "0-1",
        2,
    )
    assert len(starts(records, 2)) == 2  # its run and one retry


@pytest.mark.slow
def test_a_disrupted_pod_is_replaced_without_counting_and_the_deadline_fails_it(tmp_path, records):
    with running(tmp_path) as kube:
        create(kube, manifest(records, "hang", completions=1, active_deadline_seconds=2))
        assert kube.wait_for(lambda c: starts(records, 0), timeout=30)
        with kube.cluster.cond:  # preemption: the scheduler's DisruptionTarget, then delete
            (pod,) = pods_of(kube)
            conditions = pod["status"].setdefault("conditions", [])
            conditions.append({"type": "DisruptionTarget", "status": "True"})
            kube.cluster.delete_pod(pod)
        assert kube.wait_for(lambda c: len(starts(records, 0)) == 2, timeout=30)
        with kube.cluster.cond:
            (second,) = [p for p in pods_of(kube) if p is not pod]
            assert kube.cluster.jobs[KEY]["status"]["failed"] == 0
        annotations = second["metadata"]["annotations"]
        assert annotations["batch.kubernetes.io/job-index-failure-count"] == "0"
        assert annotations["batch.kubernetes.io/job-index-ignored-failure-count"] == "1"
        assert kube.wait_for(lambda c: condition(kube, "Failed"), timeout=30)
    assert condition(kube, "Failed")["reason"] == "DeadlineExceeded"
    assert not any(alive(s["pid"]) for s in starts(records, 0))


@pytest.mark.slow
def test_a_finished_job_goes_after_its_ttl_with_its_pods(tmp_path, records):
    with running(tmp_path) as kube:
        create(kube, manifest(records, "ok", completions=1, ttl_seconds_after_finished=0))
        assert kube.wait_for(lambda c: KEY not in c.jobs and not pods_of(kube), timeout=30)
    assert len(starts(records, 0)) == 1


def test_a_job_kubernetes_would_refuse_is_a_422_and_a_delete_without_policy_orphans(records):
    with FakeKube() as kube:
        batch = client.BatchV1Api(kube.api_client())
        body = manifest(records, "ok")
        body["spec"]["template"]["spec"]["restartPolicy"] = "Always"
        with pytest.raises(ApiException) as err:
            batch.create_namespaced_job("ml", body)
        assert err.value.status == 422 and "restartPolicy" in json.loads(err.value.body)["message"]
        batch.create_namespaced_job("ml", manifest(records, "ok"))
        with pytest.raises(ApiException) as again:
            batch.create_namespaced_job("ml", manifest(records, "ok"))
        assert again.value.status == 409
        job = kube.cluster.jobs[KEY]
        assert job["spec"]["backoffLimit"] == 2**31 - 1  # defaulted beside backoffLimitPerIndex
        with kube.cluster.cond:
            pod = {
                "metadata": {
                    "name": "parts-0-abcde",
                    "namespace": "ml",
                    "ownerReferences": [{"uid": job["metadata"]["uid"], "controller": True}],
                },
                "spec": {"containers": []},
            }
            kube.cluster.create_pod(pod)
        batch.delete_namespaced_job("parts", "ml")
        assert KEY not in kube.cluster.jobs
        assert kube.cluster.pods[("ml", "parts-0-abcde")]["metadata"]["ownerReferences"] == []
        (delete,) = kube.calls("DELETE", "/jobs/parts")
        assert "propagationPolicy" not in delete.query


def test_index_intervals_read_and_written_as_kubernetes_does():
    assert intervals({5, 0, 1, 2, 7, 8}) == "0-2,5,7-8"
    assert intervals(set()) == ""
    assert parse_intervals("0-2,5,7-8") == {0, 1, 2, 5, 7, 8}
