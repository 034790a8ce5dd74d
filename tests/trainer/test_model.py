"""trainer.model: shapes, causality, window limit, layer configs, GELU, mixed precision."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tests.tiny import keras_policy
from trainer import precision
from trainer.config import ModelConfig
from trainer.model import (
    Block,
    CausalSelfAttention,
    ContextLimit,
    PositionEmbedding,
    TiedEmbedding,
    build_gpt,
    gelu,
    rotate,
    xla_gelu,
)

TINY = ModelConfig(vocab_size=64, seq_len=16, n_layer=2, n_head=2, d_model=16, d_ff=32)


@pytest.fixture(scope="module")
def gpt():
    keras.utils.set_random_seed(0)
    return build_gpt(TINY)


def test_output_shape_and_dtype(gpt):
    ids = tf.random.uniform((3, 10), maxval=TINY.vocab_size, dtype=tf.int32)
    logits = gpt(ids)
    assert logits.shape == (3, 10, TINY.vocab_size)
    assert logits.dtype == tf.float32


def test_output_projection_is_tied_to_token_embedding(gpt):
    names = [w.name for w in gpt.trainable_weights]
    assert sum("embeddings" in n for n in names) == 1
    assert not any("logits" in n for n in names)


def test_only_attention_runs_batched_matmuls(gpt):
    """Projections are 2-D MatMuls (trainer/model.py's docstring): in the train step's graph,
    forward and backward, every BatchMatMul is attention's, over (B, H, T, hd) operands. A
    (B, T, C) operand would be a projection broadcast into one, which measured slower."""
    ids = tf.random.uniform((2, 8), maxval=TINY.vocab_size, dtype=tf.int32)

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(gpt(ids, training=True)))
        return tape.gradient(loss, gpt.trainable_weights)

    graph = step.get_concrete_function(ids).graph
    ops = [op for op in graph.get_operations() if op.type.startswith("BatchMatMul")]
    # Per layer: scores and A.V forward, two products for each one's gradient.
    assert len(ops) == 6 * TINY.n_layer, [op.name for op in ops]
    ranks = {op.name: [x.shape.rank for x in op.inputs] for op in ops}
    assert all(r == [4, 4] for r in ranks.values()), ranks


@pytest.fixture(scope="module")
def rotary_gpt():
    keras.utils.set_random_seed(0)
    return build_gpt(dataclasses.replace(TINY, position="rotary"))


@pytest.mark.parametrize("model", ["gpt", "rotary_gpt"])
def test_causality_future_tokens_do_not_change_earlier_logits(model, request):
    gpt = request.getfixturevalue(model)
    ids = np.random.default_rng(0).integers(0, TINY.vocab_size, (1, 12)).astype("int32")
    changed = ids.copy()
    changed[0, 7:] = (changed[0, 7:] + 1) % TINY.vocab_size
    a, b = gpt(ids).numpy(), gpt(changed).numpy()
    np.testing.assert_allclose(a[0, :7], b[0, :7], atol=1e-5)
    assert not np.allclose(a[0, 7:], b[0, 7:])


@pytest.mark.parametrize(
    ("model", "limit"), [("gpt", "the position table"), ("rotary_gpt", "the context window")]
)
def test_window_longer_than_seq_len_is_an_error(model, limit, request):
    gpt = request.getfixturevalue(model)
    ids = tf.zeros((1, TINY.seq_len + 1), tf.int32)
    with pytest.raises(ValueError, match=f"longer than {limit}"):
        gpt(ids)  # a static T: refused when traced

    @tf.function(input_signature=[tf.TensorSpec((1, None), tf.int32)])
    def dynamic(ids):
        return gpt(ids)

    with pytest.raises(tf.errors.InvalidArgumentError, match=f"longer than {limit}"):
        dynamic(ids)  # a dynamic T: refused when run


def test_a_rotary_model_has_no_position_table(gpt, rotary_gpt):
    assert not any("wpe" in w.name for w in rotary_gpt.weights)
    assert rotary_gpt.count_params() == gpt.count_params() - TINY.seq_len * TINY.d_model
    # Without a table, the same token at two positions differs only through attention to
    # what precedes it: one token repeated has the same logits everywhere (the table's not).
    ids = np.full((1, 6), 5, "int32")
    for model, same in ((rotary_gpt, True), (gpt, False)):
        logits = model(ids).numpy()[0]
        assert np.allclose(logits, logits[:1], atol=1e-5) is same


def test_rotate_keeps_norms_and_makes_scores_depend_on_the_offset_only():
    rng = np.random.default_rng(1)
    q = tf.constant(rng.normal(size=(1, 1, 1, 8)), tf.float32)
    k = tf.constant(rng.normal(size=(1, 1, 1, 8)), tf.float32)

    def at(x: tf.Tensor, t: int) -> tf.Tensor:  # x rotated as at position t of 40
        return rotate(tf.tile(x, (1, 1, 40, 1)))[0, 0, t]

    np.testing.assert_allclose(at(q, 0), q[0, 0, 0], atol=1e-6)  # position 0: not turned
    # Position 5 by the definition: pair (i, i + 4) turned by 5 * 10000^(-2i/8)
    x, angle = q.numpy()[0, 0, 0], 5 * 10000.0 ** (-np.arange(0, 8, 2) / 8)
    x1, x2 = x[:4], x[4:]
    turned = np.concatenate(
        [x1 * np.cos(angle) - x2 * np.sin(angle), x1 * np.sin(angle) + x2 * np.cos(angle)]
    )
    np.testing.assert_allclose(at(q, 5), turned, atol=1e-5)
    np.testing.assert_allclose(tf.norm(at(q, 33)), tf.norm(q), rtol=1e-5)
    score = [float(tf.tensordot(at(q, tq), at(k, tq - 3), 1)) for tq in (3, 10, 39)]
    np.testing.assert_allclose(score, score[0], rtol=1e-4)
    assert abs(float(tf.tensordot(at(q, 10), at(k, 3), 1)) - score[0]) > 1e-3  # offset 7


def test_mixed_precision_logits_are_float32():
    with keras_policy("mixed_bfloat16"):
        logits = build_gpt(TINY)(tf.zeros((1, 4), tf.int32))
    assert logits.dtype == tf.float32


@pytest.mark.parametrize(
    "dtype, atol",
    # float32: the two forms of the same function. bfloat16: within the type's rounding of the
    # exact value (its spacing is 1/128 near 1, 1/32 near 6).
    [(tf.float32, 1e-6), (tf.bfloat16, 0.02)],
)
def test_gelu_is_tensorflows_exact_gelu(dtype, atol):
    x = tf.cast(tf.linspace(-6.0, 6.0, 2001), dtype)
    exact = tf.nn.gelu(tf.cast(x, tf.float64), approximate=False)
    np.testing.assert_allclose(tf.cast(gelu(x), tf.float64), exact, atol=atol)
    with tf.GradientTape() as tape:
        x32 = tf.Variable(tf.cast(x, tf.float32))
        y = gelu(x32)
    slope = tape.gradient(y, x32)
    with tf.GradientTape() as tape:
        x64 = tf.Variable(tf.cast(x, tf.float64))
        y = tf.nn.gelu(x64, approximate=False)
    np.testing.assert_allclose(slope, tape.gradient(y, x64), atol=1e-6)


@pytest.mark.parametrize(
    "dtype, atol, slope_atol",
    # float32: the same function, and its slope Phi(x) + x phi(x) against float64 autodiff.
    # bfloat16 and float16: one rounding of the float32 result (bfloat16's spacing is 1/32
    # near 6, float16's 1/256).
    [(tf.float32, 1e-6, 1e-6), (tf.bfloat16, 0.02, 0.01), (tf.float16, 0.004, 0.001)],
)
def test_xla_gelu_is_exact_gelu_with_its_exact_gradient(dtype, atol, slope_atol):
    x = tf.cast(tf.linspace(-6.0, 6.0, 2001), dtype)
    with tf.GradientTape() as tape:
        x64 = tf.Variable(tf.cast(x, tf.float64))
        exact = tf.nn.gelu(x64, approximate=False)
    exact_slope = tape.gradient(exact, x64)
    x_in = tf.Variable(x)
    with tf.GradientTape() as tape:
        y = xla_gelu(x_in)
        # A non-uniform upstream gradient, so that a backward pass ignoring dy would show.
        weighted = tf.reduce_sum(y * tf.cast(tf.linspace(0.5, 2.0, 2001), dtype))
    slope = tape.gradient(weighted, x_in)
    assert y.dtype == dtype and slope.dtype == dtype
    np.testing.assert_allclose(tf.cast(y, tf.float64), exact, atol=atol)
    expected_slope = exact_slope * tf.cast(tf.linspace(0.5, 2.0, 2001), tf.float64)
    np.testing.assert_allclose(tf.cast(slope, tf.float64), expected_slope, atol=slope_atol * 2)


def _compiled_functions(fn: tf.types.experimental.ConcreteFunction) -> set[str]:
    """The functions in `fn`'s graph that XLA must compile, without their numeric suffix."""
    library = fn.graph.as_graph_def().library.function
    return {f.signature.name.rsplit("_", 1)[0] for f in library if f.attr["_XlaMustCompile"].b}


@pytest.mark.slow
def test_xla_gelu_only_in_training_with_the_same_math():
    """build_gpt(xla_kernels=True) trains through xla_gelu's compiled forward and backward
    and infers through plain `gelu`; with the same weights, logits and gradients match the
    plain model's."""
    keras.utils.set_random_seed(1)
    fused = build_gpt(TINY, xla_kernels=True)
    plain = build_gpt(TINY)
    plain.set_weights(fused.get_weights())
    ids = tf.random.stateless_uniform((2, 12), (7, 8), 0, TINY.vocab_size, tf.int32)

    def loss_and_grads(model: keras.Model, training: bool):
        @tf.function
        def step(ids):
            with tf.GradientTape() as tape:
                logits = model(ids, training=training)
                loss = tf.reduce_mean(tf.square(logits))
            return logits, tape.gradient(loss, model.trainable_weights)

        return step, step(ids)

    train_step, (logits, grads) = loss_and_grads(fused, training=True)
    infer_step, _ = loss_and_grads(fused, training=False)
    _, (plain_logits, plain_grads) = loss_and_grads(plain, training=True)
    trained = _compiled_functions(train_step.get_concrete_function(ids))
    assert trained == {"__inference__xla_gelu_forward", "__inference__xla_gelu_backward"}
    assert not _compiled_functions(infer_step.get_concrete_function(ids))
    np.testing.assert_allclose(logits, plain_logits, atol=1e-5)
    for g, p in zip(grads, plain_grads, strict=True):
        np.testing.assert_allclose(tf.convert_to_tensor(g), tf.convert_to_tensor(p), atol=1e-6)


def _attention(
    policy: str, weights: list[np.ndarray] | None = None, rotary: bool = False
) -> CausalSelfAttention:
    """A (d_model 16, 2 heads) attention layer built under `policy`, with `weights` if given."""
    with keras_policy(policy):
        layer = CausalSelfAttention(16, 2, rotary=rotary)
        layer(tf.zeros((1, 4, 16)))
    if weights is not None:
        layer.set_weights(weights)
    return layer


@pytest.mark.parametrize(
    "policy, qkv_std, rotary",
    [
        ("mixed_bfloat16", 0.5, False),  # scores' std 3: a peaked softmax, where rounding shows
        ("mixed_bfloat16", 0.5, True),  # the rotation's cos and sin in bfloat16 too
        ("mixed_float16", 0.5, False),
        ("mixed_float16", 8.0, False),  # scores in the thousands: a masked one overflows float16
    ],
)
def test_mixed_precision_attention_is_near_float32(policy, qkv_std, rotary):
    """Scores and softmax run in the compute dtype under mixed precision: the output stays
    within 3% of the largest of causal attention computed in float64 here (1% measured in
    bfloat16, whose ulp is 0.8%; the float32 layer within 1e-5), outputs and gradients have no
    NaN or inf, and causality is exact."""
    x = tf.random.stateless_normal((2, 12, 16), (5, 6))
    rng = np.random.default_rng(0)
    reference = _attention("float32", rotary=rotary)
    weights = [
        rng.normal(0.0, qkv_std, w.shape).astype("float32") if w.shape == (16, 48) else w
        for w in reference.get_weights()
    ]
    reference.set_weights(weights)
    mixed = _attention(policy, weights, rotary)
    inputs = tf.Variable(x)
    with tf.GradientTape() as tape:
        out = tf.cast(mixed(inputs), tf.float32)
        total = tf.reduce_sum(out)
    grads = tape.gradient(total, [inputs, *mixed.trainable_weights])
    expected = _causal_attention_float64(x.numpy(), weights, n_head=2, rotary=rotary)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(reference(x).numpy(), expected, atol=1e-5 * scale)
    np.testing.assert_allclose(out.numpy(), expected, atol=0.03 * scale)
    assert all(bool(tf.reduce_all(tf.math.is_finite(tf.cast(g, tf.float32)))) for g in grads)
    changed = x.numpy().copy()
    changed[:, 7:] += 1.0
    np.testing.assert_array_equal(
        tf.cast(mixed(changed), tf.float32).numpy()[:, :7], out.numpy()[:, :7]
    )


def _causal_attention_float64(
    x: np.ndarray, weights: list[np.ndarray], n_head: int, rotary: bool = False
) -> np.ndarray:
    """GPT-2's causal self-attention written out in numpy float64: the test's own reference;
    `rotary`: q and k turned first, pair (i, i + hd/2) at position t by t * 10000^(-2i/hd)."""
    qkv_kernel, qkv_bias, proj_kernel, proj_bias = (w.astype("float64") for w in weights)
    b, t, c = x.shape
    hd = c // n_head
    qkv = (x.astype("float64") @ qkv_kernel + qkv_bias).reshape(b, t, 3, n_head, hd)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))  # (B, H, T, hd)
    if rotary:
        angle = np.arange(t)[:, None] * 10000.0 ** (-np.arange(0, hd, 2) / hd)  # (T, hd/2)
        cos, sin = np.cos(angle), np.sin(angle)
        q, k = (
            np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
            for a, b in (np.split(q, 2, axis=-1), np.split(k, 2, axis=-1))
        )
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
    scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    y = (p / p.sum(-1, keepdims=True)) @ v  # (B, H, T, hd)
    return y.transpose(0, 2, 1, 3).reshape(b, t, c) @ proj_kernel + proj_bias


