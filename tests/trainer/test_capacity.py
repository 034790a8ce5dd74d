"""trainer/capacity.py: the micro-batch that fits, the refusals, the plan's figures."""

import dataclasses

import pytest

from trainer import capacity, gpus, memory
from trainer.capacity import PlanRefused
from trainer.config import ConfigError, resolve_config
from trainer.run_plan import plan_run

XL = resolve_config("gpt2-xl", ["train.global_batch_tokens=1024000"])


def test_the_largest_micro_batch_fits_and_the_next_divisor_does_not():
    h100 = gpus.gpu("h100")
    plan = capacity.plan_capacity(XL, 100, h100, choose_micro=True)
    share = 10  # 1,024,000 tokens / (1024 x 100)
    micro = plan.largest_micro_batch
    assert 0 < micro < share and share % micro == 0
    bigger = min(d for d in range(micro + 1, share + 1) if share % d == 0)
    assert _total(micro, plan.policy) <= plan.usable_bytes < _total(bigger, plan.policy)
    assert plan.run.micro_batch * plan.run.accumulation == share and plan.fits


def _total(micro: int, policy: str) -> int:
    at = capacity.with_micro_batch(XL, micro)
    return capacity.estimate(at, plan_run(at, 100), policy, False).total


def test_a_plan_that_accumulates_counts_the_gradient_sums():
    plan = capacity.plan_capacity(capacity.with_micro_batch(XL, 2), 100, gpus.gpu("h200"))
    assert plan.run.accumulation == 5
    n = memory.parameter_count(XL.model)
    assert plan.memory.gradient_sums == 4 * n
    whole = capacity.plan_capacity(capacity.with_micro_batch(XL, 10), 100, gpus.gpu("h200"))
    assert whole.run.accumulation == 1 and whole.memory.gradient_sums == 0


