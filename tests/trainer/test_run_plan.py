"""The run's derived shape: micro-batch, accumulation, steps, warmup and peak learning rate."""

import pytest

from trainer.config import ConfigError, resolve_config
from trainer.presets import GPT3_WARMUP_TOKENS
from trainer.run_plan import peak_learning_rate, plan_run


@pytest.mark.parametrize(
    ("preset", "shape", "lr", "batch_tokens"),
    [
        # GPT-2's shapes (layers, heads, width), trained as GPT-3's Table 2.1 nearest size
        ("gpt2-small", (12, 12, 768), 6.0e-4, 2**19),
        ("gpt2-medium", (24, 16, 1024), 3.0e-4, 2**19),
        ("gpt2-large", (36, 20, 1280), 2.5e-4, 2**19),
        ("gpt2-xl", (48, 25, 1600), 2.0e-4, 2**20),
    ],
)
def test_gpt2_presets_have_gpt2_shapes_and_gpt3_rates(preset, shape, lr, batch_tokens):
    cfg = resolve_config(preset)
    m, t = cfg.model, cfg.train
    assert (m.n_layer, m.n_head, m.d_model) == shape
    assert (m.d_ff, m.seq_len) == (4 * m.d_model, 1024)
    assert (t.learning_rate, t.global_batch_tokens) == (lr, batch_tokens)
    assert (t.train_steps, t.warmup_steps, t.warmup_tokens) == (0, 0, GPT3_WARMUP_TOKENS)
    assert t.train_tokens > 0 and t.lr_scaling == "capped"


@pytest.mark.parametrize("preset", ["gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl"])
def test_a_preset_in_tokens_trains_the_same_model_on_8_and_64_gpus(preset):
    cfg = resolve_config(preset)
    few, many = plan_run(cfg, 8), plan_run(cfg, 64)
    assert few.global_batch_tokens == many.global_batch_tokens == cfg.train.global_batch_tokens
    assert (few.steps, few.warmup_steps) == (many.steps, many.warmup_steps)
    assert few.peak_learning_rate == many.peak_learning_rate == cfg.train.learning_rate
    assert few.micro_batch * few.accumulation == 8 * many.micro_batch * many.accumulation
    assert few.train_tokens >= cfg.train.train_tokens > few.train_tokens - few.global_batch_tokens


def test_accumulation_fills_the_global_batch_in_micro_batches():
    cfg = resolve_config("tiny", ["train.global_batch_tokens=16384", "train.batch_size=8"])
    plan = plan_run(cfg, 2)  # 16384 / 64 = 256 sequences, 128 per replica, 16 passes of 8
    assert (plan.micro_batch, plan.accumulation, plan.global_batch) == (8, 16, 256)
    assert "2 replicas x micro-batch 8 x accumulation 16" in plan.describe()
    small = plan_run(cfg, 64)  # a share of 4 sequences: all of it in one pass
    assert (small.micro_batch, small.accumulation) == (4, 1)


def test_without_global_batch_tokens_the_batch_grows_with_the_replicas():
    cfg = resolve_config("tiny")
    plan = plan_run(cfg, 4)
    assert (plan.micro_batch, plan.accumulation, plan.global_batch) == (32, 1, 128)
    assert (plan.steps, plan.warmup_steps) == (cfg.train.train_steps, cfg.train.warmup_steps)


def test_a_global_batch_that_does_not_split_evenly_is_refused_with_the_nearest():
    cfg = resolve_config("gpt2-xl")
    with pytest.raises(ConfigError) as caught:
        plan_run(cfg, 100)
    message = str(caught.value)
    assert "train.global_batch_tokens=1,048,576 must be a multiple of seq_len 1024 x 100" in message
    assert "micro-batch 4 (train.batch_size) = 409,600; nearest: 819,200 or 1,228,800" in message
    fixed = resolve_config("gpt2-xl", ["train.global_batch_tokens=1024000", "train.batch_size=5"])
    assert (plan_run(fixed, 100).micro_batch, plan_run(fixed, 100).accumulation) == (5, 2)
    with pytest.raises(ConfigError, match="must be a multiple of seq_len 64 x 1 replicas"):
        plan_run(resolve_config("tiny", ["train.global_batch_tokens=100"]), 1)


def test_steps_and_warmup_from_tokens_round_up():
    cfg = resolve_config("tiny", ["train.train_tokens=10000", "train.warmup_tokens=3000"])
    plan = plan_run(cfg, 1)  # 2048 tokens a step
    assert (plan.steps, plan.warmup_steps) == (5, 2)
    assert cfg.train.train_steps == 0 and cfg.train.warmup_steps == 0  # cleared by the others


@pytest.mark.parametrize(
    ("rule", "at_8", "at_64"),
    [("capped", 0.5, 1.0), ("linear", 0.5, 4.0), ("none", 1.0, 1.0)],
)
def test_the_learning_rate_rules(rule, at_8, at_64):
    cfg = resolve_config(
        "tiny",
        ["train.learning_rate=1", "train.reference_batch_size=16", f"train.lr_scaling={rule}"],
    )
    assert peak_learning_rate(cfg, 8) == pytest.approx(at_8)
    assert peak_learning_rate(cfg, 64) == pytest.approx(at_64)


def test_the_default_rule_never_exceeds_the_presets_rate_on_100_gpus():
    # The seeds' unbounded linear rule gave gpt2-small 6e-4 x 3200 / 256 = 7.5e-3 on 100 GPUs.
    cfg = resolve_config("gpt2-small", ["train.global_batch_tokens=0", "train.train_steps=10"])
    assert plan_run(cfg, 100).peak_learning_rate == cfg.train.learning_rate == 6e-4


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["train.train_tokens=100", "train.train_steps=5"],
            "train.train_steps and train.train_tokens both set; give one of them",
        ),
        (
            ["train.warmup_tokens=100", "train.warmup_steps=5"],
            "train.warmup_steps and train.warmup_tokens both set",
        ),
        (["train.recompute=layers"], "train.recompute must be one of ('none', 'blocks')"),
        (["train.lr_scaling=sqrt"], "train.lr_scaling must be one of ('capped', 'linear', 'none')"),
        (["train.train_steps=0"], "the run has no length: set train.train_steps, train.train"),
        (["train.global_batch_tokens=-1"], "train.global_batch_tokens must be >= 0, got -1"),
    ],
)
def test_bad_run_descriptions_are_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_config("tiny", overrides)


def test_a_yaml_layer_in_steps_clears_its_presets_tokens(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("base: gpt2-small\ntrain:\n  train_steps: 100\n  warmup_steps: 10\n")
    t = resolve_config(str(path)).train
    assert (t.train_steps, t.train_tokens, t.warmup_steps, t.warmup_tokens) == (100, 0, 10, 0)


def test_token_counts_may_be_written_in_float_notation(tmp_path):
    assert resolve_config("gpt2-xl", ["train.train_tokens=30e9"]).train.train_tokens == 30 * 10**9
    path = tmp_path / "run.yaml"
    path.write_text("base: gpt2-xl\ntrain:\n  train_tokens: 30e9\n")  # a string to YAML
    assert resolve_config(str(path)).train.train_tokens == 30 * 10**9
    with pytest.raises(ConfigError, match="train.train_tokens='1.5e0' is not a valid int"):
        resolve_config("tiny", ["train.train_tokens=1.5e0"])
