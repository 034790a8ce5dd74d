"""The compiled pipeline YAML: a golden copy, pinned images, and clear refusals."""

import json
from pathlib import Path

import pytest
import yaml

from contracts.errors import UserError
from pipelines import compiler
from pipelines.cli import main as cli
from pipelines.pipeline import EXIT_TASK, Target
from trainer.config import DEFAULT_PRESET, config_to_dict, resolve_config

HERE = Path(__file__).resolve().parent
LOCK = HERE.parent / "data" / "digests.json"
GOLDEN = HERE / "golden" / "gptpipe.yaml"


ROOT = "gs://gptpipe-test/root"
STEPS = ("tokenize", "train", "evaluate", "push", "release")
# The only runtime placeholders KFP's v2 driver resolves in a parameter value (2.5.0:
# backend/src/v2/driver/driver.go, resolveInputs; later releases add create and schedule time).
DRIVER_PLACEHOLDERS = {
    "{{$.pipeline_job_name}}",
    "{{$.pipeline_job_resource_name}}",
    "{{$.pipeline_job_uuid}}",
    "{{$.pipeline_task_name}}",
    "{{$.pipeline_task_uuid}}",
}


def compile_default(path: Path, **target: object) -> Path:
    """The pipeline compiled with the test lock, a gs:// root and the default preset."""
    target = {"pipeline_root": ROOT, **target}
    found = Target(compiler.load_images(LOCK), **target)  # type: ignore[arg-type]
    return compiler.compile_pipeline(path, found, resolve_config(DEFAULT_PRESET))


def test_compiled_pipeline_matches_golden(tmp_path, request):
    out = compile_default(tmp_path / "p.yaml")
    if request.config.getoption("--update-golden"):
        GOLDEN.write_text(out.read_text())
    assert out.read_text() == GOLDEN.read_text(), (
        "compiled YAML changed; review it and rerun pytest with --update-golden"
    )


def test_every_executor_image_is_pinned_by_digest(tmp_path):
    spec, _ = yaml.safe_load_all(compile_default(tmp_path / "p.yaml").read_text())
    executors = spec["deploymentSpec"]["executors"]
    assert set(executors) == {f"exec-{step}" for step in STEPS}
    for executor in executors.values():
        assert "@sha256:" in executor["container"]["image"]
    trainer_image = json.loads(LOCK.read_text())["trainer"]
    assert trainer_image in GOLDEN.read_text()


def test_compile_without_lock_fails_unless_unpinned_is_allowed(tmp_path, capsys):
    missing = tmp_path / "none.json"
    with pytest.raises(UserError, match="--allow-unpinned"):
        compiler.load_images(missing)
    assert compiler.load_images(missing, allow_unpinned=True) == compiler.UNPINNED_IMAGES
    argv = ["compile", "--output", str(tmp_path / "p.yaml"), "--pipeline-root", ROOT]
    code = cli.main([*argv, "--lock", str(missing)])
    assert code == 2 and "no image digest lock" in capsys.readouterr().err


@pytest.mark.bad_input("an image digest lock that is not JSON, or not an object of references")
@pytest.mark.parametrize(
    "text", ['{"pipeline": "repo@sha256:', '["repo@sha256:abc"]', '{"trainer": 1}']
)
def test_a_malformed_digest_lock_is_one_user_error_naming_it(tmp_path, text):
    lock = tmp_path / "digests.json"
    lock.write_text(text)
    with pytest.raises(UserError, match=f"image digest lock {lock}"):
        compiler.load_images(lock)


def test_lock_with_a_tag_is_refused(tmp_path):
    lock = tmp_path / "digests.json"
    lock.write_text(json.dumps({"pipeline": "repo/p:1.0", "trainer": "repo/t@sha256:" + "a" * 64}))
    with pytest.raises(UserError, match="'pipeline'.*not pinned by digest"):
        compiler.load_images(lock)


def test_cli_compile_writes_yaml(tmp_path, capsys):
    out = tmp_path / "gptpipe.yaml"
    argv = ["compile", "--output", str(out), "--lock", str(LOCK), "--pipeline-root", ROOT]
    assert cli.main(argv) == 0
    spec, platform = yaml.safe_load_all(out.read_text())
    assert spec["pipelineInfo"]["name"] == "gptpipe"
    # The run id reaches every step from its pod's label, never as a (cache-keyed) input.
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert set(executors) == {
        "exec-tokenize",
        "exec-train",
        "exec-evaluate",
        "exec-push",
        "exec-release",
    }
    for config in executors.values():
        assert config["fieldPathAsEnv"] == [
            {"name": "KFP_RUN_ID", "fieldPath": "metadata.labels['pipeline/runid']"},
            {"name": "GPTPIPE_POD_NAMESPACE", "fieldPath": "metadata.namespace"},
        ]
    assert "pipeline_job_uuid" not in out.read_text()
    # Train's KFP cache key holds no artifact (KFP keys those by identity, new every run): its
    # Examples arrive as the content-addressed URI, with the dataset version; the resolved
    # config is a parameter itself, so it is in the key by value.
    train = all_tasks(spec)["train"]["inputs"]
    assert "artifacts" not in train
    assert train["parameters"]["examples_uri"]["taskOutputParameter"]["producerTask"] == "tokenize"
    assert train["parameters"]["config"]["componentInputParameter"].endswith("config")


