"""`gptpipe plan`: the run's shape, memory per GPU and time, and its one-line refusals."""

import json

import pytest

from contracts.errors import UserError
from pipelines.cli import plan
from tests.pipelines.cli.commands import output, run

XL_100_H200 = ["plan", "--config", "gpt2-xl", "--gpus", "100", "--gpu", "h200"]


def test_a_global_batch_the_gpus_do_not_divide_is_refused_with_the_nearest():
    with pytest.raises(UserError, match=r"1,048,576 does not split into 100 .* e.g. 1,024,000"):
        run(plan.add_parser, [*XL_100_H200, "--train-tokens", "30e9"])


def test_gpt2_xl_on_100_h200s_plans_at_the_nearest_batch(capsys):
    argv = [*XL_100_H200, "--train-tokens", "30e9", "--set", "train.global_batch_tokens=1024000"]
    data = json.loads(output(capsys, plan.add_parser, [*argv, "--json"]))
    assert (data["micro_batch"], data["accumulation_steps"]) == (10, 1)
    assert data["peak_learning_rate"] == pytest.approx(2e-4 * 1000 / 1024)
    assert data["steps"] == 29297 and data["fits"]
    assert 0 < data["memory_per_gpu_bytes"] <= data["usable_memory_bytes"]
    assert data["memory_with_recompute_bytes"] < data["memory_without_recompute_bytes"]
    assert data["gpu_hours"] > 0 and data["mfu"] == 0.4
    text = output(capsys, plan.add_parser, argv)
    for term in ("weights", "gradients", "optimizer state", "activations", "recompute=blocks"):
        assert term in text
    assert "set train.batch_size=10" in text


@pytest.mark.bad_input("gpt2-xl asked for on 16 GB GPUs")
def test_a_run_that_cannot_fit_is_refused_in_one_line(capsys):
    argv = ["plan", "--config", "gpt2-xl", "--gpus", "8", "--gpu-memory", "16GB"]
    with pytest.raises(UserError, match="more GPUs do not help") as err:
        run(plan.add_parser, argv)
    assert "\n" not in str(err.value)
    assert "does not fit" in capsys.readouterr().out  # the plan is still printed


@pytest.mark.bad_input("a GPU type gptpipe plan does not know")
def test_an_unknown_gpu_is_refused_listing_the_known():
    with pytest.raises(UserError, match="h200, h100, .* t4"):
        run(plan.add_parser, ["plan", "--config", "tiny", "--gpus", "1", "--gpu", "rtx9090"])


def test_the_command_is_registered():
    from pipelines.cli.main import main

    assert main(["plan", "--config", "tiny", "--gpus", "2", "--gpu", "t4", "--json"]) == 0
    assert main([*XL_100_H200]) == 2  # the one-line error, not a traceback
