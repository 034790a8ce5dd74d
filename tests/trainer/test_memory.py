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


def test_the_backward_holds_the_matmuls_weights_as_read():
    c, f, v, layers = SMALL.d_model, SMALL.d_ff, SMALL.vocab_size, SMALL.n_layer
    kernels = layers * (3 * c * c + c * c + c * f + f * c)
    assert memory.matmul_weights(SMALL) == v * c + kernels < matmul_params(SMALL)
    # mixed: the compute-dtype casts, decayed or not
    for decay in (True, False):
        est = memory.estimate(SMALL, 4, "mixed_bfloat16", weight_decay=decay)
        assert est.weight_copies == 2 * (v * c + kernels)
    # float32: the embedding's copy-on-read, and the kernels' copies the weight decay makes
    assert memory.estimate(SMALL, 4, "float32").weight_copies == 4 * (v * c + kernels)
    assert memory.estimate(SMALL, 4, "float32", weight_decay=False).weight_copies == 4 * v * c


def test_accumulating_adds_float32_gradient_sums_while_the_micro_batches_run():
    n = memory.parameter_count(SMALL)
    one, more = memory.estimate(SMALL, 4), memory.estimate(SMALL, 4, accumulation=3)
    assert (one.gradient_sums, more.gradient_sums) == (0, 4 * n)
    assert more.total - one.total == 4 * n  # the micro-batches' pass is the peak here
    assert more.total_with(True) - one.total_with(True) == 4 * n
    assert more.to_dict()["gradient_sums"] == 4 * n


def test_the_head_holds_the_first_gradients_of_the_backward_pass():
    b, t, c, v = 3, SMALL.seq_len, SMALL.d_model, SMALL.vocab_size
    nc, nv = b * t * c, b * t * v
    # final LayerNorm (input, inv, output), logits, dx of the output projection and three
    # float32 gradients of the LayerNorm's backward pass
    assert memory.head_bytes(SMALL, b, 4) == 4 * (3 * nc + nv + nc + 3 * nc)
    assert memory.head_bytes(SMALL, b, 2) == 8 * nc + 2 * nc + 4 * nv + 2 * nv + 2 * nc + 12 * nc


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
