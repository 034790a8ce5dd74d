"""The training step, measuring itself on the device: gradient norm, input wait, all-reduce time.

`InstrumentedGPT` is the GPT (the same layers, so checkpoints and the export do not change) with
Keras' default `train_step` spelled out: forward, gradients, the cross-replica gradient sum,
the optimizer update, and the loss metric, in the same order with the same ops, so the loss
curve is the same. Around them it records into `StepStats`, variables that live next to the
step and are only read at logging steps, so measuring adds no host sync to a step:

- `grad_norm`: the global norm of the summed gradients the optimizer is about to clip
  (`global_clipnorm` clips by this same norm; grappler computes it once);
- `input_wait_s`: how long the step waited for its batch. A timestamp with no inputs runs as the
  step function starts, while `next(iterator)` may still be waiting; one that depends on the
  batch runs when it arrives (tf.timestamp, the executor's clock);
- `allreduce_s`: from the moment every local gradient exists to the moment their cross-worker
  sum does: the part of the all-reduce not hidden behind the backward pass, plus waiting for the
  slowest worker. Meaningful where collectives finish in the op (CPU, the RING over gRPC); on a
  GPU, NCCL ops complete when enqueued, so the trainer does not report it there.

With gradient accumulation (`accumulation` k > 1, trainer/run_plan.py), the step's batch of
k x b sequences per replica is k micro-batches of b: a `tf.while_loop` of one iteration at a
time computes each one's gradients and adds them to float32 sums, so only one micro-batch's
activations are alive at once, and nothing in the loop talks to another replica. The sums over
k are the gradient of the mean loss over the whole batch. Then, as without accumulation: one
all-reduce, the norm, one `apply_gradients`. A Keras step is a whole optimizer step, so a
checkpoint or a backup (BackupAndRestore, preemption) always falls between optimizer steps and
a restart resumes at one, never mid-accumulation.

Under XLA (`jit_compile`) the step is one compiled cluster without a timestamp op, so only the
gradient norm is recorded; on a GPU too (`times_steps`): a timestamp, a host op, that depends
on tensors on the GPU waits for the stream to reach them, a device-to-host sync in every step
that would keep the host from queueing the next step while the GPU runs this one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import tensorflow as tf
import tf_keras as keras


@dataclass(frozen=True)
class StepStats:
    """What the step records; per replica, read from the first local one (no collective).

    A plain dataclass, not a tuple: Keras tracks variables held in attributes that are tuples,
    lists or dicts, and these must stay out of the model's weights and checkpoints.
    """

    grad_norm: tf.Variable  # the last step's global gradient norm, before clipping
    input_wait_s: tf.Variable  # cumulative seconds the steps waited for their batch
    allreduce_s: tf.Variable  # cumulative seconds in the gradient all-reduce

    @classmethod
    def create(cls) -> StepStats:
        """Make the variables; call under the strategy's scope."""

        def variable(name: str, dtype: tf.DType) -> tf.Variable:
            # ON_READ: each replica writes its own copy without communication; read outside
            # a replica, ONLY_FIRST_REPLICA returns this worker's first copy, also without one.
            return tf.Variable(
                tf.zeros([], dtype),
                trainable=False,
                name=name,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )

        return cls(
            variable("grad_norm", tf.float32),
            variable("input_wait_s", tf.float64),
            variable("allreduce_s", tf.float64),
        )

    def read(self) -> dict[str, float]:
        """The current values, as Python floats (a host sync: call it at logging steps only)."""
        return {f.name: float(getattr(self, f.name).numpy()) for f in dataclasses.fields(self)}


