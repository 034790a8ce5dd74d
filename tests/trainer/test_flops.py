"""trainer/flops.py: the FLOP count MFU is made of (the trainer's telemetry and the benchmarks
use the same), the accelerator peaks, and the list of the matmuls one training step runs, held
against the matmuls TensorFlow really puts in the trainer model's gradient graph."""

import pytest
import tensorflow as tf

from trainer import flops
from trainer.config import ModelConfig, resolve_config
from trainer.flops import Matmul
from trainer.model import build_gpt

SHAPES = [
    dict(vocab_size=10, seq_len=8, n_layer=2, n_head=2, d_model=4, d_ff=16),
    dict(vocab_size=37, seq_len=5, n_layer=1, n_head=3, d_model=6, d_ff=7),
]


@pytest.mark.parametrize("shape", SHAPES)
def test_matmul_params_are_the_models_parameters_but_the_position_table(shape):
    cfg = ModelConfig(**shape)
    position_table = cfg.seq_len * cfg.d_model
    assert flops.matmul_params(cfg) == build_gpt(cfg).count_params() - position_table


def test_flops_per_token_is_six_n_plus_the_causal_attention_term():
    cfg = resolve_config("tiny").model
    expected = 6 * flops.matmul_params(cfg) + 6 * cfg.n_layer * cfg.seq_len * cfg.d_model
    assert flops.flops_per_token(cfg) == expected
    assert flops.square_matmul_flops(2048) == 2 * 2048**3
    assert flops.mfu(1000.0, 10**6, 2e9) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H200", 989e12),
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),  # not the SXM part's 989
        ("NVIDIA H200 NVL", 835e12),
        ("NVIDIA GH200 480GB", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA L40S", 362e12),
        ("NVIDIA L40", None),  # not an L4
        ("Tesla T4", 65e12),
        ("NVIDIA GeForce GTX 1080", None),
        ("CPU", None),
    ],
)
def test_peak_is_looked_up_by_the_words_of_the_device_name(name, peak):
    assert flops.peak_flops(name) == peak


def test_a_matmuls_flops_follow_its_transposes_and_batch():
    assert Matmul((2, 3), (3, 5)).output() == ((2, 5), 3)
    assert Matmul((3, 2), (5, 3), transpose_a=True, transpose_b=True).output() == ((2, 5), 3)
    assert Matmul((4, 2, 3), (5, 3), transpose_b=True).flops == 2 * 4 * 2 * 5 * 3
    assert Matmul((4, 3, 2), (4, 3, 6), transpose_a=True).output() == ((4, 2, 6), 3)


_MATMUL_OPS = {
    "MatMul": ("transpose_a", "transpose_b"),
    "BatchMatMul": ("adj_x", "adj_y"),
    "BatchMatMulV2": ("adj_x", "adj_y"),
    "BatchMatMulV3": ("adj_x", "adj_y"),
}


def _traced_matmuls(cfg: ModelConfig, batch: int) -> list[Matmul]:
    """The matmuls of the trainer model's forward pass and gradient, as TensorFlow traces them
    (its registered gradients: tensorflow/python/ops/math_grad.py)."""
    gpt = build_gpt(cfg)
    spec = tf.TensorSpec((batch, cfg.seq_len), tf.int32)

    @tf.function(input_signature=[spec, spec])
    def step(ids, targets):
        with tf.GradientTape() as tape:
            logits = gpt(ids, training=True)
            loss = tf.nn.sparse_softmax_cross_entropy_with_logits(targets, logits)
            loss = tf.reduce_mean(loss)
        return tape.gradient(loss, gpt.trainable_variables)

    found = []
    for op in step.get_concrete_function().graph.get_operations():
        if op.type in _MATMUL_OPS:
            a, b = (tuple(t.shape.as_list()) for t in op.inputs[:2])
            flags = (bool(op.get_attr(name)) for name in _MATMUL_OPS[op.type])
            found.append(Matmul(a, b, *flags))
    return found


@pytest.mark.parametrize(
    "shape",
    [
        dict(vocab_size=64, seq_len=16, n_layer=2, n_head=4, d_model=32, d_ff=128),
        dict(vocab_size=37, seq_len=8, n_layer=1, n_head=3, d_model=24, d_ff=40),
    ],
)
def test_step_matmuls_are_the_matmuls_the_trainers_step_runs(shape):
    cfg = ModelConfig(**shape, dropout=0.0)
    listed = flops.step_matmuls(cfg, batch_size=3)
    assert sorted(_traced_matmuls(cfg, batch=3)) == sorted(listed)
    # Their FLOPs: 6 per weight of a matmul per token, and attention's over the whole T x T.
    tokens = 3 * cfg.seq_len
    weights = cfg.n_layer * (4 * cfg.d_model**2 + 2 * cfg.d_model * cfg.d_ff)
    weights += cfg.vocab_size * cfg.d_model
    full_attention = 12 * cfg.n_layer * cfg.seq_len * cfg.d_model
    assert sum(m.flops for m in listed) == tokens * (6 * weights + full_attention)
