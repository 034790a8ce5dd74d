"""`gptpipe lineage` and `gptpipe reproduce`, and dataset versions, on a real SQLite MLMD store.

The store is filled the way the components fill it (a real tokenize, `lineage.step` with
provenance properties), without training a model: these tests are about the records.
"""

import hashlib
import json
from pathlib import Path

import pytest
import yaml
from ml_metadata.proto import metadata_store_pb2 as mlmd

from components import lineage, provenance
from components.tokenize import executor as tokenize
from contracts.errors import UserError
from contracts.examples import ExamplesManifest
from contracts.params import EvalPolicy, TokenizeParams, TrainJob
from pipelines.cli import lineage as lineage_cmd
from pipelines.cli import main as cli
from trainer.config import config_hash, config_to_dict, resolve_config

SHAKESPEARE = Path(__file__).resolve().parents[3] / "data" / "tinyshakespeare.txt"
PIPELINE_IMAGE = "ghcr.io/gptpipe/gptpipe-pipeline@sha256:" + "1" * 64
TRAINER_IMAGE = "ghcr.io/gptpipe/gptpipe-trainer@sha256:" + "2" * 64
WORKER_DIGEST = "sha256:" + "ab" * 32
CONFIG = config_to_dict(resolve_config("tiny", ["model.vocab_size=340", "model.seq_len=32"]))
CONFIG_HASH = config_hash(resolve_config("tiny", ["model.vocab_size=340", "model.seq_len=32"]))
JOB = TrainJob(deadline_seconds=0, node_selector={"pool": "a100"})  # what the run trained with


def write_corpus(folder: Path, extra: str = "") -> Path:
    text = SHAKESPEARE.read_text(encoding="utf-8")[:12_000]
    path = folder / "corpus.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text[: text.rindex("\n") + 1] + extra, encoding="utf-8")
    return path


def record_tokenize(
    store: str,
    corpus: Path,
    out: Path,
    run_id: str,
    image: str = PIPELINE_IMAGE,
    tokenize_params: TokenizeParams = TokenizeParams(),  # noqa: B008 -- frozen
) -> ExamplesManifest:
    """What the tokenize component records: a real tokenize, its provenance and Examples."""
    params = {
        "corpus": str(corpus),
        "config": CONFIG,
        "tokenize": tokenize_params.to_dict(),
        "vocab_size": 340,
        "seq_len": 32,
    }
    found = provenance.detect(image, {provenance.CODE_VERSION_ENV: "c0ffee"}).properties()
    with lineage.step(store, "tokenize", "gptpipe", run_id, params, found) as rec:
        manifest = tokenize.run(str(corpus), str(out), vocab_size=340, seq_len=32, progress=False)
        rec.output("examples", "Examples", str(out), tokenize.artifact_properties(manifest))
        rec.dataset_version = manifest.dataset_version
    return manifest


def record_rest(
    store: str, root: Path, examples: str, version: str, run_id: str, image: str = PIPELINE_IMAGE
) -> str:
    """Train, evaluate and push as their components record them; returns the pushed URI."""
    found = provenance.detect(image, {provenance.CODE_VERSION_ENV: "c0ffee"}).properties()
    model, pushed = str(root / run_id / "model"), str(root / "serving" / "gpt" / "1")
    train_params = {
        "config": CONFIG,
        "train_job": JOB.to_dict(),
        "trainer_image": TRAINER_IMAGE,
        "config_hash": CONFIG_HASH,
    }
    with lineage.step(store, "train", "gptpipe", run_id, train_params, found) as rec:
        rec.input("examples", "Examples", examples, upstream=True)
        rec.set(
            job_name="gptpipe-train-abc",
            gpu_hours=1.25,
            worker_image_digests={"gptpipe-train-abc-worker-0": WORKER_DIGEST},
        )
        rec.output("model", "Model", model, {"config_hash": "f" * 64, "final_loss": 2.5})
        rec.dataset_version = version
    eval_params = {
        "serving_dir": str(root / "serving" / "gpt"),
        "eval_policy": EvalPolicy().to_dict(),
    }
    with lineage.step(store, "evaluate", "gptpipe", run_id, eval_params, found) as rec:
        rec.input("examples", "Examples", examples, upstream=True)
        rec.input("model", "Model", model, upstream=True)
        rec.output(
            "evaluation",
            "ModelEvaluation",
            str(root / run_id / "metrics"),
            {"eval_nats_per_char": 1.9, "baseline_nats_per_char": 2.0},
        )
        rec.output(
            "blessing",
            "ModelBlessing",
            str(root / run_id / "blessing"),
            {
                "blessed": 1,
                "reason": "better than the baseline",
                "baseline_model": "/serving/gpt/0",
            },
        )
        rec.dataset_version = version
    with lineage.step(store, "push", "gptpipe", run_id, {"serving_dir": "s"}, found) as rec:
        rec.input("model", "Model", model, upstream=True)
        rec.input("blessing", "ModelBlessing", str(root / run_id / "blessing"), upstream=True)
        rec.output(
            "pushed_model",
            "PushedModel",
            pushed,
            {"pushed": 1, "pushed_destination": "s", "pushed_version": "1"},
        )
        rec.dataset_version = version
    return pushed


