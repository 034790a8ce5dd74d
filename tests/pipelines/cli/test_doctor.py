"""`gptpipe doctor` against the doubles: the Kubernetes API (FakeKube, with the cluster around
the jobs: tests/doubles/kubernetes/cluster_api.py), the KFP API (KfpApiDouble) and GCS (the
emulator, behind the fault proxy for a bucket that refuses writes)."""

import json
from pathlib import Path

import pytest
import yaml

from components.jobs.access import STEP_ACCESS
from pipelines.cli.main import main
from tests.doubles.kfp.api_server import KfpApiDouble
from tests.doubles.kubernetes import cluster_api
from tests.doubles.kubernetes.apiserver import FakeKube

LOCK = Path(__file__).resolve().parents[2] / "data" / "digests.json"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
WI = "iam.gke.io/gcp-service-account"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """A healthy cluster: FakeKube with two 4-GPU nodes and the metadata server deployed, the
    KFP API double, a kubeconfig and a token file pointing at them."""
    with FakeKube() as kube, KfpApiDouble() as kfp:
        kube.access.nodes = [
            cluster_api.node(f"gpu-{i}", 4, {"pool": "a100"}, [GPU_TAINT]) for i in range(2)
        ]
        kube.access.nodes.append(cluster_api.node("cpu-0", 0))
        image = "gcr.io/tfx-oss-public/ml_metadata_store_server:1.14.0"
        kube.access.deployments[("kubeflow", "metadata-grpc-deployment")] = {
            "kind": "Deployment",
            "spec": {"template": {"spec": {"containers": [{"image": image}]}}},
        }
        account = {"metadata": {"annotations": {WI: "runs@p.iam.gserviceaccount.com"}}}
        kube.access.service_accounts[("kubeflow", "pipeline-runner")] = account
        config = tmp_path / "kubeconfig"
        config.write_text(yaml.safe_dump(_kubeconfig(kube.host)))
        monkeypatch.setenv("KUBECONFIG", str(config))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        token = tmp_path / "token"
        token.write_text(kfp.token)
        yield kube, kfp, token


def _kubeconfig(server: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "kube-token"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }


def _doctor(capsys, kfp, token, bucket, *extra):
    args = ["doctor", "--host", kfp.host, "--token-file", str(token), "--lock", str(LOCK)]
    args += ["--pipeline-root", f"gs://{bucket.bucket.name}/root", *extra]
    status = main(args)
    out, err = capsys.readouterr()
    return status, out.splitlines(), err


def _line(lines, check):
    return next(line for line in lines if line[2:].startswith(check))


def _placement(*tolerations):
    return [
        "--param",
        'train_job.node_selector={"pool": "a100"}',
        "--param",
        f"train_job.tolerations={list(tolerations)!r}".replace("'", '"'),
    ]


def test_a_healthy_cluster_passes_every_check(cluster, gcs, capsys):
    kube, kfp, token = cluster
    status, lines, err = _doctor(capsys, kfp, token, gcs, *_placement(GPU_TOLERATION))
    assert status == 0, (lines, err)
    for check in ("KFP API", "TFJob CRD", "access in kubeflow", "pipeline root", "image lock"):
        assert _line(lines, check).startswith("✔"), check
    assert _line(lines, "GPU nodes").startswith("✔ GPU nodes: 2 worker(s) x 1 nvidia.com/gpu")
    assert _line(lines, "metadata version") == "✔ metadata version: ml-metadata 1.14.0"
    assert _line(lines, "metadata service").startswith("– metadata service: not checked")
    assert _line(lines, "workload identity") == (
        "✔ workload identity: kubeflow/pipeline-runner acts as runs@p.iam.gserviceaccount.com"
    )
    assert lines[-1] == "no blocker found"
    # One review per verb the steps use, in the run's namespace, with subresources apart.
    reviewed = {
        (r["verb"], r["group"], r["resource"], r.get("subresource")) for r in kube.access.reviews
    }
    assert len(kube.access.reviews) == sum(len(rule.verbs) for rule in STEP_ACCESS)
    assert ("get", "", "pods", "log") in reviewed
    assert {r["namespace"] for r in kube.access.reviews} == {"kubeflow"}
    assert not list(gcs.bucket.list_blobs())  # the probe object is gone


def test_a_namespace_where_a_verb_is_denied_is_a_blocker(cluster, gcs, capsys):
    kube, kfp, token = cluster
    kube.access.deny("team-a", "create", "kubeflow.org", "tfjobs")
    kube.access.deny("team-a", "get", "", "pods/log")
    status, lines, _ = _doctor(
        capsys, kfp, token, gcs, "--namespace", "team-a", *_placement(GPU_TOLERATION)
    )
    assert status == 1
    line = _line(lines, "access in team-a")
    assert line.startswith("✘ access in team-a: denied: create tfjobs.kubeflow.org, get pods/log")
    assert "kubectl -n team-a apply -f deploy/rbac.yaml" in line
    # A profile's steps run as default-editor, which this cluster lacks.
    assert _line(lines, "workload identity").startswith(
        "✘ workload identity: no service account team-a/default-editor"
    )
    assert lines[-1] == "2 blocker(s): fix them before a run"