def test_compile_bakes_the_resolved_config_in_as_the_default(tmp_path):
    yaml_config = tmp_path / "small.yaml"
    yaml_config.write_text("model:\n  n_layer: 2\ntrain:\n  train_steps: 70\n")
    out = tmp_path / "gptpipe.yaml"
    argv = ["compile", "--output", str(out), "--lock", str(LOCK), "--pipeline-root", ROOT]
    assert cli.main([*argv, "--config", str(yaml_config), "--set", "train.batch_size=4"]) == 0
    yaml_config.unlink()  # nothing reads the YAML file after compile
    spec, _ = yaml.safe_load_all(out.read_text())
    default = spec["root"]["inputDefinitions"]["parameters"]["config"]["defaultValue"]
    assert default == config_to_dict(
        resolve_config("tiny", ["model.n_layer=2", "train.train_steps=70", "train.batch_size=4"])
    )
    assert "small.yaml" not in out.read_text()


def compiled(tmp_path: Path, **target: object) -> tuple[dict, dict]:
    spec, platform = yaml.safe_load_all(compile_default(tmp_path / "p.yaml", **target).read_text())
    return spec, platform


def all_tasks(spec: dict) -> dict[str, dict]:
    tasks = dict(spec["root"]["dag"]["tasks"])
    for component in spec["components"].values():
        tasks.update(component.get("dag", {}).get("tasks", {}))
    return tasks


def test_no_parameter_depends_on_a_placeholder_the_driver_leaves_literal(tmp_path):
    spec, _ = compiled(tmp_path)
    for name, task in all_tasks(spec).items():
        for key, value in task.get("inputs", {}).get("parameters", {}).items():
            constant = value.get("runtimeValue", {}).get("constant")
            if isinstance(constant, str) and "{{$." in constant:
                assert constant in DRIVER_PLACEHOLDERS, f"{name}.{key} = {constant}"
    assert "pipeline_root" not in json.dumps(all_tasks(spec))
    assert spec["defaultPipelineRoot"] == ROOT
    artifact_root = spec["root"]["inputDefinitions"]["parameters"]["artifact_root"]
    assert artifact_root["defaultValue"] == ROOT


def test_a_pipeline_root_that_is_not_gcs_is_refused(tmp_path, capsys):
    with pytest.raises(UserError, match="defaultPipelineRoot"):
        compile_default(tmp_path / "p.yaml", pipeline_root="minio://mlpipeline/v2/artifacts")
    argv = ["compile", "--output", str(tmp_path / "p.yaml"), "--lock", str(LOCK)]
    with pytest.raises(SystemExit):  # argparse: --pipeline-root is required
        cli.main(argv)
    assert "--pipeline-root" in capsys.readouterr().err
    assert cli.main([*argv, "--pipeline-root", "s3://bucket/root"]) == 2
    assert "not gs://" in capsys.readouterr().err


@pytest.mark.bad_input("gptpipe compile --output naming a folder, a file's path, or not YAML")
@pytest.mark.parametrize(
    "output, says",
    [
        ("", "--output {tmp} is a folder: give a file, e.g. {tmp}/out.yaml"),
        ("notes.txt/p.yaml", "--output {tmp}/notes.txt/p.yaml: {tmp}/notes.txt is a file, not"),
        ("p.json", "--output {tmp}/p.json: give a file name ending .yaml or .yml"),
    ],
    ids=["a-folder", "under-a-file", "not-yaml"],
)
def test_an_output_that_cannot_be_the_yaml_is_one_line(tmp_path, capsys, output, says):
    (tmp_path / "notes.txt").write_text("mine\n")
    path = tmp_path / output if output else tmp_path
    argv = ["compile", "--output", str(path), "--lock", str(LOCK), "--pipeline-root", ROOT]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gptpipe: error: {says.format(tmp=tmp_path)}") and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_every_step_has_requests_and_limits_and_no_gpu(tmp_path):
    spec, _ = compiled(tmp_path)
    for step in STEPS:
        container = spec["deploymentSpec"]["executors"][f"exec-{step}"]["container"]
        resources = container["resources"]
        for key in ("cpuRequest", "cpuLimit", "memoryRequest", "memoryLimit"):
            assert resources[key] > 0, (step, key)
        # The trainer's GPUs are the TFJob workers'; no step pod asks for an accelerator.
        assert "accelerator" not in resources, step


