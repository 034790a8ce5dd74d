"""The operator double plays the Training Operator v1.9 and the kubelet: checked with fake worker
processes (fake_worker.py) that start in milliseconds, through the Kubernetes client."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from components.jobs.spec import JobSpec
from components.jobs.tfjob import manifest as tfjob_manifest
from contracts import termination
from tests.doubles.kubernetes.apiserver import FakeKube
from tests.doubles.kubernetes.fake_worker import BAD_SHARD
from tests.processes import alive

FAKE_WORKER = Path(__file__).parent / "fake_worker.py"
IMAGE = "us-docker.pkg.dev/proj/gptpipe/trainer@sha256:" + "cd" * 32
KEY = ("ml", "fake")


@pytest.fixture
def records(tmp_path: Path) -> Path:
    folder = tmp_path / "rec"
    folder.mkdir()
    return folder


def spec(records: Path, mode: str, **overrides: Any) -> JobSpec:
    fields: dict[str, Any] = dict(
        name="fake",
        namespace="ml",
        image=IMAGE,
        command=[sys.executable, str(FAKE_WORKER), mode, str(records)],
        workers=2,
        env={"GPTPIPE_EXTRA": "extra"},
        service_account="trainer",
        image_pull_secrets=["registry-pull"],
    )
    fields.update(overrides)
    return JobSpec(**fields)


def running(tmp_path: Path, **kwargs: Any) -> FakeKube:
    env = {"PATH": os.environ["PATH"]}
    return FakeKube.running(tmp_path / "nodes", env, grace_seconds=2, **kwargs)


def hold_chief_until_worker_1_is_left_succeeded(kube: FakeKube, records: Path) -> None:
    """Flaky mode's worker 0 waits while RECORDS/hold exists: it goes once the operator has
    reconciled twice with worker 1's last pod Succeeded, the passes in which an operator that
    recreated Succeeded pods would do so."""
    (records / "hold").touch()
    assert kube.operator is not None
    operator, passes = kube.operator, [0]
    reconcile = operator.reconcile

    def counted(key: tuple[str, str]) -> None:
        passes[0] += 1
        reconcile(key)

    operator.reconcile = counted  # type: ignore[method-assign]

    def succeeded(cluster: Any) -> bool:
        pod = cluster.pods.get(("ml", "fake-worker-1"))
        return pod is not None and pod["status"].get("phase") == "Succeeded"

    def release() -> None:
        if kube.wait_for(succeeded, timeout=120):
            since = passes[0]
            kube.wait_for(lambda c: passes[0] >= since + 2, timeout=120)
        (records / "hold").unlink()

    threading.Thread(target=release, daemon=True).start()


def create(kube: FakeKube, job_spec: JobSpec) -> None:
    manifest = tfjob_manifest.build_manifest(job_spec)
    client.CustomObjectsApi(kube.api_client()).create_namespaced_custom_object(
        "kubeflow.org", "v1", "ml", "tfjobs", manifest
    )


def create_with_backoff_limit(kube: FakeKube, job_spec: JobSpec, limit: int) -> None:
    """Create the job with runPolicy.backoffLimit, which build_manifest leaves out under
    ExitCode (manifest.py `operator_backoff_limit`)."""
    manifest = tfjob_manifest.build_manifest(job_spec)
    manifest["spec"]["runPolicy"]["backoffLimit"] = limit
    client.CustomObjectsApi(kube.api_client()).create_namespaced_custom_object(
        "kubeflow.org", "v1", "ml", "tfjobs", manifest
    )


def condition(kube: FakeKube, kind: str) -> dict[str, Any] | None:
    job = kube.cluster.tfjobs.get(KEY) or {}
    for cond in (job.get("status") or {}).get("conditions", []):
        if cond["type"] == kind and cond["status"] == "True":
            return dict(cond)
    return None


def starts(records: Path, index: int) -> list[dict[str, Any]]:
    path = records / f"starts-{index}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_workers_run_as_the_operator_creates_their_pods(tmp_path, records):
    with running(tmp_path) as kube:
        create(kube, spec(records, "ok"))
        assert kube.wait_for(lambda c: condition(kube, "Succeeded"), timeout=30)
        job = kube.cluster.tfjobs[KEY]
        pods = {p["metadata"]["name"]: p for p in kube.cluster.owned_pods(job)}
        logs = {n: kube.cluster.logs[p["metadata"]["uid"]] for n, p in pods.items()}
    types = [c["type"] for c in job["status"]["conditions"]]
    assert types == ["Created", "Running", "Succeeded"]
    assert job["status"]["conditions"][1]["status"] == "False"  # Succeeded ended Running
    assert job["status"]["conditions"][2]["reason"] == "TFJobSucceeded"
    assert set(pods) == {"fake-worker-0", "fake-worker-1"}
    for index in (0, 1):
        pod = pods[f"fake-worker-{index}"]
        labels = pod["metadata"]["labels"]
        assert labels["training.kubeflow.org/replica-index"] == str(index)
        assert labels["training.kubeflow.org/job-name"] == "fake"
        assert ("training.kubeflow.org/job-role" in labels) == (index == 0)
        (owner,) = pod["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"], owner["controller"]) == (
            "TFJob",
            job["metadata"]["uid"],
            True,
        )
        pod_spec = pod["spec"]
        assert pod_spec["restartPolicy"] == "Never"  # ExitCode, as the operator sets it
        assert pod_spec["serviceAccountName"] == "trainer"
        assert pod_spec["imagePullSecrets"] == [{"name": "registry-pull"}]
        assert pod_spec["volumes"][0]["emptyDir"]["medium"] == "Memory"
        (container,) = pod_spec["containers"]
        assert container["resources"]["limits"] == {"cpu": "4", "memory": "16Gi"}
        env = {e["name"]: e["value"] for e in container["env"]}
        assert json.loads(env["TF_CONFIG"]) == {  # the operator's TF_CONFIG, Service names
            "cluster": {"worker": ["fake-worker-0.ml.svc:2222", "fake-worker-1.ml.svc:2222"]},
            "task": {"type": "worker", "index": index},
            "environment": "cloud",
        }
        status = pod["status"]
        assert status["phase"] == "Succeeded"
        (cs,) = status["containerStatuses"]
        assert cs["imageID"] == IMAGE and cs["state"]["terminated"]["exitCode"] == 0
        assert logs[f"fake-worker-{index}"] == [f"worker {index} started"]
    # The processes: each in its own empty folder, with the env and TF_CONFIG on local ports.
    started = [starts(records, i)[0] for i in (0, 1)]
    assert started[0]["cwd"] != started[1]["cwd"]
    assert [s["files"] for s in started] == [[], []]
    assert [s["hostname"] for s in started] == ["fake-worker-0", "fake-worker-1"]
    assert [s["extra"] for s in started] == ["extra", "extra"]
    addresses = json.loads(started[0]["tf_config"])["cluster"]["worker"]
    assert all(a.startswith("127.0.0.1:") for a in addresses) and len(set(addresses)) == 2


@pytest.mark.parametrize(
    ("mode", "policy", "message"),
    [
        ("wrote-record", None, "record"),
        ("wrote-overlong", None, "the file's last 4096 bytes"),
        ("wrote-text", None, "out of cheese\n"),
        ("wrote-nothing", None, None),
        ("wrote-nothing", "FallbackToLogsOnError", "the log's end"),
        ("wrote-text", "FallbackToLogsOnError", "out of cheese\n"),
    ],
)
def test_the_kubelet_keeps_the_termination_message_file(tmp_path, records, mode, policy, message):
    """The file at terminationMessagePath (the manifest's, in GPTPIPE_TERMINATION_MESSAGE)
    becomes the terminated state's message, its last 4096 bytes; the log only under
    FallbackToLogsOnError, and only when the file is empty."""
    manifest = tfjob_manifest.build_manifest(spec(records, mode))
    if policy:
        template = manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]
        template["spec"]["containers"][0]["terminationMessagePolicy"] = policy
    with running(tmp_path) as kube:
        client.CustomObjectsApi(kube.api_client()).create_namespaced_custom_object(
            "kubeflow.org", "v1", "ml", "tfjobs", manifest
        )
        assert kube.wait_for(lambda c: condition(kube, "Failed"), timeout=30)
        pod = kube.cluster.pods[("ml", "fake-worker-1")]
        terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 2
    record = termination.encode(
        termination.TerminationMessage(termination.INPUT_ERROR, BAD_SHARD)
    ).decode()
    expected = {
        "record": record,
        "the file's last 4096 bytes": ("x" * 5000 + record)[-4096:],
        "the log's end": f"worker 1 started\nerror: {BAD_SHARD}\n",
    }.get(message, message)
    assert terminated.get("message") == expected
    assert starts(records, 1)[0]["files"] == []  # the file is not in the working folder


def test_one_worker_gets_no_tf_config(tmp_path, records):
    with running(tmp_path) as kube:
        create(kube, spec(records, "ok", workers=1))
        assert kube.wait_for(lambda c: condition(kube, "Succeeded"), timeout=30)
    assert starts(records, 0)[0]["tf_config"] is None


@pytest.mark.slow
def test_exit_code_policy_recreates_failed_pods_only_and_never_succeeded_ones(tmp_path, records):
    with running(tmp_path) as kube:
        hold_chief_until_worker_1_is_left_succeeded(kube, records)
        create(kube, spec(records, "flaky"))
        assert kube.wait_for(lambda c: condition(kube, "Succeeded"), timeout=30)
        phases = [p["status"]["phase"] for p in kube.cluster.pods.values()]
    restarting = {
        (c["message"], c["lastTransitionTime"])
        for _, _, job in kube.cluster.events
        for c in job["status"].get("conditions", [])
        if c["type"] == "Restarting" and c["status"] == "True"
    }
    assert [m for m, _ in restarting] == [
        "job fake is restarting because Worker replica(s) failed."
    ] * 2
    assert phases == ["Succeeded", "Succeeded"]
    assert len(starts(records, 1)) == 3  # recreated twice after 137, then succeeded
    assert len(starts(records, 0)) == 1  # worker 0 never failed, so it was never recreated


def test_a_permanent_exit_code_fails_the_job_and_stops_the_others(tmp_path, records):
    with running(tmp_path) as kube:
        create(kube, spec(records, "exit-1"))
        assert kube.wait_for(lambda c: condition(kube, "Failed"), timeout=30)
        failed = condition(kube, "Failed")
        assert kube.wait_for(lambda c: len(c.pods) == 1, timeout=10)  # cleanPodPolicy Running
        (left,) = kube.cluster.pods.values()
    assert failed is not None and failed["reason"] == "TFJobFailed"
    assert failed["message"] == 'job "fake" is failing because "Worker" replica(s) failed.'
    assert left["metadata"]["name"] == "fake-worker-1"  # the failed pod keeps its log
    assert left["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 1
    assert len(starts(records, 1)) == 1
    assert not alive(starts(records, 0)[0]["pid"])


def test_backoff_limit_zero_fails_the_job_at_the_first_failure(tmp_path, records):
    with running(tmp_path) as kube:
        create_with_backoff_limit(kube, spec(records, "exit-137"), 0)
        assert kube.wait_for(lambda c: condition(kube, "Failed"), timeout=30)
        failed = condition(kube, "Failed")
    assert failed is not None
    assert (
        failed["message"]
        == "Job fake has failed because it has reached the specified backoff limit"
    )


@pytest.mark.slow
def test_a_backoff_limit_above_zero_never_fails_an_exit_code_job(tmp_path, records):
    """previousRetry is the TFJob reconciler's FakeWorkQueue's NumRequeues, always 0, and
    recreated pods have no restartCount: two failures against a limit of 1, and it succeeds."""
    with running(tmp_path) as kube:
        hold_chief_until_worker_1_is_left_succeeded(kube, records)
        create_with_backoff_limit(kube, spec(records, "flaky"), 1)
        assert kube.wait_for(lambda c: condition(kube, "Succeeded"), timeout=60)
    assert len(starts(records, 1)) == 3
    assert condition(kube, "Failed") is None


def answer(port: int) -> bytes | None:
    """What a connection to 127.0.0.1:`port` is answered, None if it is refused or reset."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            return conn.recv(64) or None
    except OSError:
        return None


def answered(port: int, expected: bytes, timeout: float = 30) -> bool:
    """Whether `port` answers `expected` within `timeout` (the worker may not listen yet)."""
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if answer(port) == expected:
            return True
        time.sleep(0.05)
    return False


def test_a_peers_service_reaches_its_pod_only_while_the_pod_is_ready(tmp_path, records):
    """The operator's headless Services have no publishNotReadyAddresses (common/service.go),
    so a peer's name resolves only to a pod that is Ready and not terminating (endpointslice
    podToEndpoint). A worker's own address is its pod's; its peers' are their Services'."""
    manifest = tfjob_manifest.build_manifest(spec(records, "serve"))
    template = manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    template["terminationGracePeriodSeconds"] = 600  # terminating, still serving, all along
    with running(tmp_path) as kube:
        assert kube.network is not None
        client.CustomObjectsApi(kube.api_client()).create_namespaced_custom_object(
            "kubeflow.org", "v1", "ml", "tfjobs", manifest
        )
        assert kube.wait_for(lambda c: all(starts(records, i) for i in (0, 1)), timeout=30)
        (zero,), (one,) = starts(records, 0), starts(records, 1)
        service = kube.network.port_of("fake-worker-1.ml")
        own = [json.loads(r["tf_config"])["cluster"]["worker"] for r in (zero, one)]
        assert own[0][1] == own[1][0].replace(own[1][0].split(":")[1], str(service))
        assert answered(service, b"worker 1\n")  # Ready: the name reaches worker 1
        pod_port = int(own[1][1].split(":")[1])  # worker 1's own address: its pod's
        client.CoreV1Api(kube.api_client()).delete_namespaced_pod("fake-worker-1", "ml")
        assert kube.wait_for(
            lambda c: c.pods[("ml", "fake-worker-1")]["metadata"].get("deletionTimestamp"), 10
        )
        assert answer(service) is None  # terminating: not ready, so not published
        assert answer(pod_port) == b"worker 1\n" and alive(one["pid"])  # though it serves


def test_a_container_over_its_memory_limit_is_oom_killed(tmp_path, records):
    """The kernel kills a container over its cgroup's memory limit; the runtime says so: exit
    code 137, reason OOMKilled (kubelet.py)."""
    job = spec(records, "eat-256", memory="64Mi", shm_size="", workers=1, restart_policy="Never")
    with running(tmp_path) as kube:
        create(kube, job)
        assert kube.wait_for(lambda c: condition(kube, "Failed"), timeout=60)
        (pod,) = kube.cluster.pods.values()  # cleanPodPolicy Running keeps a failed pod
        log = list(kube.cluster.logs[pod["metadata"]["uid"]])
    (status,) = pod["status"]["containerStatuses"]
    terminated = status["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (137, "OOMKilled")
    assert pod["status"]["phase"] == "Failed"
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "PodCompleted")
    assert log[0] == "worker 0 started"


@pytest.mark.slow
def test_the_active_deadline_fails_the_job_and_kills_its_pods(tmp_path, records):
    with running(tmp_path) as kube:
        create(kube, spec(records, "stubborn", active_deadline_seconds=1))
        assert kube.wait_for(lambda c: condition(kube, "Failed"), timeout=30)
        failed = condition(kube, "Failed")
        assert kube.wait_for(lambda c: not c.pods, timeout=10)  # SIGKILL after the grace
        deleted = events_on(kube, "reason=SuccessfulDeletePod")
    # Deleted once each: DeletePod leaves a pod already terminating alone (pod_control.go).
    assert sorted((e.message, e.count) for e in deleted) == [
        ("Deleted pod: fake-worker-0", 1),
        ("Deleted pod: fake-worker-1", 1),
    ]
    assert failed is not None and failed["reason"] == "TFJobFailed"
    assert "active longer than specified deadline" in failed["message"]
    assert not any(alive(s["pid"]) for i in (0, 1) for s in starts(records, i))


def test_foreground_delete_kills_the_workers_before_the_job_goes(tmp_path, records):
    with running(tmp_path) as kube:
        create(kube, spec(records, "hang"))
        assert kube.wait_for(lambda c: len(starts(records, 1)) == 1, timeout=30)
        api = client.CustomObjectsApi(kube.api_client())
        rv = kube.cluster.tfjobs[KEY]["metadata"]["resourceVersion"]
        api.delete_namespaced_custom_object(
            "kubeflow.org", "v1", "ml", "tfjobs", "fake", propagation_policy="Foreground"
        )
        kinds = []
        for event in watch.Watch().stream(
            api.list_namespaced_custom_object,
            "kubeflow.org",
            "v1",
            "ml",
            "tfjobs",
            field_selector="metadata.name=fake",
            resource_version=rv,
            timeout_seconds=10,
        ):
            kinds.append(
                (event["type"], bool(event["raw_object"]["metadata"].get("deletionTimestamp")))
            )
            if event["type"] == "DELETED":
                break
        assert not kube.cluster.pods
    assert ("MODIFIED", True) in kinds and kinds[-1][0] == "DELETED"
    assert not any(alive(s["pid"]) for i in (0, 1) for s in starts(records, i))


def events_on(kube: FakeKube, selector: str) -> list[Any]:
    """The Events the double lists by `selector`, through the Kubernetes client."""
    return (
        client.CoreV1Api(kube.api_client())
        .list_namespaced_event("ml", field_selector=selector)
        .items
    )


@pytest.mark.slow
def test_the_operator_records_exits_and_pod_changes_as_events_on_the_job(tmp_path, records):
    with running(tmp_path) as kube:
        hold_chief_until_worker_1_is_left_succeeded(kube, records)
        create(kube, spec(records, "flaky"))
        assert kube.wait_for(lambda c: condition(kube, "Succeeded"), timeout=30)
        uid = kube.cluster.tfjobs[KEY]["metadata"]["uid"]
        exited = events_on(kube, f"involvedObject.uid={uid},reason=ExitedWithCode")
        on_job = events_on(kube, "involvedObject.kind=TFJob,involvedObject.name=fake")
        other = events_on(kube, "involvedObject.name=other")
        with pytest.raises(client.ApiException) as bad:
            events_on(kube, "involvedObject.labels=x")
    # Worker 1 exited 137 twice, then both 0: one event per message, counted at every reconcile
    # that found the container ended (at least once per pod).
    counted = {e.message: e.count for e in exited}
    assert set(counted) == {
        "Pod: ml.fake-worker-1 exited with code 137",
        "Pod: ml.fake-worker-1 exited with code 0",
        "Pod: ml.fake-worker-0 exited with code 0",
    }
    assert counted["Pod: ml.fake-worker-1 exited with code 137"] >= 2
    by_reason = {(e.reason, e.message): e for e in on_job}
    created = by_reason[("SuccessfulCreatePod", "Created pod: fake-worker-1")]
    assert created.count == 3 and created.first_timestamp <= created.last_timestamp
    assert by_reason[("SuccessfulDeletePod", "Deleted pod: fake-worker-1")].count == 2  # once each
    assert ("SuccessfulCreateService", "Created service: fake-worker-1") in by_reason
    restarting = by_reason[
        ("TFJobRestarting", "job fake is restarting because Worker replica(s) failed.")
    ]
    assert (restarting.type, restarting.count) == ("Warning", 2)
    assert ("TFJobSucceeded", "TFJob ml/fake successfully completed.") in by_reason
    for event in on_job:  # client-go's makeEvent: named after the object, about it, by the operator
        assert event.metadata.name.startswith("fake.")
        assert (event.involved_object.kind, event.involved_object.uid) == ("TFJob", uid)
        assert event.involved_object.api_version == "kubeflow.org/v1"
        assert event.source.component == "tfjob-controller"
    assert other == []
    assert bad.value.status == 400 and "field label not supported: involvedObject.labels" in str(
        bad.value.body
    )


def test_the_event_recorder_counts_aggregates_and_throttles_as_client_go_does():
    from tests.doubles.kubernetes.events import COMBINED, SPAM_BURST, EventRecorder
    from tests.doubles.kubernetes.store import Cluster

    cluster = Cluster()
    job = {
        "apiVersion": "kubeflow.org/v1",
        "metadata": {"namespace": "ml", "name": "j", "uid": "u"},
    }
    recorder = EventRecorder(cluster, "tfjob-controller")
    with cluster.cond:
        recorder.event(
            job, "TFJob", "Normal", "ExitedWithCode", "Pod: ml.j-worker-0 exited with code 1"
        )
        recorder.event(
            job, "TFJob", "Normal", "ExitedWithCode", "Pod: ml.j-worker-0 exited with code 1"
        )
        (same,) = cluster.kube_events.values()
        assert same["count"] == 2  # the same event again: counted, not a second one
        for index in range(1, 12):  # 11 more distinct messages of one reason
            message = f"Pod: ml.j-worker-{index} exited with code 1"
            recorder.event(job, "TFJob", "Normal", "ExitedWithCode", message)
        messages = [e["message"] for e in cluster.kube_events.values()]
        # The 10th distinct message and after are combined into one event, counted.
        assert len(messages) == 10 and sum(m.startswith(COMBINED) for m in messages) == 1
        combined = next(
            e for e in cluster.kube_events.values() if e["message"].startswith(COMBINED)
        )
        assert (
            combined["message"].endswith("j-worker-11 exited with code 1")
            and combined["count"] == 3
        )
        # 1 + 1 + 11 events so far; the spam filter passes SPAM_BURST about one object, then none.
        for index in range(SPAM_BURST - 13):
            recorder.event(job, "TFJob", "Normal", "SuccessfulCreatePod", f"Created pod: p{index}")
        before = {k: dict(v) for k, v in cluster.kube_events.items()}
        recorder.event(job, "TFJob", "Normal", "SuccessfulCreatePod", "Created pod: dropped")
        recorder.event(
            job, "TFJob", "Normal", "ExitedWithCode", "Pod: ml.j-worker-0 exited with code 1"
        )
        assert cluster.kube_events == before  # dropped: neither a new event nor a count
        other = {**job, "metadata": {**job["metadata"], "name": "k", "uid": "v"}}
        recorder.event(other, "TFJob", "Normal", "SuccessfulCreatePod", "Created pod: k-worker-0")
        assert len(cluster.kube_events) == len(before) + 1  # another object has its own bucket
