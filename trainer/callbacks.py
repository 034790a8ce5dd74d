"""Keras callbacks that watch training: progress and divergence (TrainMonitor), checkpoints.

The callbacks that make training survive a restart live in trainer/preemption.py.
"""

from __future__ import annotations

import logging
import math
import posixpath
import time
import uuid
from collections.abc import Callable
from typing import Any

import tensorflow as tf
import tf_keras as keras

log = logging.getLogger("trainer")


class TrainMonitor(keras.callbacks.Callback):
    """Logs every log_every steps, stops at train_steps, and stops (not crashes) on a NaN loss.

    A loss that becomes NaN or infinite is an outcome, not an error (a learning rate too high
    for the model, no gradient clipping): training stops at that step and the train step still
    succeeds, exporting the model with `diverged: true`, `diverged_at_step` and the non-finite
    `final_loss` in train_metrics.json. Evaluate never blesses such a model and says why, so
    push publishes nothing (`pushed=0`) and the run's summary shows the reason. The loss Keras
    logs is already the mean over all workers, so every worker stops at the same step.
    """

    def __init__(
        self,
        train_steps: int,
        log_every: int,
        tokens_per_step: int,
        schedule: Callable[[int], tf.Tensor],
    ) -> None:
        super().__init__()
        self.train_steps = train_steps
        self.log_every = log_every
        self.tokens_per_step = tokens_per_step
        self.schedule = schedule  # 0-based step -> learning rate, for the log lines
        self.diverged_at_step: int | None = None
        self.last_loss = float("nan")
        self.timed_steps = 0
        self.timed_seconds = 0.0
        self.batches = 0  # steps this process trained (0: it resumed from a finished backup)
        self._batch_start = 0.0

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_start = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        step = int(self.model.optimizer.iterations.numpy())
        loss = float((logs or {})["loss"])
        self.batches += 1
        if batch > 0:  # the first batch of each fit chunk includes tracing and compiling
            self.timed_steps += 1
            self.timed_seconds += time.perf_counter() - self._batch_start
        self.last_loss = loss
        if not math.isfinite(loss):
            self.diverged_at_step = step
            self.model.stop_training = True
            log.warning(
                "step %d: loss is %s, training diverged; stopping. Evaluate will not bless this "
                "model: lower train.learning_rate or set train.grad_clip_norm",
                step,
                loss,
            )
            return
        if step % self.log_every == 0 or step == 1:
            lr = float(self.schedule(step - 1))
            log.info(
                "step %d loss %.4f lr %.2e tokens/s %.0f", step, loss, lr, self.tokens_per_second()
            )
        if step >= self.train_steps:
            self.model.stop_training = True

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs and "val_loss" in logs:
            step = int(self.model.optimizer.iterations.numpy())
            log.info("step %d val_loss %.4f", step, logs["val_loss"])

    def tokens_per_second(self) -> float:
        """Training throughput over timed (post-compile) steps."""
        return self.tokens_per_step * self.timed_steps / max(self.timed_seconds, 1e-9)


class PeriodicCheckpoint(keras.callbacks.Callback):
    """Saves model and optimizer every `every` steps with a CheckpointManager (keeps the last 3).

    Non-chief workers take part in the save (it may need collectives) but write to a scratch
    folder that they delete.
    """

    def __init__(self, directory: str, every: int, is_chief: bool) -> None:
        super().__init__()
        self.directory = directory
        self.every = every
        self.is_chief = is_chief
        self._manager: tf.train.CheckpointManager | None = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        ckpt = tf.train.Checkpoint(model=self.model, optimizer=self.model.optimizer)
        directory = (
            self.directory
            if self.is_chief
            else (posixpath.join(self.directory, f".worker-tmp-{uuid.uuid4().hex[:8]}"))
        )
        self._manager = tf.train.CheckpointManager(ckpt, directory, max_to_keep=3)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        step = int(self.model.optimizer.iterations.numpy())
        if step % self.every == 0:
            assert self._manager is not None, "on_train_begin makes the manager"
            self._manager.save(checkpoint_number=step)
            if not self.is_chief:
                tf.io.gfile.rmtree(self._manager.directory)