def test_the_plan_has_the_runs_learning_rate_steps_and_time():
    plan = capacity.plan_capacity(XL, 100, gpus.gpu("h200"), mfu=0.5, choose_micro=True)
    assert plan.policy == "mixed_bfloat16"
    assert plan.run.peak_learning_rate == pytest.approx(2e-4 * 1000 / 1024)  # capped scaling
    assert plan.run.steps == -(-30_000_000_000 // 1_024_000)
    hours = plan.gpu_hours
    assert hours is not None and plan.tokens_per_second is not None
    assert plan.tokens_per_second == pytest.approx(0.5 * 989e12 * 100 / 9.6e9, rel=0.1)
    data = plan.to_dict()
    for key in ("peak_learning_rate", "micro_batch", "accumulation_steps", "memory_per_gpu_bytes"):
        assert key in data
    assert data["memory_per_gpu_bytes"] == plan.memory.total


def test_a_micro_batch_that_does_not_fit_is_refused_naming_the_fix():
    cfg = resolve_config("gpt2-small", ["train.batch_size=32"])
    plan = capacity.plan_capacity(cfg, 8, gpus.gpu("l4"))
    assert not plan.fits
    with pytest.raises(PlanRefused, match=r"micro-batch 32 needs .* L4 .*train.batch_size="):
        capacity.check_fits(plan)


def test_a_model_whose_state_alone_overflows_is_refused_whatever_the_batch():
    plan = capacity.plan_capacity(capacity.with_micro_batch(XL, 5), 100, gpus.gpu("t4"))
    with pytest.raises(PlanRefused, match="AdamW state alone .*more GPUs do not help") as err:
        capacity.check_fits(plan)
    assert "\n" not in str(err.value)


def test_recomputation_is_named_when_it_would_fit():
    # Micro-batches of 5 accumulate twice: with their gradient sums nothing fits, but
    # recomputing the blocks fits 10, which needs no sums.
    plan = capacity.plan_capacity(capacity.with_micro_batch(XL, 5), 100, gpus.gpu("a100-40gb"))
    assert (plan.largest_micro_batch, plan.policy) == (0, "mixed_bfloat16")
    assert plan.recompute_micro_batch > 0
    with pytest.raises(PlanRefused, match="set train.recompute=blocks, or use GPUs"):
        capacity.check_fits(plan)
    blocks = dataclasses.replace(XL, train=dataclasses.replace(XL.train, recompute="blocks"))
    fixed = capacity.with_micro_batch(blocks, 5)
    capacity.check_fits(capacity.plan_capacity(fixed, 100, gpus.gpu("a100-40gb")))


def test_replicas_that_do_not_divide_the_global_batch_are_refused_with_the_nearest():
    # At the config's own micro-batch (the train step's check), named as the trainer would.
    with pytest.raises(ConfigError, match="micro-batch 4 .* nearest: 819,200 or 1,228,800"):
        capacity.plan_capacity(resolve_config("gpt2-xl"), 100, gpus.gpu("h200"))
    # Choosing the micro-batch (`gptpipe plan`): the batch must split into the replicas.
    with pytest.raises(ConfigError, match="multiple of 102,400, e.g. 1,024,000 or 1,126,400"):
        capacity.plan_capacity(resolve_config("gpt2-xl"), 100, gpus.gpu("h200"), choose_micro=True)
    with pytest.raises(Exception, match="--mfu"):
        capacity.plan_capacity(XL, 100, gpus.gpu("h200"), mfu=0)


# ---- a local run's CPU workers, in one machine's memory --------------------------------------

GIB = 1 << 30


def test_local_workers_that_fit_the_machine_pass_and_the_sum_over_workers_counts():
    cfg = resolve_config("tiny", ["train.batch_size=1024"])
    one = capacity.estimate(cfg, plan_run(cfg, 1), "mixed_bfloat16", False).total
    capacity.check_fits_host(cfg, 1, one)  # auto on a CPU: the smaller, bfloat16, estimate
    capacity.check_fits_host(cfg, 2, 2 * one)
    with pytest.raises(PlanRefused, match="each of its 2 workers needs about"):
        capacity.check_fits_host(cfg, 2, 2 * one - 1)


def test_a_micro_batch_past_the_machines_memory_names_fixes_that_fit():
    cfg = resolve_config("tiny", ["train.batch_size=4096"])
    with pytest.raises(PlanRefused) as refused:
        capacity.check_fits_host(cfg, 2, GIB)
    message = str(refused.value)
    assert message.startswith(
        "train.batch_size=4096 on this machine: each of its 2 workers needs about 6.2 GiB "
        "(the model, AdamW's state and a micro-batch of 4,096 sequences' activations: "
        "trainer/memory.py), 12.4 GiB in all, more than its 1.0 GiB of memory: set "
        "train.batch_size="
    )
    fixes = message.split("of memory: ")[1].split(", or ")
    assert fixes == [
        "set train.batch_size=256 and train.global_batch_tokens=524288",  # 4096 x 2 x 64
        "set train.recompute=blocks, train.batch_size=512 and train.global_batch_tokens=524288",
    ]
    for fix in fixes:  # each fits, and keeps the global batch
        settings = fix.removeprefix("set ").replace(" and ", ", ").split(", ")
        capacity.check_fits_host(resolve_config("tiny", settings), 2, GIB)


def test_fewer_workers_are_named_where_fewer_fit():
    cfg = resolve_config("tiny", ["train.batch_size=512"])
    one = capacity.estimate(cfg, plan_run(cfg, 1), "mixed_bfloat16", False).total
    with pytest.raises(PlanRefused, match=r", or use 2 workers$"):
        capacity.check_fits_host(cfg, 4, 2 * one + 1)


def test_a_model_whose_state_alone_is_past_the_machine_names_no_batch():
    with pytest.raises(PlanRefused, match="AdamW state alone take .* a worker; train a smaller"):
        capacity.check_fits_host(resolve_config("gpt2-small"), 1, 512 << 20)
