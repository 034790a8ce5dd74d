"""`gptpipe gpu-bench`: the GPU benchmark as a one-worker TFJob in the trainer image.

The TFJob runs against the Kubernetes double with the Training Operator and a kubelet that runs
the pod's command as a local process (tests/doubles/kubernetes/: apiserver.py, kubelet.py), so
the benchmark really runs: on this machine's CPU, as its dry run, or finding no GPU.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import gpu_bench
from components.jobs.errors import LaunchError
from components.jobs.tfjob import logs
from components.jobs.tfjob import manifest as tfjob_manifest
from contracts.errors import UserError
from pipelines.cli import gpu_bench as gpu_bench_cmd
from pipelines.cli import main as cli
from tests.doubles.cluster import LOCK, TRAINER_ENV
from tests.doubles.kubernetes.apiserver import IMAGE_DIGEST, FakeKube
from tests.doubles.kubernetes.crd_schema import SCHEMA, schema_errors

REPO = Path(__file__).resolve().parents[3]
IMAGE = f"registry.example/gptpipe-trainer@{IMAGE_DIGEST}"
TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def test_manifest_asks_for_the_gpus_under_the_given_scheduling(capsys):
    argv = ["gpu-bench", "--manifest", "--gpus", "8", "--image", IMAGE, "--namespace", "team-a"]
    argv += ["--node-selector", "cloud.google.com/gke-accelerator=nvidia-h200-141gb"]
    argv += ["--toleration", json.dumps(TOLERATION), "--runs", "bf16_xla,mirrored"]
    argv += ["--service-account", "trainer", "--image-pull-secret", "regcred", "--memory", "64Gi"]
    assert cli.main(argv) == 0
    job = yaml.safe_load(capsys.readouterr().out)
    assert schema_errors(job, SCHEMA) == []
    assert job["metadata"]["namespace"] == "team-a"
    # One more try after a preemption is the launcher's to count, not the operator's.
    assert "backoffLimit" not in job["spec"]["runPolicy"]
    worker = job["spec"]["tfReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 1 and worker["restartPolicy"] == "ExitCode"
    pod = worker["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == IMAGE
    assert container["command"][:3] == ["python", "-m", "bench.gpu_bench"]
    assert container["command"][container["command"].index("--runs") + 1] == "bf16_xla,mirrored"
    assert {"name": "PYTHONPATH", "value": gpu_bench_cmd.BENCH_ROOT} in container["env"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert container["resources"]["limits"]["memory"] == "64Gi"
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h200-141gb"}
    assert pod["tolerations"] == [TOLERATION]
    assert pod["serviceAccountName"] == "trainer"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]


def test_manifest_defaults_to_the_digest_locks_trainer(capsys, monkeypatch):
    from pipelines import compiler

    monkeypatch.setattr(compiler, "DIGEST_LOCK", LOCK)
    assert cli.main(["gpu-bench", "--manifest"]) == 0
    job = yaml.safe_load(capsys.readouterr().out)
    (container,) = job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    assert container["image"] == json.loads(LOCK.read_text())["trainer"]


def test_two_benchmarks_started_together_are_two_jobs():
    names = {gpu_bench_cmd.job_spec(IMAGE, 1).name for _ in range(2)}
    assert len(names) == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpus", "0"], "needs at least 1 GPU"),
        (["--node-selector", "accelerator"], "--node-selector 'accelerator': use KEY=VALUE"),
        (["--toleration", "nvidia.com/gpu"], "is not a JSON object"),
        (["--cpu", "four"], "cpu='four' is not a Kubernetes quantity"),
        (["--image", "registry.example/gptpipe-trainer:latest"], "not pinned by digest"),
        (["--runs", "bf16,fp64"], "--runs fp64 is unknown: use some of bf16_xla, xl_recompute"),
        (["--runs", "mirrored_xla"], "--runs mirrored_xla needs --gpus 2 or more, not 1"),
        (["--runs", "mirrored", "--gpus", "1"], "--runs mirrored needs --gpus 2 or more, not 1"),
        (["--allow-cpu", "--gpus", "2"], "--allow-cpu is the dry run on a CPU node"),
        (["--output", "out.json"], "--output is for the benchmark's result"),
    ],
)
def test_bad_options_are_one_line_naming_them(argv, message, capsys):
    assert cli.main(["gpu-bench", "--manifest", "--image", IMAGE, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_output_into_a_missing_folder_is_refused_before_any_job(tmp_path, capsys):
    argv = ["gpu-bench", "--image", IMAGE, "--output", str(tmp_path / "no" / "out.json")]
    assert cli.main(argv) == 2  # no cluster is contacted: the check comes first
    assert "the folder" in capsys.readouterr().err


def test_the_configurations_named_here_are_the_benchs():
    assert tuple(gpu_bench.RUNS) == gpu_bench_cmd.RUNS
    assert set(gpu_bench.SHAPES) == set(gpu_bench_cmd.SHAPES)


def test_the_dry_run_asks_for_no_gpu_and_runs_the_tiny_model(capsys):
    assert cli.main(["gpu-bench", "--manifest", "--image", IMAGE, "--allow-cpu"]) == 0
    job = yaml.safe_load(capsys.readouterr().out)
    (container,) = job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    command = container["command"]
    assert command[command.index("--shape") + 1] == "tiny" and "--allow-cpu" in command


def test_a_failed_configuration_fails_the_command_after_printing_the_line(monkeypatch, capsys):
    result = {
        "bench": "gpu",
        "tokens_per_s": {"bf16_xla": 9e4},
        "runs": {"bf16_xla": {"tokens_per_s": 9e4}, "fp32": {"error": "exit 1: OOM"}},
    }
    monkeypatch.setattr(gpu_bench_cmd, "run", lambda spec: result)
    assert cli.main(["gpu-bench", "--image", IMAGE]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out) == result
    assert "gptpipe gpu-bench: fp32 failed: exit 1: OOM" in captured.err
    monkeypatch.setattr(gpu_bench_cmd, "run", lambda spec: {**result, "tokens_per_s": {}})
    assert cli.main(["gpu-bench", "--image", IMAGE]) == 2
    assert "no configuration was measured" in capsys.readouterr().err


def test_the_json_line_is_found_in_the_streamed_log():
    line = json.dumps({"bench": "gpu", "skipped": False, "mfu": 0.5})
    lines = ["[gpubench-x-worker-0] loading", f"[gpubench-x-worker-0] {line}", "[p] {not json"]
    assert gpu_bench_cmd.result_of(lines)["mfu"] == 0.5
    assert gpu_bench_cmd.result_of([line])["mfu"] == 0.5
    with pytest.raises(UserError, match="without its JSON line"):
        gpu_bench_cmd.result_of(["[p] Traceback", '[p] {"other": 1}'])


def test_the_bench_refuses_an_unknown_configuration(capsys):
    with pytest.raises(SystemExit) as exit_:
        gpu_bench.main(["--runs", "bf16,fp64"])
    assert exit_.value.code == 2
    assert "unknown configuration fp64" in capsys.readouterr().err


def _run(tmp_path: Path, spec_kwargs: dict, out: io.StringIO | None = None) -> dict:
    """The benchmark's job against the double; its pods run here, seeing no GPU whatever this
    machine has."""
    spec_kwargs = {"bench_root": str(REPO), **spec_kwargs}
    spec = gpu_bench_cmd.job_spec(IMAGE, namespace="ml", **spec_kwargs)
    env = {**TRAINER_ENV, "HOME": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    with FakeKube.running(tmp_path / "nodes", env) as kube:
        try:
            result = gpu_bench_cmd.run(spec, kube.api_client(), out=out or io.StringIO())
        except UserError:
            _assert_submitted(kube, spec)
            raise
        _assert_submitted(kube, spec)
        return result


def _assert_submitted(kube: FakeKube, spec: Any) -> None:
    assert [c.body for c in kube.calls("POST")] == [tfjob_manifest.build_manifest(spec)]


@pytest.mark.slow
def test_the_benchmark_runs_as_a_tfjob_and_its_line_comes_back(tmp_path):
    out = io.StringIO()
    result = _run(tmp_path, {"gpus": 0, "allow_cpu": True, "shape": "tiny", "runs": ["fp32"]}, out)
    assert result["skipped"] is False and result["device"] == "cpu"
    assert set(result["runs"]) == {"fp32"}  # only the configuration asked for
    assert result["tokens_per_s"]["fp32"] > 0
    assert result["runs"]["fp32"]["policy"] == "float32"
    assert "created TFJob ml/gpubench-" in out.getvalue()
    assert '"bench": "gpu"' in out.getvalue()  # worker 0's log streamed meanwhile


@pytest.mark.slow
def test_a_pod_that_sees_no_gpu_fails_the_command_saying_so(tmp_path):
    with pytest.raises(UserError, match="was given 1 GPU.s. but TensorFlow saw none"):
        _run(tmp_path, {"gpus": 1})


@pytest.mark.slow
def test_the_line_is_read_back_from_the_pod_when_the_log_stream_dropped(tmp_path, monkeypatch):
    # Follow streams that bring nothing (each cut at once, by an idle timeout between here
    # and the API server): the follower never sees the pod's output, and the line comes from
    # the finished pod's log.
    def dropped(self: Any, pod_name: str, place: Any) -> str:
        return "dropped"

    monkeypatch.setattr(logs.LogFollower, "_follow", dropped)
    out = io.StringIO()
    with pytest.raises(UserError, match="TensorFlow saw none"):
        _run(tmp_path, {"gpus": 1}, out)
    assert '"bench": "gpu"' not in out.getvalue()  # nothing came through the stream
    assert "TypeError" not in out.getvalue()  # the stand-in is called as _follow is


def test_an_image_without_bench_is_named(tmp_path):
    with pytest.raises(UserError, match="the trainer image has no bench/") as err:
        _run(tmp_path, {"gpus": 1, "bench_root": str(tmp_path / "empty")})
    assert "No module named 'bench'" in str(err.value)  # the worker's own last lines


def test_no_kubernetes_credentials_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert cli.main(["gpu-bench", "--image", IMAGE]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gptpipe: error: no Kubernetes credentials") and "\n" not in err


def test_an_unreachable_api_server_is_one_line():
    from kubernetes import client

    config = client.Configuration(host="http://127.0.0.1:9")  # discard: nothing listens
    config.retries = 0
    spec = gpu_bench_cmd.job_spec(IMAGE, 1)
    with pytest.raises(UserError, match="cannot reach the Kubernetes API for TFJob kubeflow/"):
        gpu_bench_cmd.run(spec, client.ApiClient(config), out=io.StringIO())


def test_a_request_the_api_server_refuses_names_its_status_and_message(monkeypatch):
    # kubernetes/client/rest.py raises ApiException for a non-2xx answer, with the Status body.
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    body = json.dumps({"kind": "Status", "message": 'TFJob "x" is invalid: tolerations[0]'})

    def refuse(*args: Any, **kwargs: Any) -> None:
        error = ApiException(status=422, reason="Unprocessable Entity")
        error.body = body
        raise error

    monkeypatch.setattr(client.CustomObjectsApi, "create_namespaced_custom_object", refuse)
    with FakeKube() as kube, pytest.raises(UserError) as err:
        gpu_bench_cmd.run(gpu_bench_cmd.job_spec(IMAGE, 1), kube.api_client(), io.StringIO())
    assert "refused TFJob kubeflow/gpubench-" in str(err.value)
    assert '422 Unprocessable Entity TFJob "x" is invalid: tolerations[0]' in str(err.value)


def test_a_job_past_its_deadline_with_no_log_points_at_the_pods_events():
    # The operator's message for a job past activeDeadlineSeconds (common/job.go); no pod ran.
    spec = gpu_bench_cmd.job_spec(IMAGE, 8, namespace="team-a")
    message = f"Job {spec.name} has failed because it was active longer than specified deadline"
    error = LaunchError(message, reason="DeadlineExceeded", job_name=spec.name)
    text = gpu_bench_cmd._failure(spec, error, [])
    assert "no node with 8 free nvidia.com/gpu" in text
    assert f"involvedObject.name={spec.name}-worker-0" in text
    assert "no node" not in gpu_bench_cmd._failure(spec, error, ["step 3 loss 2.1"])
