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
    `timed`: whether it records timestamps (`times_steps`).
    """

    def __init__(
        self, inputs: Any, outputs: Any, timed: bool = True, accumulation: int = 1, **kwargs: Any
    ) -> None:
        super().__init__(inputs, outputs, **kwargs)
        self.timed = timed
        self.accumulation = accumulation  # micro-batches per step (not yet: 1 only)
        if accumulation != 1:
            raise NotImplementedError("gradient accumulation")
        self.step_stats = StepStats.create()

    def train_step(self, data: Any) -> dict[str, tf.Tensor]:
        start = tf.timestamp() if self.timed else None  # no inputs: runs as the step starts
        inputs, targets = data  # (B, T) each
        if start is not None:
            with tf.control_dependencies([inputs, targets]):
                arrived = tf.timestamp()
            self.step_stats.input_wait_s.assign_add(arrived - start)
        with tf.GradientTape() as tape:
            logits = self(inputs, training=True)  # (B, T, V)
            loss = self.compute_loss(inputs, targets, logits)
        grads_and_vars = self.optimizer.compute_gradients(loss, self.trainable_variables, tape)
        grads_and_vars = self._all_reduce(grads_and_vars)
        norm = tf.linalg.global_norm([g for g, _ in grads_and_vars if g is not None])
        self.step_stats.grad_norm.assign(tf.cast(norm, tf.float32))
        self.optimizer.apply_gradients(grads_and_vars, skip_gradients_aggregation=True)
        return self.compute_metrics(inputs, targets, logits, None)

    def _all_reduce(self, grads_and_vars: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
        """The optimizer's own gradient sum across replicas, timed when `timed`."""
        if not self.timed:
            return list(self.optimizer.aggregate_gradients(grads_and_vars))
        with tf.control_dependencies([g for g, _ in grads_and_vars if g is not None]):
            local = tf.timestamp()
        reduced = list(self.optimizer.aggregate_gradients(grads_and_vars))
        with tf.control_dependencies([g for g, _ in reduced if g is not None]):
            summed = tf.timestamp()
        self.step_stats.allreduce_s.assign_add(summed - local)
        return reduced


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