class InstrumentedGPT(keras.Model):
    """The GPT's functional graph with a training step that records `StepStats`.

    Built from a model of `trainer.model.build_gpt` (`InstrumentedGPT(gpt.inputs, gpt.outputs)`),
    it shares its layers and weights, so a checkpoint of either restores into the other.
    `timed`: whether it records timestamps (`times_steps`); `accumulation`: the micro-batches
    each step's batch holds (RunPlan.accumulation), whose gradients it sums before the update.
    """

    def __init__(
        self, inputs: Any, outputs: Any, timed: bool = True, accumulation: int = 1, **kwargs: Any
    ) -> None:
        super().__init__(inputs, outputs, **kwargs)
        if accumulation < 1:
            raise ValueError(f"accumulation must be at least 1, got {accumulation}")
        self.timed = timed
        self.accumulation = accumulation  # micro-batches whose gradients a step sums
        self.step_stats = StepStats.create()

    def train_step(self, data: Any) -> dict[str, tf.Tensor]:
        inputs, targets = self._arrived(data)  # (B, T) each
        if self.accumulation == 1:
            with tf.GradientTape() as tape:
                logits = self(inputs, training=True)  # (B, T, V)
                loss = self.compute_loss(inputs, targets, logits)
            grads_and_vars = self.optimizer.compute_gradients(loss, self.trainable_variables, tape)
            self._update(grads_and_vars)
            return self.compute_metrics(inputs, targets, logits, None)
        # The loop has updated the metrics micro-batch by micro-batch (Mean metrics weigh
        # each by its size, so they hold the whole batch's mean, as one update of it would).
        self._update(self._accumulated_gradients(inputs, targets))
        return self.get_metrics_result()

    def _arrived(self, data: Any) -> tuple[Any, Any]:
        """The step's batch, recording how long the step waited for it when `timed`."""
        start = tf.timestamp() if self.timed else None  # no inputs: runs as the step starts
        inputs, targets = data
        if start is not None:
            with tf.control_dependencies([inputs, targets]):
                arrived = tf.timestamp()
            self.step_stats.input_wait_s.assign_add(arrived - start)
        return inputs, targets

    def _update(self, grads_and_vars: list[tuple[Any, Any]]) -> None:
        """The one cross-replica sum, the norm's record and the one optimizer update of a step."""
        grads_and_vars = self._all_reduce(grads_and_vars)
        norm = tf.linalg.global_norm([g for g, _ in grads_and_vars if g is not None])
        self.step_stats.grad_norm.assign(tf.cast(norm, tf.float32))
        self.optimizer.apply_gradients(grads_and_vars, skip_gradients_aggregation=True)

    def _accumulated_gradients(self, inputs: tf.Tensor, targets: tf.Tensor) -> list[tuple]:
        """This replica's gradients of the mean loss over its (k x b, T) batch: the mean of its
        k micro-batches' gradients, added up one after the other (the module's docstring),
        with no collective.

        Under a LossScaleOptimizer each micro-batch's loss is scaled and the sums unscaled once,
        as its `compute_gradients` does for one batch: a non-finite gradient in any micro-batch
        makes the sum non-finite, and `apply_gradients` skips the step and lowers the scale.
        """
        k, variables = self.accumulation, self.trainable_variables
        micro_inputs, micro_targets = _micro_batches(inputs, k), _micro_batches(targets, k)
        unused: set[int] = set()  # variables without a gradient, found while tracing the body

        def add_micro_batch(i: tf.Tensor, sums: list[tf.Tensor]) -> tuple[Any, list[tf.Tensor]]:
            x, y = micro_inputs[i], micro_targets[i]  # (b, T) each
            with tf.GradientTape() as tape:
                logits = self(x, training=True)  # (b, T, V)
                loss = self._scaled(self.compute_loss(x, y, logits))
            # compute_loss updated the loss metric; the compiled ones are updated here, per
            # micro-batch, as compute_metrics would for the whole batch.
            self.compiled_metrics.update_state(y, logits, None)
            grads = tape.gradient(loss, variables)
            unused.update(j for j, g in enumerate(grads) if g is None)
            return i + 1, [
                s if g is None else s + tf.cast(tf.convert_to_tensor(g), tf.float32)
                for s, g in zip(sums, grads, strict=True)
            ]

        zeros = [tf.zeros(v.shape, tf.float32) for v in variables]
        _, sums = tf.while_loop(
            lambda i, _: i < k,
            add_micro_batch,
            (tf.constant(0), zeros),
            parallel_iterations=1,  # one micro-batch's activations at a time
        )
        grads = self._unscaled([s / k for s in sums])
        return [
            (None if j in unused else tf.cast(g, v.dtype), v)
            for j, (g, v) in enumerate(zip(grads, variables, strict=True))
        ]

    def _scaled(self, loss: tf.Tensor) -> tf.Tensor:
        """`loss` times the loss scale under a LossScaleOptimizer, else itself."""
        if isinstance(self.optimizer, keras.mixed_precision.LossScaleOptimizer):
            return self.optimizer.get_scaled_loss(loss)
        return loss

    def _unscaled(self, grads: list[tf.Tensor]) -> list[tf.Tensor]:
        """Gradients of a `_scaled` loss divided by the loss scale again."""
        if isinstance(self.optimizer, keras.mixed_precision.LossScaleOptimizer):
            return list(self.optimizer.get_unscaled_gradients(grads))
        return grads

    def _all_reduce(self, grads_and_vars: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
        """The optimizer's own gradient sum across replicas, timed when `timed`.

        A LossScaleOptimizer sums with its inner optimizer's, as its own `apply_gradients` does:
        its `aggregate_gradients` is the base class's, which reads attributes it never sets.
        """
        optimizer: Any = getattr(self.optimizer, "inner_optimizer", self.optimizer)
        aggregate = optimizer.aggregate_gradients
        if not self.timed:
            return list(aggregate(grads_and_vars))
        with tf.control_dependencies([g for g, _ in grads_and_vars if g is not None]):
            local = tf.timestamp()
        reduced = list(aggregate(grads_and_vars))
        with tf.control_dependencies([g for g, _ in reduced if g is not None]):
            summed = tf.timestamp()
        self.step_stats.allreduce_s.assign_add(summed - local)
        return reduced


def _micro_batches(x: tf.Tensor, k: int) -> tf.Tensor:
    """(k x b, ...) -> (k, b, ...): micro-batch i is rows i x b to (i + 1) x b - 1."""
    split = tf.reshape(x, tf.concat([[k, -1], tf.shape(x)[1:]], axis=0))
    batch = x.shape[0] // k if x.shape[0] is not None else None
    split.set_shape([k, batch, *x.shape[1:]])
    return split


def times_steps(jit: bool, device_kind: str) -> bool:
    """Whether the train step records timestamps (input wait, all-reduce time): on a CPU and
    without XLA only (the module's docstring)."""
    return not jit and device_kind == "cpu"


def instrumented(gpt: keras.Model, timed: bool, accumulation: int = 1) -> InstrumentedGPT:
    """`gpt` (from build_gpt) with the measuring train step, sharing its layers; call under the
    strategy's scope."""
    return InstrumentedGPT(
        gpt.inputs, gpt.outputs, timed=timed, accumulation=accumulation, name=gpt.name
    )