def test_bfloat16_softmax_and_sums_accumulate_in_float32():
    """What CausalSelfAttention's bfloat16 softmax relies on: where the trainer's `auto` trains
    in bfloat16 (a CPU with bfloat16 instructions), TensorFlow's bfloat16 softmax and reduce_sum
    over a 256-long row are within one bfloat16 ulp (2**-7 relative) of float64's on the same
    inputs; accumulating in bfloat16 itself would be off by several. Where the CPU lacks them,
    TensorFlow emulates bfloat16 and its softmax rounds intermediate values
    (trainer/precision.py's EMULATED_BF16)."""
    x = tf.cast(tf.random.stateless_uniform((512, 256), (3, 4), -4.0, 4.0), tf.bfloat16)
    wide = tf.cast(x, tf.float64)

    def error(ours: tf.Tensor, exact: tf.Tensor) -> float:
        return float(tf.reduce_max(tf.abs(tf.cast(ours, tf.float64) - exact) / exact))

    assert error(tf.reduce_sum(tf.abs(x), axis=-1), tf.reduce_sum(tf.abs(wide), axis=-1)) <= 2**-7
    softmax = error(tf.nn.softmax(x, axis=-1), tf.nn.softmax(wide, axis=-1))
    # Without the instructions `auto` picks float32 (tests/trainer/test_config.py) and an explicit
    # mixed_bfloat16 is warned about (tests/trainer/test_precision.py): a looser bound here.
    assert softmax <= (2.0**-7 if precision.cpu_has_bf16() else 2.0**-4)


@pytest.mark.parametrize(
    "layer",
    [
        TiedEmbedding(64, 16, 0.01),
        PositionEmbedding(16, 8),
        ContextLimit(16),
        CausalSelfAttention(16, 4, 0.1),
        CausalSelfAttention(16, 4, rotary=True),
        Block(16, 2, 32, rotary=True),
        Block(16, 2, 32, 0.1, 1e-6, 0.02, 0.01),
        Block(16, 2, 32, use_xla_gelu=True),
    ],
)
def test_layers_round_trip_get_config(layer):
    clone = type(layer).from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
