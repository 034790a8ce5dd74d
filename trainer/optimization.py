"""The optimizer: AdamW, its update one fused kernel, under a warmup + cosine schedule to the
peak learning rate of the run's plan (trainer/run_plan.py)."""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf
import tf_keras as keras

from trainer.budget import UNPLANNED_STEPS
from trainer.config import Config
from trainer.run_plan import RunPlan


class FusedAdamW(keras.optimizers.AdamW):
    """tf-keras' AdamW, each dense update one fused kernel: TensorFlow's `ResourceApplyAdam`.

    tf-keras' `AdamW.update_step` (tf_keras/src/optimizers/adamw.py) spells the update out in
    about 10 ops, each a pass over the variable's memory; `ResourceApplyAdam`
    (tensorflow/core/kernels/training_ops.cc, `ApplyAdamNonCuda` on CPU) reads the gradient, m,
    v and the variable once and writes them once, with the same arithmetic:
    m += (g - m)(1 - beta_1), v += (g^2 - v)(1 - beta_2), var -= alpha m / (sqrt(v) + epsilon),
    alpha = lr sqrt(1 - beta_2^t) / (1 - beta_1^t). The decoupled weight decay, the clipping
    and the slots (so checkpoints) are AdamW's own. Sparse gradients and amsgrad take AdamW's
    path. The update of the 13.8 M-parameter benchmark model took 15 ms instead of 23 on 2 Zen 5
    cores; its train step in mixed_bfloat16 got about 3% faster (docs/benchmarks.md). The kernel has
    an XLA translation (tf2xla/kernels/training_ops.cc), so updates compiled by XLA keep it. On
    a GPU, tf-keras compiles each update with XLA by default (the optimizer's `jit_compile`),
    which fuses AdamW's ops itself: no gain is expected there (unmeasured).
    """

    def update_step(self, gradient: Any, variable: Any) -> None:
        if isinstance(gradient, tf.IndexedSlices) or self.amsgrad:
            super().update_step(gradient, variable)
            return
        dtype = variable.dtype
        local_step = tf.cast(self.iterations + 1, dtype)
        slot = self._index_dict[self._var_key(variable)]
        beta_1 = tf.cast(self.beta_1, dtype)
        beta_2 = tf.cast(self.beta_2, dtype)
        tf.raw_ops.ResourceApplyAdam(
            # Under a strategy's update() these resolve to this replica's copies.
            var=variable.handle,
            m=self._momentums[slot].handle,
            v=self._velocities[slot].handle,
            beta1_power=tf.pow(beta_1, local_step),
            beta2_power=tf.pow(beta_2, local_step),
            lr=tf.cast(self.learning_rate, dtype),
            beta1=beta_1,
            beta2=beta_2,
            epsilon=tf.cast(self.epsilon, dtype),
            grad=gradient,
        )


class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """Warmup then cosine decay, in TF ops; the same curve as run_plan.learning_rate_at.

    The decay's length is a variable, so that a time budget can set it once the step time is
    measured (trainer/budget.py) without tracing the step again; it is not part of any
    checkpoint (a schedule is not tracked), and the budget keeps its own plan.
    """

    def __init__(
        self, peak_lr: float, warmup_steps: int, total_steps: int, min_lr_ratio: float
    ) -> None:
        self.peak_lr = peak_lr
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.min_lr_ratio = min_lr_ratio
        self._total = tf.Variable(float(total_steps), trainable=False, name="schedule_steps")

    def set_total_steps(self, total_steps: int) -> None:
        """Decay to `total_steps` from now on (a time budget's plan)."""
        self.total_steps = total_steps
        self._total.assign(float(total_steps))

    def __call__(self, step: tf.Tensor | int) -> tf.Tensor:
        step = tf.cast(step, tf.float32)
        warmup = self.peak_lr * (step + 1.0) / max(self.warmup_steps, 1)
        decay_steps = tf.maximum(1.0, self._total - self.warmup_steps)
        progress = tf.clip_by_value((step - self.warmup_steps) / decay_steps, 0.0, 1.0)
        cosine = 0.5 * (1.0 + tf.cos(math.pi * progress))
        decayed = self.peak_lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine)
        return tf.where(step < self.warmup_steps, warmup, decayed)

    def get_config(self) -> dict[str, Any]:
        return {
            "peak_lr": self.peak_lr,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "min_lr_ratio": self.min_lr_ratio,
        }


def build_optimizer(
    cfg: Config, plan: RunPlan, policy: str = "float32"
) -> tuple[keras.optimizers.Optimizer, WarmupCosine]:
    """AdamW (`FusedAdamW`) with a warmup+cosine schedule over the plan's steps, to its peak LR.

    Under mixed_float16 it is wrapped in a dynamic LossScaleOptimizer: float16 gradients of a
    small loss underflow. bfloat16 has float32's exponent range and needs no loss scaling.
    """
    t = cfg.train
    steps = plan.steps or UNPLANNED_STEPS  # a time budget alone plans them later
    schedule = WarmupCosine(plan.peak_learning_rate, plan.warmup_steps, steps, t.min_lr_ratio)
    optimizer = FusedAdamW(
        learning_rate=schedule,
        weight_decay=t.weight_decay,
        beta_1=t.beta_1,
        beta_2=t.beta_2,
        global_clipnorm=t.grad_clip_norm or None,
    )
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    if policy == "mixed_float16":
        optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer, schedule
