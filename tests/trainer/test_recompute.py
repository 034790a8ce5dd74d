"""trainer.recompute, and the GPT's blocks with train.recompute=blocks: the same gradients as
plain autodiff (float32, mixed precision, XLA, dropout), the same checkpoints, and a backward
pass that really recomputes each block instead of reading its kept activations."""

import dataclasses
import re

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tests.tiny import keras_policy
from trainer import recompute
from trainer.config import ModelConfig
from trainer.model import Block, build_gpt

TINY = ModelConfig(vocab_size=64, seq_len=16, n_layer=2, n_head=2, d_model=16, d_ff=32)
IDS = tf.random.stateless_uniform((2, 8), (3, 4), 0, TINY.vocab_size, tf.int32)  # (B, T)


def _pair(cfg: ModelConfig = TINY) -> tuple[keras.Model, keras.Model]:
    """Two GPTs with the same weights: without and with recompute."""
    keras.utils.set_random_seed(0)
    plain, recomputing = build_gpt(cfg), build_gpt(cfg, recompute=True)
    recomputing.set_weights(plain.get_weights())
    return plain, recomputing


def _train_step(
    model: keras.Model, jit_compile: bool = False
) -> tf.types.experimental.PolymorphicFunction:
    """loss and gradients of a training forward pass, as one tf.function."""

    @tf.function(jit_compile=jit_compile)
    def step(ids: tf.Tensor) -> tuple[tf.Tensor, list[tf.Tensor]]:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(ids, training=True)))
        return loss, tape.gradient(loss, model.trainable_weights)

    return step


def _assert_same_gradients(expected: list, actual: list, rtol: float) -> None:
    """Every gradient exists and is within rtol of the largest entry of its expected value."""
    assert len(actual) == len(expected)
    for want, got in zip(expected, actual, strict=True):
        assert got is not None
        want, got = tf.convert_to_tensor(want), tf.convert_to_tensor(got)
        assert got.dtype == want.dtype == tf.float32  # of the float32 variables
        scale = float(tf.reduce_max(tf.abs(want)))
        assert scale > 0
        np.testing.assert_allclose(got, want, rtol=0, atol=rtol * scale)


def test_recomputed_runs_forward_again_in_the_backward_pass_with_the_same_gradients():
    v = tf.Variable([[0.5, -1.0], [2.0, 0.25]])
    calls = []

    def forward(x: tf.Tensor) -> tf.Tensor:
        calls.append(1)
        return tf.tanh(tf.matmul(x, v)) * x

    x = tf.constant([[1.0, 2.0], [-3.0, 0.5]])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = recompute.recomputed(forward, x)
        loss = tf.reduce_sum(y * y)
    assert len(calls) == 1
    dx, dv = tape.gradient(loss, [x, v])
    assert len(calls) == 2  # eager: the recomputation ran
    with tf.GradientTape() as tape:
        tape.watch(x)
        y_plain = forward(x)
        loss = tf.reduce_sum(y_plain * y_plain)
    want = tape.gradient(loss, [x, v])
    np.testing.assert_allclose(y, y_plain)
    np.testing.assert_allclose(dx, want[0], rtol=1e-6)
    np.testing.assert_allclose(dv, want[1], rtol=1e-6)


def test_after_is_x_but_depends_on_dy():
    x = tf.constant([1.0, -2.0], tf.bfloat16)
    np.testing.assert_array_equal(recompute.after(x, tf.constant([[3.0]])), x)
    assert np.isnan(recompute.after(x, tf.constant([np.nan, 1.0])).numpy().astype(float)).all()


@pytest.mark.slow
@pytest.mark.parametrize(
    "policy, jit_compile, rtol",
    [
        ("float32", False, 1e-5),
        ("float32", True, 1e-5),
        ("mixed_bfloat16", False, 2e-2),
        ("mixed_float16", False, 2e-3),
    ],
)
def test_gradients_with_recompute_equal_those_without(policy, jit_compile, rtol):
    """Same weights, same batch: the same loss and gradients for every weight (the float32
    variables' gradients, also under a mixed-precision policy); under XLA too."""
    with keras_policy(policy):
        plain, recomputing = _pair()
    want_loss, want = _train_step(plain, jit_compile)(IDS)
    loss, got = _train_step(recomputing, jit_compile)(IDS)
    np.testing.assert_allclose(loss, want_loss, rtol=rtol)
    _assert_same_gradients(want, got, rtol)


