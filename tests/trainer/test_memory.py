"""trainer/memory.py: the bytes one replica holds, term by term."""

import dataclasses

import pytest

from trainer import memory
from trainer.config import ModelConfig
from trainer.flops import matmul_params

SMALL = ModelConfig(vocab_size=100, seq_len=8, n_layer=2, n_head=2, d_model=16, d_ff=64)


@pytest.mark.slow
@pytest.mark.parametrize("position", ["learned", "rotary"])
def test_the_parameter_count_is_the_models(position):
    from trainer.model import build_gpt

    m = dataclasses.replace(SMALL, position=position)
    assert memory.parameter_count(m) == build_gpt(m).count_params()


def test_state_is_float32_weights_gradients_and_adamw_slots_under_any_policy():
    n = memory.parameter_count(SMALL)
    for policy in ("float32", "mixed_bfloat16", "mixed_float16"):
        est = memory.estimate(SMALL, 4, policy)
        assert (est.weights, est.gradients, est.optimizer_state) == (4 * n, 4 * n, 8 * n)
    assert memory.estimate(SMALL, 4, "float32").weight_copies == 0
    assert memory.estimate(SMALL, 4, "mixed_bfloat16").weight_copies == 2 * matmul_params(SMALL)


def test_a_block_keeps_what_the_models_ops_read_in_their_gradients():
    b, t, c, f, h = 3, SMALL.seq_len, SMALL.d_model, SMALL.d_ff, SMALL.n_head
    nc, nf, scores = b * t * c, b * t * f, b * h * t * t
    # float32: two layer norms (input, inv, output), q k v buffer + scaled q + heads' output,
    # the softmax output, GELU's input and output
    assert memory.block_bytes(SMALL, b, 4) == 4 * (6 * nc + 5 * nc + scores + 2 * nf)
    # bfloat16 compute: the layer norms still keep two float32 tensors each
    kept = 2 * 8 * nc + 2 * 2 * nc + 2 * (5 * nc + scores + 2 * nf)
    assert memory.block_bytes(SMALL, b, 2) == kept
    rotary = dataclasses.replace(SMALL, position="rotary")
    assert memory.block_bytes(rotary, b, 4) - memory.block_bytes(SMALL, b, 4) == 4 * 3 * nc
    dropped = dataclasses.replace(SMALL, dropout=0.1)
    assert memory.block_bytes(dropped, b, 4) - memory.block_bytes(SMALL, b, 4) == (
        scores * 5 + 2 * nc
    )
    assert (
        memory.block_bytes(SMALL, b, 4, xla_gelu=False) - memory.block_bytes(SMALL, b, 4)
        == 4 * 2 * nf
    )


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_activations_grow_with_the_batch_and_the_window(policy):
    sizes = [memory.estimate(SMALL, b, policy).activations for b in (1, 2, 4, 8)]
    assert sizes == sorted(sizes) and len(set(sizes)) == 4
    assert sizes[3] == 8 * sizes[0]  # linear in the batch
    windows = [
        memory.estimate(dataclasses.replace(SMALL, seq_len=t), 2, policy).activations
        for t in (8, 16, 32, 64)
    ]
    assert windows == sorted(windows) and windows[3] > 8 * windows[0]  # the T^2 scores


def test_recomputation_keeps_less_and_the_run_uses_its_mode():
    m = dataclasses.replace(SMALL, n_layer=12)
    plain = memory.estimate(m, 8)
    again = memory.estimate(m, 8, recompute=True)
    assert again.activations_recomputed < plain.activations
    assert (plain.used_activations, again.used_activations) == (
        plain.activations,
        again.activations_recomputed,
    )
    assert again.total < plain.total == plain.total_with(False)
    assert again.total == plain.total_with(True)
