"""The compiled pipeline YAML: a golden copy, pinned images, and clear refusals."""

import json
from pathlib import Path

import pytest
import yaml

from contracts.errors import UserError
from pipelines import cli, compiler
from trainer.config import DEFAULT_PRESET, config_to_dict, resolve_config

HERE = Path(__file__).resolve().parent
LOCK = HERE / "data" / "digests.json"
GOLDEN = HERE / "golden" / "gptpipe.yaml"


def compile_default(path: Path) -> Path:
    """The pipeline compiled with the test lock and the default preset."""
    return compiler.compile_pipeline(
        path, compiler.load_images(LOCK), resolve_config(DEFAULT_PRESET)
    )


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
    assert set(executors) == {"exec-tokenize", "exec-train", "exec-evaluate", "exec-push"}
    for executor in executors.values():
        assert "@sha256:" in executor["container"]["image"]
    trainer_image = json.loads(LOCK.read_text())["trainer"]
    assert trainer_image in GOLDEN.read_text()


def test_compile_without_lock_fails_unless_unpinned_is_allowed(tmp_path, capsys):
    missing = tmp_path / "none.json"
    with pytest.raises(UserError, match="--allow-unpinned"):
        compiler.load_images(missing)
    assert compiler.load_images(missing, allow_unpinned=True) == compiler.UNPINNED_IMAGES
    code = cli.main(["compile", "--output", str(tmp_path / "p.yaml"), "--lock", str(missing)])
    assert code == 2 and "no image digest lock" in capsys.readouterr().err


def test_lock_with_a_tag_is_refused(tmp_path):
    lock = tmp_path / "digests.json"
    lock.write_text(json.dumps({"pipeline": "repo/p:1.0", "trainer": "repo/t@sha256:" + "a" * 64}))
    with pytest.raises(UserError, match="'pipeline'.*not pinned by digest"):
        compiler.load_images(lock)


def test_cli_compile_writes_yaml(tmp_path, capsys):
    out = tmp_path / "gptpipe.yaml"
    assert cli.main(["compile", "--output", str(out), "--lock", str(LOCK)]) == 0
    spec, platform = yaml.safe_load_all(out.read_text())
    assert spec["pipelineInfo"]["name"] == "gptpipe"
    # The run id reaches every step from its pod's label, never as a (cache-keyed) input.
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert set(executors) == {"exec-tokenize", "exec-train", "exec-evaluate", "exec-push"}
    for config in executors.values():
        assert config["fieldPathAsEnv"] == [
            {"name": "KFP_RUN_ID", "fieldPath": "metadata.labels['pipeline/runid']"}
        ]
    assert "pipeline_job_uuid" not in out.read_text()
    # Train's KFP cache key holds no artifact (KFP keys those by identity, new every run): its
    # Examples arrive as the content-addressed URI, with the dataset version; the resolved
    # config is a parameter itself, so it is in the key by value.
    train = spec["root"]["dag"]["tasks"]["train"]["inputs"]
    assert "artifacts" not in train
    assert train["parameters"]["examples_uri"]["taskOutputParameter"]["producerTask"] == "tokenize"
    assert train["parameters"]["config"]["componentInputParameter"] == "config"


def test_compile_bakes_the_resolved_config_in_as_the_default(tmp_path):
    yaml_config = tmp_path / "small.yaml"
    yaml_config.write_text("model:\n  n_layer: 2\ntrain:\n  train_steps: 70\n")
    out = tmp_path / "gptpipe.yaml"
    argv = ["compile", "--output", str(out), "--lock", str(LOCK), "--config", str(yaml_config)]
    assert cli.main([*argv, "--set", "train.batch_size=4"]) == 0
    yaml_config.unlink()  # nothing reads the YAML file after compile
    spec, _ = yaml.safe_load_all(out.read_text())
    default = spec["root"]["inputDefinitions"]["parameters"]["config"]["defaultValue"]
    assert default == config_to_dict(
        resolve_config("tiny", ["model.n_layer=2", "train.train_steps=70", "train.batch_size=4"])
    )
    assert "small.yaml" not in out.read_text()