def test_a_bucket_that_refuses_writes_is_a_blocker(cluster, gcs_faults, capsys):
    _, kfp, token = cluster
    bucket, proxy = gcs_faults
    proxy.fail("POST", r"/upload/storage/v1/b/", 403)
    status, lines, _ = _doctor(capsys, kfp, token, bucket, *_placement(GPU_TOLERATION))
    assert status == 1
    line = _line(lines, "pipeline root")
    assert line.startswith(
        f"✘ pipeline root: cannot write gs://{bucket.bucket.name}/root/.gptpipe-doctor/"
    )
    assert "permission denied (403)" in line and "roles/storage.objectAdmin" in line


def test_no_gpu_nodes_or_untolerated_ones_are_a_blocker(cluster, gcs, capsys):
    kube, kfp, token = cluster
    # nvidia.com/gpu's own taint is tolerated for a pod asking for GPUs (the
    # ExtendedResourceToleration admission plugin); a pool's other taint is not.
    _, lines, _ = _doctor(capsys, kfp, token, gcs, *_placement())
    assert _line(lines, "GPU nodes").startswith("✔ GPU nodes: 2 worker(s) x 1 nvidia.com/gpu fit")
    dedicated = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
    for node in kube.access.nodes:
        node["spec"]["taints"] = [GPU_TAINT, dedicated] if "gpu" in node["metadata"]["name"] else []
    status, lines, _ = _doctor(capsys, kfp, token, gcs, *_placement())
    assert status == 1
    assert _line(lines, "GPU nodes").startswith(
        "✘ GPU nodes: 2 worker(s) x 1 nvidia.com/gpu do not fit: 0 node(s) matching pool=a100"
    )
    toleration = {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    status, lines, _ = _doctor(capsys, kfp, token, gcs, *_placement(toleration))
    assert status == 0, lines
    kube.access.nodes = [cluster_api.node("cpu-0", 0)]
    status, lines, _ = _doctor(capsys, kfp, token, gcs)
    assert status == 1 and "0 allocatable GPU(s)" in _line(lines, "GPU nodes")


def test_a_check_that_fails_to_run_is_its_line_and_the_others_still_print(
    cluster, gcs, capsys, monkeypatch
):
    from components.doctor import checks

    _, kfp, token = cluster

    def broken(*args):
        raise RuntimeError("discovery broke\nsecond line")

    monkeypatch.setattr(checks, "tfjob_crd", broken)
    status, lines, _ = _doctor(capsys, kfp, token, gcs, *_placement(GPU_TOLERATION))
    assert status == 1
    assert _line(lines, "TFJob CRD").startswith(
        "✘ TFJob CRD: could not be checked: RuntimeError: discovery broke —"
    )
    assert _line(lines, "access in kubeflow").startswith("✔")


def test_the_workers_own_account_is_checked_beside_the_steps(cluster, gcs, capsys):
    _, kfp, token = cluster
    extra = ["--param", "train_job.service_account=trainer"]
    _, lines, _ = _doctor(capsys, kfp, token, gcs, *extra)
    found = [line for line in lines if line[2:].startswith("workload identity")]
    assert found[0].startswith("✔ workload identity: kubeflow/pipeline-runner acts as")
    assert found[1].startswith("✘ workload identity: no service account kubeflow/trainer")


def test_more_workers_than_gpus_do_not_fit_and_a_local_run_needs_none(cluster, gcs, capsys):
    _, kfp, token = cluster
    many = ["--param", "train_job.workers=3", "--param", "train_job.gpus_per_worker=3"]
    _, lines, _ = _doctor(capsys, kfp, token, gcs, *_placement(GPU_TOLERATION), *many)
    assert "room for 2 worker(s)" in _line(lines, "GPU nodes")  # 4 GPUs a node: one 3 each
    _, lines, _ = _doctor(capsys, kfp, token, gcs, "--param", "train_job.gpus_per_worker=0")
    assert _line(lines, "GPU nodes").startswith("✔ GPU nodes: the run's workers ask for no GPU")


def test_what_cannot_be_read_is_said_not_blocked(cluster, gcs, capsys):
    kube, kfp, token = cluster
    kube.access.deny("", "list", "", "nodes")
    kube.access.deny("kubeflow", "get", "apps", "deployments")
    status, lines, _ = _doctor(capsys, kfp, token, gcs)
    assert status == 0
    assert _line(lines, "GPU nodes").startswith("– GPU nodes: listing nodes is forbidden")
    assert _line(lines, "metadata version").startswith("– metadata version: deployment")
    kube.access.service_accounts[("kubeflow", "pipeline-runner")] = {"metadata": {}}
    status, lines, _ = _doctor(capsys, kfp, token, gcs)
    assert status == 0 and _line(lines, "workload identity").startswith(
        "– workload identity: kubeflow/pipeline-runner names no Google account"
    )


def test_no_crd_a_refused_token_and_a_placeholder_lock_are_blockers(cluster, gcs, capsys, tmp_path):
    kube, kfp, token = cluster
    kube.access.crd_versions = {}
    token.write_text("wrong")
    lock = tmp_path / "digests.json"
    lock.write_text(LOCK.read_text().replace("1" * 64, "0" * 64))
    status, lines, _ = _doctor(capsys, kfp, token, gcs, "--lock", str(lock))
    assert status == 1
    assert _line(lines, "TFJob CRD").startswith("✘ TFJob CRD: the API server serves no kubeflow")
    assert _line(lines, "KFP API").startswith("✘ KFP API: KFP at")
    assert "HTTP 401" in _line(lines, "KFP API")
    assert _line(lines, "image lock").startswith("✘ image lock: pipeline still pinned")


def test_the_metadata_service_is_asked_when_given(cluster, gcs, capsys, tmp_path):
    _, kfp, token = cluster
    from tests.doubles.mlmd.server import MetadataGrpcServer

    with MetadataGrpcServer(tmp_path / "mlmd.db") as served:
        address = served.address
        _, lines, _ = _doctor(capsys, kfp, token, gcs, "--metadata", address)
    assert _line(lines, "metadata service") == f"✔ metadata service: {address} answers"


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (["--pipeline-root", "s3://b/p"], {}, "--pipeline-root 's3://b/p' is not gs://"),
        (["--pipeline-root", "gs://b/p"], {}, "no KFP host: pass --host URL"),
        (
            ["--pipeline-root", "gs://b/p", "--host", "http://h", "--token-file", "/nope"],
            {},
            "/nope",
        ),
    ],
)
def test_bad_input_is_one_line(args, env, said, capsys, monkeypatch):
    monkeypatch.delenv("KF_PIPELINES_ENDPOINT", raising=False)
    assert main(["doctor", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and said in err


def test_no_kube_context_and_a_missing_namespace_are_one_line(
    cluster, gcs, capsys, tmp_path, monkeypatch
):
    kube, kfp, token = cluster
    kube.access.namespaces = {"kubeflow"}
    status, _, err = _doctor(capsys, kfp, token, gcs, "--namespace", "nope")
    assert status == 2 and "namespace 'nope' does not exist" in err
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    status, _, err = _doctor(capsys, kfp, token, gcs)
    assert status == 2 and err.startswith("gptpipe: error: no Kubernetes credentials")
    assert err.strip().endswith("or pass --context")


@pytest.mark.parametrize("outcome", ["SUCCEEDED", "FAILED"])
def test_in_cluster_runs_the_checks_as_a_one_step_run(outcome, gcs, capsys, tmp_path):
    from tests.doubles.kfp.api_server import RunScript

    with KfpApiDouble() as kfp:
        token = tmp_path / "token"
        token.write_text(kfp.token)
        kfp.run_scripts.append(RunScript(outcome, running_polls=1, failed_task="doctor"))
        extra = ["--in-cluster", "--poll", "0", "--param", "train_job.workers=4"]
        status, lines, _ = _doctor(capsys, kfp, token, gcs, *extra)
        (run,) = kfp.runs.values()
    line = _line(lines, "in-cluster checks")
    if outcome == "SUCCEEDED":
        assert status == 0 and line.startswith(f"✔ in-cluster checks: run {run.run_id} found no")
    else:
        assert status == 1 and line == (
            f"✘ in-cluster checks: run {run.run_id} FAILED — its doctor step's log (KFP UI) "
            "says which check failed, one line each"
        )
    params = run.runtime_config.parameters
    assert params["pipeline_root"] == f"gs://{gcs.bucket.name}/root"
    assert params["train_job"]["workers"] == 4
    spec = run.pipeline_spec["pipeline_spec"]  # with its platform_spec beside it
    (executor,) = spec["deploymentSpec"]["executors"].values()
    assert executor["container"]["image"] == json.loads(LOCK.read_text())["pipeline"]
    assert list(spec["root"]["dag"]["tasks"]) == ["doctor"]


def test_in_cluster_gives_up_on_a_run_that_does_not_end(gcs, capsys, tmp_path):
    from tests.doubles.kfp.api_server import RunScript

    with KfpApiDouble() as kfp:
        token = tmp_path / "token"
        token.write_text(kfp.token)
        kfp.run_scripts.append(RunScript("SUCCEEDED", running_polls=1_000_000))
        extra = ["--in-cluster", "--poll", "0.01", "--timeout", "0"]
        status, lines, err = _doctor(capsys, kfp, token, gcs, *extra)
    assert status == 1
    line = _line(lines, "in-cluster checks")
    assert line.startswith("✘ in-cluster checks: run ") and "did not end within 0 s" in line
    assert "RUNNING" in err  # the states it saw, as it waited
