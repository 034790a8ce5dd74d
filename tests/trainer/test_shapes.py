"""trainer/shapes.py: no tensor past TensorFlow's int32 bound, refused with its numbers."""

import pytest

from trainer import capacity, gpus, shapes
from trainer.config import ConfigError, resolve_config
from trainer.presets import PRESET_NAMES
from trainer.run_plan import plan_run


@pytest.mark.parametrize("preset", PRESET_NAMES)
@pytest.mark.parametrize("replicas", [1, 8])
def test_every_preset_is_within_the_bound(preset, replicas):
    plan_run(resolve_config(preset), replicas)


def test_the_largest_micro_batch_is_the_last_whose_largest_tensor_fits():
    cfg = resolve_config("tiny")  # seq_len 64, vocab 512: the logits, 32,768 a sequence
    assert shapes.largest_activation(cfg.model).name == "logits"
    limit = shapes.largest_micro_batch(cfg.model)
    assert limit * 64 * 512 <= shapes.MAX_ELEMENTS < (limit + 1) * 64 * 512
    plan_run(resolve_config("tiny", [f"train.batch_size={limit}"]), 1)
    with pytest.raises(ConfigError, match=f"use train.batch_size={limit} or less"):
        plan_run(resolve_config("tiny", [f"train.batch_size={limit + 1}"]), 1)


def test_a_batch_past_the_bound_names_the_tensor_its_numbers_and_the_fix():
    with pytest.raises(ConfigError) as refused:
        plan_run(resolve_config("tiny", ["train.batch_size=50000000"]), 2)
    assert str(refused.value) == (
        "config: train.batch_size=50000000, a micro-batch of 50,000,000 sequences: the logits "
        "tensor (batch x seq_len x vocab_size = 50,000,000 x 64 x 512) holds "
        "1,638,400,000,000 elements, past TensorFlow's int32 limit of 2,147,483,647; use "
        "train.batch_size=65535 or less (train.global_batch_tokens keeps a larger global "
        "batch, each replica accumulating micro-batches)"
    )


@pytest.mark.parametrize(
    "overrides, says",
    [
        (
            ["model.seq_len=32768", "model.n_head=4"],
            "one sequence: the attention scores tensor (batch x n_head x seq_len x seq_len = "
            "1 x 4 x 32,768 x 32,768) holds 4,294,967,296 elements, past TensorFlow's int32 "
            "limit of 2,147,483,647; lower model.seq_len or model.n_head",
        ),
        (
            ["model.vocab_size=4194304", "model.d_model=1024", "model.seq_len=8"],
            "the token embedding tensor (vocab_size x d_model = 4,194,304 x 1,024) holds "
            "4,294,967,296 elements",
        ),
        (  # a micro-batch that fits, but a replica's step of 2**25 windows of 65 ids does not
            ["train.global_batch_tokens=2147483648", "train.batch_size=8", "train.train_steps=1"],
            "each replica's input batch a step, 33,554,432 windows of seq_len+1 = 65 token ids, "
            "holds 2,181,038,080 elements",
        ),
    ],
)
def test_what_one_sequence_a_weight_or_a_step_cannot_hold_is_named(overrides, says):
    with pytest.raises(ConfigError, match="past TensorFlow's int32 limit") as refused:
        plan_run(resolve_config("tiny", ["train.warmup_steps=0", *overrides]), 1)
    assert says in str(refused.value)


def test_the_micro_batch_a_plan_chooses_stays_within_the_bound():
    """A GPU with room for more: the plan still picks no micro-batch the bound refuses."""
    cfg = resolve_config("gpt2-small", ["train.global_batch_tokens=1048576"])  # 1024 a replica
    huge = gpus.unknown_gpu("100TiB")
    plan = capacity.plan_capacity(cfg, 1, huge, choose_micro=True)
    assert plan.fits and plan.run.micro_batch <= shapes.largest_micro_batch(cfg.model) == 65
    assert 1024 % plan.run.micro_batch == 0