def record_not_pushed(store: str, destination: Path) -> None:
    """A push that published nothing, recorded as push/executor.py does: at the destination."""
    with lineage.step(store, "push", "gptpipe", "run-rejected", {}, {}) as rec:
        props = {"pushed": 0, "pushed_destination": str(destination), "pushed_version": ""}
        rec.output("pushed_model", "PushedModel", str(destination), props)


@pytest.fixture
def recorded(tmp_path):
    store = str(tmp_path / "runs" / "metadata.sqlite")
    corpus = write_corpus(tmp_path / "data")
    manifest = record_tokenize(store, corpus, tmp_path / "examples", "run-1")
    pushed = record_rest(
        store, tmp_path, str(tmp_path / "examples"), manifest.dataset_version, "run-1"
    )
    return {
        "store": store,
        "corpus": corpus,
        "manifest": manifest,
        "pushed": pushed,
        "root": tmp_path / "runs",
    }


def test_lineage_json_field_by_field(recorded, capsys):
    assert cli.main(["lineage", recorded["pushed"], "--root", str(recorded["root"]), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    manifest = recorded["manifest"]
    assert out["store"] == str(Path(recorded["store"]).resolve())
    assert out["pushed_model"]["uri"] == recorded["pushed"]
    assert (out["pushed_model"]["pushed"], out["pushed_model"]["version"]) == (1, "1")
    assert out["pushed_model"]["push"]["state"] == "COMPLETE"
    assert out["model"]["uri"].endswith("run-1/model")
    assert out["model"]["properties"]["config_hash"] == "f" * 64
    train = out["train"]
    assert (train["step"], train["state"], train["run_id"]) == ("train", "COMPLETE", "run-1")
    assert train["image"] == PIPELINE_IMAGE and train["image_digest"] == "sha256:" + "1" * 64
    assert "unpinned" not in train
    assert train["code_version"] == "c0ffee"
    assert train["environment_digest"] == lineage.environment_digest()
    assert train["trainer_image"] == TRAINER_IMAGE
    assert train["worker_image_digests"] == {"gptpipe-train-abc-worker-0": WORKER_DIGEST}
    assert (train["gpu_hours"], train["job_name"]) == (1.25, "gptpipe-train-abc")
    assert TrainJob.from_dict(train["parameters"]["train_job"]) == JOB
    assert train["parameters"]["config"] == CONFIG
    assert train["start_time_ms"] <= train["end_time_ms"]
    examples = out["examples"]
    assert examples["dataset_version"] == manifest.dataset_version
    assert examples["sources"] == [
        {
            "uri": str(recorded["corpus"]),
            "size": recorded["corpus"].stat().st_size,
            "sha256": manifest.sources[0].sha256,
        }
    ]
    assert examples["tokens"] == manifest.total("tokens")
    assert examples["windows"] == manifest.total("windows")
    assert examples["splits"]["eval"]["windows"] == manifest.splits["eval"].windows
    assert out["tokenize"]["parameters"]["corpus"] == str(recorded["corpus"])
    evaluation = out["evaluation"]
    assert (evaluation["blessed"], evaluation["baseline_model"]) == (1, "/serving/gpt/0")
    assert evaluation["metrics"] == {"eval_nats_per_char": 1.9, "baseline_nats_per_char": 2.0}
    assert evaluation["execution"]["step"] == "evaluate"


def test_lineage_latest_and_human_output(recorded, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # rich wraps at the terminal width
    assert cli.main(["lineage", "--latest", "--root", str(recorded["root"])]) == 0
    text = capsys.readouterr().out
    for expected in (
        "PushedModel",
        recorded["manifest"].dataset_version,
        "GPU-hours 1.25",
        WORKER_DIGEST,
        "baseline /serving/gpt/0",
        "tokenize",
    ):
        assert expected in text


def test_the_lineage_of_a_rolled_back_version_is_the_version_it_restored(recorded, capsys):
    serving = Path(recorded["pushed"]).parent  # .../serving/gpt, with version 1 recorded
    (serving / "1").mkdir(parents=True)
    (serving / "1" / "saved_model.pb").write_bytes(b"graph one")
    (serving / "2").mkdir()
    (serving / "2" / "saved_model.pb").write_bytes(b"graph two")  # pushed, not recorded here
    rollback = ["rollback", "--destination", str(serving), "--to", "1"]
    assert cli.main([*rollback, "--metadata", recorded["store"]]) == 0
    assert cli.main([*rollback, "--metadata", recorded["store"]]) == 0  # a rollback of it: 4
    capsys.readouterr()
    found = lineage_cmd.report(recorded["store"], str(serving / "4"))
    assert found["pushed_model"]["version"] == "4"
    assert found["pushed_model"]["restored_from"] == [str(serving / "1")]
    assert found["train"]["job_name"] == "gptpipe-train-abc"  # version 1's chain, down to data
    assert found["examples"]["dataset_version"] == recorded["manifest"].dataset_version
    assert found["evaluation"]["blessed"] == 1
    assert cli.main(["lineage", "--latest", "--root", str(recorded["root"])]) == 0
    assert "restores version 1" in capsys.readouterr().out
    # The serving folder itself stands for the version it serves, not for a push recorded
    # there that published nothing.
    record_not_pushed(recorded["store"], serving)
    assert lineage_cmd.resolve_model(recorded["store"], str(serving), False) == str(serving / "4")


def test_lineage_errors_are_one_line(recorded, tmp_path, capsys):
    assert cli.main(["lineage", "--root", str(recorded["root"])]) == 2
    assert "MODEL_URI" in capsys.readouterr().err
    assert cli.main(["lineage", "/nowhere", "--root", str(recorded["root"])]) == 2
    assert "no PushedModel at '/nowhere'" in capsys.readouterr().err
    assert cli.main(["lineage", "--latest", "--root", str(tmp_path / "empty")]) == 2
    assert "no metadata store" in capsys.readouterr().err
    both = ["lineage", "/somewhere", "--latest", "--root", str(recorded["root"])]
    assert cli.main(both) == 2
    assert "or --latest, not both" in capsys.readouterr().err


@pytest.mark.slow
def test_reproduce_writes_pipeline_and_parameters(recorded, tmp_path, capsys):
    out = tmp_path / "again" / "gptpipe.yaml"
    argv = ["reproduce", recorded["pushed"], "--root", str(recorded["root"]), "--output", str(out)]
    assert cli.main([*argv, "--image-pull-secret", "regcred"]) == 0
    spec, platform = yaml.safe_load_all(out.read_text())
    # The pull secret, compiled into every step (lineage does not record the original's).
    secrets = [
        config["imagePullSecret"]
        for config in platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"].values()
    ]
    assert secrets and all([x["secretName"] for x in s] == ["regcred"] for s in secrets), secrets
    images = {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()}
    assert images == {PIPELINE_IMAGE}
    assert TRAINER_IMAGE in out.read_text()
    params = json.loads(out.with_suffix(".params.json").read_text())
    assert params["arguments"] == {
        "corpus": str(recorded["corpus"]),
        "config": CONFIG,
        "tokenize": TokenizeParams().to_dict(),
        "train_job": JOB.to_dict(),
        "serving_dir": str(tmp_path / "serving" / "gpt"),
        "eval_policy": EvalPolicy().to_dict(),
    }
    assert set(params["arguments"]) < set(spec["root"]["inputDefinitions"]["parameters"])
    assert params["reproduces"]["dataset_version"] == recorded["manifest"].dataset_version
    assert params["reproduces"]["code_version"] == "c0ffee"


def test_reproduce_refuses_a_run_recorded_before_step_parameter_objects():
    """A record of flat parameters (workers=2, ...) cannot name every setting again."""
    flat = {"tokenize": {"corpus": "c", "config": CONFIG, "eval_fraction": 0.1}, "train": {}}
    with pytest.raises(UserError, match="recorded no tokenize parameters: it predates one"):
        lineage_cmd.recorded_arguments(flat)


@pytest.mark.slow
@pytest.mark.parametrize("change", ["one byte", "new file", "gone"])
def test_reproduce_refuses_changed_sources(recorded, tmp_path, change):
    corpus = recorded["corpus"]
    if change == "one byte":
        data = bytearray(corpus.read_bytes())
        data[100] ^= 1
        corpus.write_bytes(bytes(data))
    elif change == "gone":
        corpus.unlink()
    args = (recorded["store"], recorded["pushed"], tmp_path / "p.yaml")
    if change == "new file":  # a folder corpus that now matches one more file
        (corpus.parent / "more.txt").write_text("more\n")
        manifest = recorded["manifest"]
        with pytest.raises(UserError, match="more.txt"):
            lineage_cmd.check_sources(
                str(corpus.parent), manifest.sources, manifest.dataset_version
            )
        return
    with pytest.raises(UserError, match=f"source {corpus}"):
        lineage_cmd.reproduce(*args)
    assert not (tmp_path / "p.yaml").exists()


def test_reproduce_checks_the_tokenizer_its_tokenize_parameters_name(tmp_path, capsys):
    """The run's tokenize.tokenizer is read from its record and checked against the dataset
    version, whose tokenizer (trained by the run here) it is not."""
    store = str(tmp_path / "runs" / "metadata.sqlite")
    corpus = write_corpus(tmp_path / "data")
    tokenizer = tmp_path / "tok.model"
    tokenizer.write_bytes(b"not the tokenizer the dataset was made with")
    given = TokenizeParams(tokenizer=str(tokenizer))
    manifest = record_tokenize(store, corpus, tmp_path / "ex", "run-1", tokenize_params=given)
    pushed = record_rest(store, tmp_path, str(tmp_path / "ex"), manifest.dataset_version, "run-1")
    out = tmp_path / "again.yaml"
    argv = ["reproduce", pushed, "--root", str(tmp_path / "runs"), "--output", str(out)]
    assert cli.main(argv) == 2
    assert f"tokenizer {tokenizer} changed since dataset version" in capsys.readouterr().err
    assert not out.exists()


def test_reproduce_refuses_a_given_tokenizer_that_changed_or_went(recorded, tmp_path):
    """A given tokenizer is part of the dataset version (its sha256): reproduce checks it as it
    checks the corpus, before writing anything."""
    tokenizer = tmp_path / "tok.model"
    tokenizer.write_bytes(b"a sentencepiece model")
    examples = {
        "dataset_version": recorded["manifest"].dataset_version,
        "tokenizer_sha256": hashlib.sha256(tokenizer.read_bytes()).hexdigest(),
    }
    lineage_cmd.check_tokenizer(str(tokenizer), examples)  # the same bytes: fine
    tokenizer.write_bytes(b"another model")
    with pytest.raises(UserError, match=f"tokenizer {tokenizer} changed since dataset version"):
        lineage_cmd.check_tokenizer(str(tokenizer), examples)
    tokenizer.unlink()
    with pytest.raises(UserError, match=f"tokenizer {tokenizer} of dataset version .* is gone"):
        lineage_cmd.check_tokenizer(str(tokenizer), examples)


@pytest.mark.slow
def test_reproduce_refuses_unpinned_images_unless_allowed(tmp_path):
    store = str(tmp_path / "m.sqlite")
    corpus = write_corpus(tmp_path / "data")
    manifest = record_tokenize(store, corpus, tmp_path / "ex", "r", image=provenance.LOCAL_IMAGE)
    pushed = record_rest(
        store,
        tmp_path,
        str(tmp_path / "ex"),
        manifest.dataset_version,
        "r",
        image=provenance.LOCAL_IMAGE,
    )
    with pytest.raises(UserError, match="'local-python-environment' has no digest"):
        lineage_cmd.reproduce(store, pushed, tmp_path / "p.yaml")
    yaml_path, _ = lineage_cmd.reproduce(store, pushed, tmp_path / "p.yaml", allow_unpinned=True)
    assert provenance.LOCAL_IMAGE in yaml_path.read_text()


def test_one_byte_changes_the_version_and_the_dataset_context(tmp_path):
    store = str(tmp_path / "m.sqlite")
    first = record_tokenize(store, write_corpus(tmp_path / "a"), tmp_path / "ex1", "run-1")
    same = record_tokenize(store, write_corpus(tmp_path / "a"), tmp_path / "ex2", "run-2")
    changed = record_tokenize(
        store, write_corpus(tmp_path / "a", extra="!"), tmp_path / "ex3", "run-3"
    )
    assert same.dataset_version == first.dataset_version
    assert changed.dataset_version != first.dataset_version
    raw = lineage.open_store(store)
    contexts = {c.name: c for c in raw.get_contexts_by_type(lineage.DATASET_CONTEXT)}
    assert set(contexts) == {first.dataset_version, changed.dataset_version}
    shared = raw.get_executions_by_context(contexts[first.dataset_version].id)
    runs = {e.custom_properties["run_id"].string_value for e in shared}
    assert runs == {"run-1", "run-2"}
    (alone,) = raw.get_executions_by_context(contexts[changed.dataset_version].id)
    assert alone.custom_properties["run_id"].string_value == "run-3"
    (examples,) = raw.get_artifacts_by_uri(str(tmp_path / "ex3"))
    assert examples.custom_properties["dataset_version"].string_value == changed.dataset_version
    assert json.loads(examples.custom_properties["sources"].string_value)[0]["size"] == (
        changed.sources[0].size
    )
    assert examples.state == mlmd.Artifact.LIVE


def test_reproduce_needs_no_config_file_and_refuses_an_inconsistent_record(tmp_path):
    config = tmp_path / "small.yaml"
    config.write_text("model:\n  n_layer: 2\n")
    cfg = resolve_config(str(config), [])
    recorded = {"config_hash": config_hash(cfg)}
    config.unlink()  # the record holds the values, so the file may be long gone
    assert lineage_cmd.check_config(config_to_dict(cfg), recorded) == cfg
    tampered = config_to_dict(cfg)
    tampered["model"]["n_layer"] = 4
    with pytest.raises(UserError, match="lineage record is inconsistent"):
        lineage_cmd.check_config(tampered, recorded)
    with pytest.raises(UserError, match="predates resolved configs"):
        lineage_cmd.check_config("tiny", recorded)


def as_struct(value):
    """`value` as a KFP dict parameter arrives at a step: a protobuf Struct, numbers doubles."""
    if isinstance(value, dict):
        return {key: as_struct(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [as_struct(item) for item in value]
    is_number = isinstance(value, int) and not isinstance(value, bool)
    return float(value) if is_number else value


def test_lineage_shows_the_config_and_parameters_as_set_not_as_kfp_carried_them(
    tmp_path, capsys, monkeypatch
):
    """KFP's Struct turns `n_layer: 3` into 3.0; lineage reads it back through the config's
    own config_from_dict (and each step parameter object's from_dict)."""
    store = str(tmp_path / "metadata.sqlite")
    carried = {"config": as_struct(CONFIG), "train_job": as_struct(JOB.to_dict()), "tag": 3.0}
    assert carried["config"]["model"]["n_layer"] == 3.0  # what the step records
    with lineage.step(store, "train", "gptpipe", "run-1", carried, {}) as rec:
        rec.output("model", "Model", str(tmp_path / "model"), {})
    with lineage.step(store, "push", "gptpipe", "run-1", {}, {}) as rec:
        rec.input("model", "Model", str(tmp_path / "model"), upstream=True)
        props = {"pushed": 1, "pushed_destination": "s", "pushed_version": "1"}
        rec.output("pushed_model", "PushedModel", str(tmp_path / "serving" / "1"), props)
    argv = ["lineage", str(tmp_path / "serving" / "1"), "--root", str(tmp_path)]
    assert cli.main([*argv, "--json"]) == 0
    parameters = json.loads(capsys.readouterr().out)["train"]["parameters"]
    assert parameters["config"] == CONFIG  # every key as recorded, each int an int
    assert isinstance(parameters["config"]["model"]["n_layer"], int)
    assert isinstance(parameters["config"]["train"]["learning_rate"], float)
    assert parameters["train_job"] == JOB.to_dict()
    assert parameters["tag"] == 3.0  # no class of its own to read it back: as recorded
    monkeypatch.setenv("COLUMNS", "4000")  # one line a node
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert '"n_layer": 3' in text and '"workers": 2' in text
    assert '"n_layer": 3.0' not in text and '"workers": 2.0' not in text


def test_a_recorded_config_this_version_refuses_is_shown_as_recorded():
    other = {"model": {"n_layer": 3.0, "a_later_field": 1.0}, "train": {}}
    assert lineage_cmd.as_set({"config": other}) == {"config": other}
    assert lineage_cmd.as_set({"train_job": {"workers": 0.0}}) == {"train_job": {"workers": 0.0}}