def test_train_retries_and_the_release_step_is_the_exit_handler(tmp_path):
    spec, platform = compiled(tmp_path)
    tasks = all_tasks(spec)
    assert tasks["train"]["retryPolicy"]["maxRetryCount"] == 2
    release = spec["root"]["dag"]["tasks"][EXIT_TASK]  # the name `gptpipe kfp run` looks for
    assert release["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    (group,) = release["dependentTasks"]
    assert set(spec["components"][f"comp-{group}"]["dag"]["tasks"]) == {
        "tokenize",
        "train",
        "evaluate",
        "push",
    }
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert executors["exec-release"]["fieldPathAsEnv"][0]["name"] == "KFP_RUN_ID"


def test_image_pull_secrets_reach_every_step(tmp_path):
    _, platform = compiled(tmp_path, image_pull_secrets=("regcred",))
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for step in STEPS:
        (secret,) = executors[f"exec-{step}"]["imagePullSecret"]
        assert secret["secretName"] == "regcred", step


# ---- the compiled YAML against KFP's own protobuf schemas ---------------------------------


def test_the_compiled_yaml_parses_strictly_into_the_pipeline_spec_proto(tmp_path):
    from google.protobuf import json_format
    from kfp.pipeline_spec import pipeline_spec_pb2

    spec, _ = compiled(tmp_path)
    # No ignore_unknown_fields: a field KFP's backend does not know is an error here.
    parsed = json_format.ParseDict(spec, pipeline_spec_pb2.PipelineSpec())
    # deploymentSpec is a Struct in PipelineSpec: parse it into its own message too.
    deployment = json_format.ParseDict(
        spec["deploymentSpec"], pipeline_spec_pb2.PipelineDeploymentConfig()
    )
    assert json_format.MessageToDict(parsed) == spec, "the YAML carries what the proto drops"
    assert json_format.MessageToDict(deployment) == spec["deploymentSpec"]
    assert parsed.pipeline_info.name == "gptpipe" and parsed.default_pipeline_root == ROOT
    assert set(deployment.executors) == {f"exec-{step}" for step in STEPS}
    with pytest.raises(json_format.ParseError, match="no field named"):
        json_format.ParseDict(
            {**spec, "defaultPipelineRot": ROOT}, pipeline_spec_pb2.PipelineSpec()
        )


def test_the_platform_spec_parses_strictly_into_the_kubernetes_executor_config(tmp_path):
    from google.protobuf import json_format
    from kfp.kubernetes import kubernetes_executor_config_pb2
    from kfp.pipeline_spec import pipeline_spec_pb2

    _, platform = compiled(tmp_path, image_pull_secrets=("regcred",))
    parsed = json_format.ParseDict(platform, pipeline_spec_pb2.PlatformSpec())
    assert json_format.MessageToDict(parsed) == platform
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert set(executors) == {f"exec-{step}" for step in STEPS}
    for name, config in executors.items():
        message = json_format.ParseDict(
            config, kubernetes_executor_config_pb2.KubernetesExecutorConfig()
        )
        assert json_format.MessageToDict(message) == config, name
        assert [s.secret_name for s in message.image_pull_secret] == ["regcred"], name
    with pytest.raises(json_format.ParseError, match="no field named"):
        json_format.ParseDict(
            {"imagePullSecrets": [{"secretName": "regcred"}]},
            kubernetes_executor_config_pb2.KubernetesExecutorConfig(),
        )


@pytest.mark.slow
def test_no_credential_in_the_environment_reaches_the_compiled_yaml(tmp_path):
    import os
    import subprocess
    import sys

    token = "eyJhbGciOiJSUzI1NiJ9.planted-kfp-token.c2lnbmF0dXJl"
    token_file = tmp_path / "kfp-token"
    token_file.write_text(token)
    key_file = tmp_path / "gcp-key.json"
    key = "-----BEGIN PRIVATE KEY-----planted-----END PRIVATE KEY-----"
    key_file.write_text(json.dumps({"type": "service_account", "private_key": key}))
    planted = {
        "KF_PIPELINES_SA_TOKEN_PATH": str(token_file),
        "GOOGLE_APPLICATION_CREDENTIALS": str(key_file),
        "KF_PIPELINES_ENDPOINT": "https://kfp.planted-host.example/pipeline",
        "KFP_TOKEN": token,
        "GITHUB_TOKEN": "ghs_plantedGitHubToken0123456789",
        "AWS_SECRET_ACCESS_KEY": "planted/aws/secret/key",
    }
    gptpipe = Path(sys.executable).parent / "gptpipe"
    clean = {k: v for k, v in os.environ.items() if k not in planted}

    def compile_with(env: dict, out: Path) -> str:
        argv = [str(gptpipe), "compile", "--output", str(out), "--lock", str(LOCK)]
        subprocess.run([*argv, "--pipeline-root", ROOT], env=env, check=True, capture_output=True)
        return out.read_text()

    leaked = compile_with({**clean, **planted}, tmp_path / "planted.yaml")
    for name, value in [*planted.items(), ("the token file's text", token), ("the key", key)]:
        assert value not in leaked, f"{name} reached the compiled YAML"
    assert "planted" not in leaked
    assert leaked == compile_with(clean, tmp_path / "clean.yaml")