@pytest.mark.slow
def test_dropout_drops_the_same_units_when_recomputed(monkeypatch):
    """With dropout, the recomputation must draw the forward pass's masks: the gradients equal
    plain autodiff through the same seeded forward pass (recomputed() replaced by a plain call),
    the random state restarted from the same seed for each. Eager, where the global seed
    restarts the random ops' sequence. A stateful dropout inside the block would fail this."""
    plain, recomputing = _pair(dataclasses.replace(TINY, dropout=0.3))

    def loss_and_grads(model: keras.Model) -> tuple[tf.Tensor, list[tf.Tensor]]:
        tf.random.set_seed(5)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(IDS, training=True)))
        return loss, tape.gradient(loss, model.trainable_weights)

    loss, got = loss_and_grads(recomputing)
    no_dropout, _ = _train_step(plain)(IDS)
    assert abs(float(loss) - float(no_dropout)) > 1e-6 * float(no_dropout)  # it drops units
    with monkeypatch.context() as m:
        m.setattr(recompute, "recomputed", lambda forward, x: forward(x))
        want_loss, want = loss_and_grads(recomputing)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    _assert_same_gradients(want, got, 1e-5)


def _ancestors(tensors: list[tf.Tensor]) -> set[tf.Operation]:
    """The ops that compute `tensors`."""
    found: set[tf.Operation] = set()
    todo = [t.op for t in tensors]
    while todo:
        op = todo.pop()
        if op not in found:
            found.add(op)
            todo += [t.op for t in op.inputs] + list(op.control_inputs)
    return found


def _kept_block_activations(model: keras.Model) -> dict[str, int]:
    """Per block, how many float tensors its forward pass computes that the backward pass
    reads: the activations kept in memory from one pass to the other. The forward pass is
    what the loss depends on; the backward pass, what else the gradients do."""
    graph = _train_step(model).get_concrete_function(IDS).graph
    loss, *grads = graph.outputs
    forward = _ancestors([loss])
    backward = _ancestors(grads) - forward
    kept: dict[str, set[str]] = {}
    for op in backward:
        for t in op.inputs:
            block = re.match(r"gpt/(h_\d+)/", t.op.name)
            if t.op in forward and block and t.dtype.is_floating:
                kept.setdefault(block.group(1), set()).add(t.name)
    return {block: len(names) for block, names in sorted(kept.items())}


@pytest.mark.slow
def test_the_backward_pass_recomputes_each_block_instead_of_reading_its_activations():
    """Structural, in the traced train step (a silent no-op of recomputation fails both):
    - without recompute the backward pass reads a dozen and more of each block's forward
      activations (LayerNorm outputs, q/k/v, the softmax, GELU's input, ...); with recompute
      it reads one: the block's output, the next block's input (the last block's feeds ln_f);
    - with recompute, each block's two attention products run once more: 8 BatchMatMuls per
      block (2 forward, 2 recomputed, 4 for their gradients) against 6.
    The recomputation reads `recompute.after(x, dy)`, not x, so that no graph optimizer can
    merge it with the forward pass again (tested in test_after_is_x_but_depends_on_dy)."""
    plain, recomputing = _pair()
    kept_plain = _kept_block_activations(plain)
    kept = _kept_block_activations(recomputing)
    assert set(kept_plain) == set(kept) == {f"h_{i}" for i in range(TINY.n_layer)}
    assert all(n >= 12 for n in kept_plain.values()), kept_plain
    assert all(n == 1 for n in kept.values()), kept

    def batch_matmuls(model: keras.Model) -> int:
        graph = _train_step(model).get_concrete_function(IDS).graph
        return sum(op.type.startswith("BatchMatMul") for op in graph.get_operations())

    assert batch_matmuls(plain) == 6 * TINY.n_layer
    assert batch_matmuls(recomputing) == 8 * TINY.n_layer


@pytest.mark.parametrize("saved_with", [False, True])
def test_a_checkpoint_restores_across_recompute_settings(tmp_path, saved_with):
    """The same variables under the same names either way: a checkpoint written with one
    setting restores every variable into a model with the other."""
    keras.utils.set_random_seed(1)
    source = build_gpt(TINY, recompute=saved_with)
    keras.utils.set_random_seed(2)
    target = build_gpt(TINY, recompute=not saved_with)
    assert [w.name for w in source.weights] == [w.name for w in target.weights]
    assert not np.array_equal(source.weights[0].numpy(), target.weights[0].numpy())
    saved = tf.train.Checkpoint(model=source).write(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(model=target).read(saved).assert_consumed()
    for s, t in zip(source.weights, target.weights, strict=True):
        np.testing.assert_array_equal(s.numpy(), t.numpy())


def test_recompute_only_in_training_and_the_config_round_trips():
    """Inference (training None or False) runs the plain block: the same graph as without."""
    plain, recomputing = _pair()
    np.testing.assert_allclose(recomputing(IDS), plain(IDS), atol=1e-6)
    np.testing.assert_allclose(
        recomputing(IDS, training=True), plain(IDS, training=True), atol=1e-6
    )
    block = recomputing.get_layer("h_0")
    assert Block.from_config(block.get_config()).recompute is True
    assert plain.get_layer("h_0").recompute is False


def test_an_unbuilt_block_refuses_to_recompute():
    block = Block(16, 2, 32, recompute=True)
    with pytest.raises(ValueError, match="build the block"):
        block(tf.zeros((1, 4, 16)), training=True)
