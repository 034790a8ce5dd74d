"""trainer.config: presets, YAML, overrides, validation and the derived-value functions."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.errors import UserError
from trainer.config import (
    Config,
    ConfigError,
    config_from_dict,
    config_hash,
    config_to_dict,
    precision_policy,
    resolve_config,
)
from trainer.run_plan import learning_rate_at


def test_presets():
    tiny = resolve_config("tiny")
    assert tiny == Config()
    small = resolve_config("gpt2-small")
    m = small.model
    assert (m.n_layer, m.n_head, m.d_model, m.d_ff, m.seq_len) == (12, 12, 768, 3072, 1024)
    with pytest.raises(ConfigError, match="unknown preset"):
        resolve_config("huge")


def test_overrides_section_and_bare_keys_are_typed():
    cfg = resolve_config(
        "tiny", ["model.n_layer=3", "learning_rate=1e-4", "jit_compile=on", "precision=float32"]
    )
    assert cfg.model.n_layer == 3
    assert cfg.train.learning_rate == pytest.approx(1e-4)
    assert cfg.train.jit_compile == "on"
    assert cfg.train.precision == "float32"


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ConfigError, match="unknown key 'model.n_layers'.*model.n_layer"):
        resolve_config("tiny", ["model.n_layers=3"])
    with pytest.raises(UserError):  # ConfigError is a UserError, so the CLI exits 2
        resolve_config("tiny", ["nope=1"])


def test_wrong_type_names_key_and_type():
    with pytest.raises(ConfigError, match=r"model.n_layer='two' is not a valid int"):
        resolve_config("tiny", ["model.n_layer=two"])
    with pytest.raises(ConfigError, match="jit_compile must be one of"):
        resolve_config("tiny", ["jit_compile=maybe"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.n_head=3", "n_head=3 must divide model.d_model=128"),
        ("model.dropout=1.0", "dropout must be in"),
        ("model.vocab_size=0", "vocab_size must be positive"),
        ("model.position=alibi", r"position must be one of \('learned', 'rotary'\), got 'alibi'"),
        # 128 / 8 = 16 is even, 120 / 8 = 15 is not: rotary turns pairs of a head's dimensions
        ("model.position=rotary,model.d_model=120,model.n_head=8", "must be even, got 15"),
        ("train.warmup_steps=1000", "warmup_steps=1000 must be in"),
        ("train.precision=fp8", "precision must be one of"),
        ("train.seed=-1", r"seed must be in \[0, 2\*\*32 - 1\], got -1"),
        ("train.seed=4294967296", "seed must be in"),  # numpy refuses it in every worker
    ],
)
def test_inconsistent_values(override, message):
    with pytest.raises(ConfigError, match=message):
        resolve_config("tiny", override.split(","))


def test_yaml_file_with_base_preset(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("base: gpt2-small\nmodel:\n  n_layer: 2\ntrain:\n  learning_rate: 1\n")
    cfg = resolve_config(str(path), ["train.train_steps=5000"])
    assert cfg.model.n_layer == 2 and cfg.model.d_model == 768
    assert cfg.train.learning_rate == 1.0 and cfg.train.train_steps == 5000
    path.write_text("model:\n  n_layer: two\n")
    with pytest.raises(ConfigError, match="model.n_layer must be int"):
        resolve_config(str(path))
    with pytest.raises(ConfigError, match="not found"):
        resolve_config(str(tmp_path / "missing.yml"))


def test_dict_round_trip_and_hash():
    cfg = resolve_config("tiny", ["model.n_layer=5"])
    data = json.loads(json.dumps(config_to_dict(cfg)))
    assert config_from_dict(data) == cfg
    assert config_hash(cfg) == config_hash(config_from_dict(data))
    assert config_hash(cfg) != config_hash(resolve_config("tiny"))
    assert len(config_hash(cfg)) == 64
    del data["train"]["seed"]
    with pytest.raises(ConfigError, match="missing keys train.seed"):
        config_from_dict(data)


def test_dict_through_a_protobuf_struct_keeps_its_ints():
    # KFP carries a dict parameter as a google.protobuf.Struct: every number becomes a double.
    from google.protobuf import json_format, struct_pb2

    cfg = resolve_config("tiny", ["model.n_layer=5"])
    struct = json_format.ParseDict(config_to_dict(cfg), struct_pb2.Struct())
    data = json_format.MessageToDict(struct)
    assert isinstance(data["model"]["n_layer"], float)
    assert config_from_dict(data) == cfg
    data["model"]["n_layer"] = 5.5
    with pytest.raises(ConfigError, match="model.n_layer must be int"):
        config_from_dict(data)
    with pytest.raises(ConfigError, match="expected a mapping"):
        config_from_dict("tiny")  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["nan", "inf", "-inf"])
def test_non_finite_numbers_are_refused(text):
    with pytest.raises(
        ConfigError, match=f"train.learning_rate must be a finite number, got {text}"
    ):
        resolve_config("tiny", [f"train.learning_rate={text}"])


def test_learning_rate_at():
    lr = [learning_rate_at(s, 1.0, 10, 110, 0.1) for s in range(110)]
    assert lr[0] == pytest.approx(0.1) and lr[9] == pytest.approx(1.0)
    assert all(a < b for a, b in zip(lr[:10], lr[1:10], strict=False))  # warmup rises
    assert all(a >= b for a, b in zip(lr[10:], lr[11:], strict=False))  # cosine falls
    assert lr[60] == pytest.approx(0.55)  # half-way through the decay
    assert learning_rate_at(500, 1.0, 10, 110, 0.1) == pytest.approx(0.1)  # floor
    assert learning_rate_at(0, 2.0, 0, 10, 0.0) == pytest.approx(2.0)  # no warmup


def test_precision_policy():
    assert precision_policy("auto", "cpu") == "float32"
    assert precision_policy("auto", "gpu", (9, 0)) == "mixed_bfloat16"
    assert precision_policy("auto", "gpu", (7, 5)) == "mixed_float16"
    assert precision_policy("auto", "gpu", (6, 0)) == "float32"
    assert precision_policy("mixed_float16", "cpu") == "mixed_float16"
    with pytest.raises(ConfigError):
        precision_policy("half", "gpu")


def test_import_does_not_load_tensorflow():
    code = "import sys, trainer.config; assert 'tensorflow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])


# The `tiny` preset as configs were recorded before model.position existed (e93a251), and the
# config_hash lineage recorded for it then.
TINY_BEFORE_POSITION = {
    "model": {
        "vocab_size": 512,
        "seq_len": 64,
        "n_layer": 3,
        "n_head": 4,
        "d_model": 128,
        "d_ff": 512,
        "dropout": 0.0,
        "layer_norm_epsilon": 1e-05,
        "init_std": 0.02,
    },
    # train.lr_scaling came later, its earlier value "linear" the only one then
    "train": {
        name: value
        for name, value in config_to_dict(resolve_config("tiny"))["train"].items()
        if name != "lr_scaling"
    },
}
TINY_HASH_BEFORE_POSITION = "48783720308e1aa95f78958d66c65d82713e1aa6b95310d4bf3ca5e0927e36f3"


def test_a_config_recorded_before_model_position_loads_and_hashes_as_it_did():
    cfg = config_from_dict(TINY_BEFORE_POSITION)
    assert cfg.model.position == "learned"  # what the model had then
    assert config_hash(cfg) == TINY_HASH_BEFORE_POSITION
    rotary = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, position="rotary"))
    assert config_hash(rotary) != TINY_HASH_BEFORE_POSITION
    assert config_from_dict(config_to_dict(rotary)) == rotary
    # Written without the field at its earlier value: what an image built before it loads.
    assert config_to_dict(cfg) == TINY_BEFORE_POSITION
    assert config_to_dict(rotary)["model"]["position"] == "rotary"
