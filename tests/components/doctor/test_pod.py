"""components.doctor.pod: the checks made inside a run's pod, as its identity."""

import pytest

from components.doctor import pod
from components.jobs import kube as kube_module
from components.lineage.store import KFP_HOST_ENV, KFP_PORT_ENV
from tests.doubles.kubernetes import cluster_api
from tests.doubles.kubernetes.apiserver import FakeKube
from tests.doubles.mlmd.server import MetadataGrpcServer


@pytest.fixture
def pod_env(tmp_path, gcs, monkeypatch):
    """A pod's view: FakeKube as its API server, a metadata service, its namespace."""
    with FakeKube() as kube, MetadataGrpcServer(tmp_path / "mlmd.db") as mlmd:
        kube.access.nodes = [cluster_api.node("gpu-0", 8)]
        monkeypatch.setattr(kube_module, "default_api_client", kube.api_client)
        host, port = mlmd.address.rsplit(":", 1)
        env = {kube_module.POD_NAMESPACE_ENV: "team-a", KFP_HOST_ENV: host, KFP_PORT_ENV: port}
        yield kube, env, f"gs://{gcs.bucket.name}/root"


def test_the_pod_checks_as_its_own_identity_in_its_namespace(pod_env, capsys):
    kube, env, root = pod_env
    assert pod.run(root, {"workers": 2, "gpus_per_worker": 4}, env) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "no blocker found"
    assert {r["namespace"] for r in kube.access.reviews} == {"team-a"}
    assert any(line.startswith("✔ metadata service:") for line in out)
    assert any(line.startswith("✔ GPU nodes: 2 worker(s) x 4") for line in out)


def test_a_blocker_fails_the_step(pod_env, capsys):
    kube, env, root = pod_env
    kube.access.deny("team-a", "watch", "batch", "jobs")
    with pytest.raises(SystemExit, match="1 blocker"):
        pod.main(root, {}, env)
    assert "✘ access in team-a: denied: watch jobs.batch" in capsys.readouterr().out


def test_a_pod_without_a_namespace_is_one_line(pod_env):
    _, env, root = pod_env
    with pytest.raises(Exception, match="no namespace"):
        pod.run(root, {}, {k: v for k, v in env.items() if "NAMESPACE" not in k})
