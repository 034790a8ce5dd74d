"""Activation recomputation: a function whose activations the backward pass recomputes.

`recomputed(forward, x)` is `forward(x)`, but none of forward's intermediate tensors is kept
for the backward pass: the gradient runs `forward` again on the same input under a tape of its
own and differentiates that. Memory holds `x` (and the output) instead of every activation
inside `forward`, for one more forward pass of compute (train.recompute=blocks: each
transformer block, trainer/model.py's `Block`).

`tf.recompute_grad` does the same, but fails in three ways this avoids:
- in a `tf.function` (Keras' train step), `tf.custom_gradient` takes no keyword arguments, so
  `training=True` cannot be passed through; here `forward` is a closure over it;
- it differentiates with `unconnected_gradients=ZERO`: a variable that the recomputation does
  not reach (one created lazily inside it, say) gets a silent zero gradient; here it gets
  None, which Keras reports ("Gradients do not exist") and the tests check for;
- its guard against the recomputation being merged with the forward pass (identical ops on
  identical inputs, which grappler's and XLA's common-subexpression elimination would share,
  keeping every activation alive again) compares a boolean with itself, which a simplifier may
  fold to `true`; here the guard compares a float with itself, which it cannot (NaN).

Randomness inside `forward` (dropout) must be a function of its inputs and captured tensors
only (stateless ops with a seed drawn outside it), or the recomputation draws other masks than
the forward pass did and the gradient is wrong: trainer/model.py's `Block` does so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf
from tensorflow.python.eager import record  # tf.recompute_grad's own stop_recording


def after(x: tf.Tensor, dy: tf.Tensor) -> tf.Tensor:
    """x + 0, where the 0 is computed from one element of `dy`: the same values as x, but a
    tensor that exists only once `dy` does.

    The recomputation reads this instead of x, so it cannot run before the backward pass has
    reached it (XLA ignores control dependencies; a data dependency it must respect) and no
    optimizer can prove it equal to the forward pass's input and merge the two passes. `e == e`
    is false for NaN, so no simplifier folds it; a NaN `dy` makes the gradient NaN either way.
    """
    e = tf.cast(tf.reshape(dy, [-1])[:1], tf.float32)  # (1,) one element, not a reduction of dy
    zero = tf.reduce_sum(tf.where(tf.equal(e, e), tf.zeros_like(e), e))  # () 0., or NaN
    return x + tf.cast(zero, x.dtype)


def recomputed(forward: Callable[[tf.Tensor], tf.Tensor], x: tf.Tensor) -> tf.Tensor:
    """forward(x), with forward's activations recomputed in the backward pass, not kept.

    `forward` must read, not create, its variables (build its layers first: a variable created
    inside gets no gradient) and be deterministic given x (the module's docstring). Gradients
    flow to x and to every variable forward reads, as autodiff through forward(x) gives them.
    """

    @tf.custom_gradient
    def run(x: tf.Tensor) -> tuple[tf.Tensor, Any]:
        # No tape records forward's ops: in eager mode a tape keeps every tensor it records.
        # tf.custom_gradient still sees which variables forward reads (it passes them to grad).
        with record.stop_recording():
            y = forward(x)

        def grad(dy: tf.Tensor, variables: Sequence[tf.Variable] = ()) -> Any:
            return _gradients(forward, x, dy, list(variables))

        return y, grad

    return run(x)


def _gradients(
    forward: Callable[[tf.Tensor], tf.Tensor],
    x: tf.Tensor,
    dy: tf.Tensor,
    variables: list[tf.Variable],
) -> Any:
    """The gradients of forward at x for the output gradient dy: dx, or (dx, [dv, ...])."""
    with tf.GradientTape() as tape:
        x_again = after(x, dy)
        tape.watch(x_again)
        tape.watch(variables)
        y = forward(x_again)  # the recomputation
    grads = tape.gradient(y, [x_again, *variables], output_gradients=dy)
    if variables:
        return grads[0], grads[1:]
    return grads[0]
