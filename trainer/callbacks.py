"""Keras callbacks that watch training: measuring and divergence (TrainMonitor), checkpoints.

The callbacks that make training survive a restart live in trainer/preemption.py.
"""

from __future__ import annotations

import logging
import math
import posixpath
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import tensorflow as tf
import tf_keras as keras

from contracts.artifacts import WORKER_CHECKPOINT_SCRATCH_PREFIX
from trainer.history import TrainHistory
from trainer.telemetry import LogPoint, Speed, Telemetry
from trainer.train_step import StepStats

log = logging.getLogger("trainer")


class StepCallback(keras.callbacks.Callback):
    """A callback that knows the global step without reading it back from the device each step.

    It reads the optimizer's step once, at the first batch (after every `on_train_begin`, so
    after the backup's restore), then counts batches: each train batch is one optimizer step.
    Its logs stay tensors (`_supports_tf_logs`): Keras converts a batch's logs to numbers, a
    host sync, unless every callback with batch hooks accepts tensors.
    """

    def __init__(self) -> None:
        super().__init__()
        self._supports_tf_logs = True
        self.first_step: int | None = None  # the step this attempt started from
        self.batches = 0  # steps this process trained (0: it resumed from a finished backup)

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.first_step is None:
            self.first_step = int(self.model.optimizer.iterations.numpy())

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.batches += 1

    @property
    def step(self) -> int:
        """Optimizer steps taken, as of the last batch end."""
        return (self.first_step or 0) + self.batches


class TrainMonitor(StepCallback):
    """Measures every log_every steps, stops at train_steps, and stops (not crashes) on a NaN loss.

    Nothing is read back from the device between logging steps (a read per step
    stalls a GPU). At a logging step (every log_every steps, the first step an attempt trains,
    and the last) it reads the loss, the gradient norm and the step statistics of
    trainer/train_step.py, computes the interval's speed, logs a line, adds the point to the
    training history and hands it to the chief's `Telemetry`.

    A loss that becomes NaN or infinite is an outcome, not an error (a learning rate too high
    for the model, no gradient clipping): training stops at the logging step that sees it (the
    loss Keras logs is the running mean since the epoch began, so a NaN at any step of the epoch
    shows), and the train step still succeeds, exporting the model with `diverged: true`,
    `diverged_at_step` (that logging step) and the non-finite `final_loss` in
    train_metrics.json. Evaluate never blesses such a model and says why, so push publishes
    nothing (`pushed=0`) and the run's summary shows the reason. The loss is already the mean
    over all workers, so every worker stops at the same step.

    Interval times leave out what happens between an epoch's last step and the next epoch's
    first (validation, the backup and checkpoint saves), so tokens/s is the training's own.
    """

    def __init__(
        self,
        train_steps: int,
        log_every: int,
        tokens_per_step: int,
        schedule: Callable[[int], tf.Tensor],
        history: TrainHistory,
        telemetry: Telemetry | None = None,
        measured: Measured | None = None,
    ) -> None:
        super().__init__()
        self.train_steps = train_steps
        self.log_every = log_every
        self.tokens_per_step = tokens_per_step  # global: batch x replicas x seq_len
        self.schedule = schedule  # 0-based step -> learning rate
        self.history = history
        self.telemetry = telemetry or Telemetry.off()
        self.measured = measured or Measured()
        self.diverged_at_step: int | None = None
        self.last_loss = float("nan")
        self.timed_steps = 0
        self.timed_seconds = 0.0
        self._logs: dict[str, Any] = {}
        self._mark: _Mark | None = None  # the previous logging step
        self._logged_step = -1
        self._paused = 0.0  # seconds between epochs, left out of the intervals
        self._pause_from: float | None = None
        self._epoch_ended = False
        self._started = 0.0
        self._wall_before = 0.0

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._started = time.perf_counter()
        self._wall_before = self.history.wall_s  # the earlier attempts'

    def _count_wall(self) -> None:
        """history.wall_s: the earlier attempts' and this one's so far. Kept at each validation
        too, so that an attempt killed outright (OOM, a lost node) loses only the time since."""
        self.history.wall_s = self._wall_before + time.perf_counter() - self._started

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.first_step is None:
            super().on_train_batch_begin(batch, logs)
            self.history.resume_at(self.step)
            self.telemetry.resume_at(self.step)
        self._end_pause()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        super().on_train_batch_end(batch, logs)
        self._logs = logs or {}
        step = self.step
        if step % self.log_every == 0 or self.batches == 1 or step >= self.train_steps:
            self._log(step)
        if step >= self.train_steps:
            self.model.stop_training = True
        self._pause_from = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch_ended = True
        logs = logs or {}
        if "val_loss" in logs and self.batches:
            step, val_loss = self.step, float(logs["val_loss"])
            log.info("step %d val_loss %.4f", step, val_loss)
            self.history.eval_points.append(
                {"step": step, "tokens": step * self.tokens_per_step, "val_loss": val_loss}
            )
            self._count_wall()
            self.telemetry.report_eval(step, val_loss, self.history)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self.batches and self._logged_step != self.step and self.diverged_at_step is None:
            self._end_pause()
            self._log(self.step)  # fit stopped between logging steps
        if self.batches:
            self._count_wall()
            if self.timed_steps:
                self.history.mfu = self.measured.mfu(self.tokens_per_second())
        self.telemetry.keep(self.history)

    def _end_pause(self) -> None:
        """Leave the time since the last step out of the interval if an epoch ended in it."""
        if self._epoch_ended and self._pause_from is not None:
            self._paused += time.perf_counter() - self._pause_from
        self._epoch_ended = False

    def tokens_per_second(self) -> float:
        """Training throughput over the timed steps (after this attempt's first)."""
        return self.tokens_per_step * self.timed_steps / max(self.timed_seconds, 1e-9)

    def _log(self, step: int) -> None:
        """Read this step's numbers (the one host sync), record and publish them."""
        loss = float(self._logs["loss"])
        stats = self.measured.read(self.model)
        now = time.perf_counter()
        point = LogPoint(
            step=step,
            total_steps=self.train_steps,
            tokens=step * self.tokens_per_step,
            loss=loss,
            learning_rate=float(self.schedule(step - 1)),
            grad_norm=stats.get("grad_norm", float("nan")),
            speed=self._speed(step, now, stats),
        )
        self._logged_step = step
        self.last_loss = loss
        tokens_per_s = point.speed.tokens_per_s if point.speed else 0.0
        log.info(
            "step %d loss %.4f lr %.2e tokens/s %.0f", step, loss, point.learning_rate, tokens_per_s
        )
        if point.speed is not None:
            self.history.points.append(point.history_record())
        self.telemetry.report(point)
        # The next interval starts after the publishing, which is the logging's cost, not the
        # steps' (the first summary written, say, creates TensorBoard's files).
        self._mark = _Mark(step, time.perf_counter(), self._paused, stats)
        if not math.isfinite(loss):
            self.diverged_at_step = step
            self.model.stop_training = True
            log.warning(
                "step %d: loss is %s, training diverged; stopping. Evaluate will not bless this "
                "model: lower train.learning_rate or set train.grad_clip_norm",
                step,
                loss,
            )

    def _speed(self, step: int, now: float, stats: dict[str, float]) -> Speed | None:
        """The interval since the previous logging step, or None at the attempt's first."""
        mark = self._mark
        if mark is None or step <= mark.step:
            return None
        steps = step - mark.step
        seconds = max((now - mark.clock) - (self._paused - mark.paused), 1e-9)
        self.timed_steps += steps
        self.timed_seconds += seconds
        tokens_per_s = steps * self.tokens_per_step / seconds

        def per_step(name: str, measured: bool) -> float | None:
            if not measured or name not in stats:
                return None
            return (stats[name] - mark.stats[name]) / steps

        return Speed(
            steps=steps,
            seconds=seconds,
            tokens_per_s=tokens_per_s,
            input_wait_s=per_step("input_wait_s", self.measured.input_wait),
            allreduce_s=per_step("allreduce_s", self.measured.allreduce),
            mfu=self.measured.mfu(tokens_per_s),
        )


@dataclass(frozen=True)
class Measured:
    """What this host can measure, decided once where the trainer knows its device."""

    input_wait: bool = False  # the step records its input wait (not under XLA)
    allreduce: bool = False  # ...and a meaningful all-reduce time (several CPU workers)
    flops_per_token: float = 0.0  # model FLOPs per token (trainer/flops.py)
    peak_flops: float | None = None  # peak FLOP/s of all replicas together; None: no MFU

    def mfu(self, tokens_per_s: float) -> float | None:
        if not self.peak_flops:
            return None
        return tokens_per_s * self.flops_per_token / self.peak_flops

    @staticmethod
    def read(model: keras.Model) -> dict[str, float]:
        """The model's step statistics (trainer/train_step.py), if it records them."""
        stats: StepStats | None = getattr(model, "step_stats", None)
        return stats.read() if stats is not None else {}


class _Mark(NamedTuple):
    """Where the previous interval ended."""

    step: int
    clock: float  # time.perf_counter() after its read
    paused: float  # the monitor's paused seconds then
    stats: dict[str, float]  # the step statistics then (cumulative)


class PeriodicCheckpoint(StepCallback):
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
        scratch = f"{WORKER_CHECKPOINT_SCRATCH_PREFIX}{uuid.uuid4().hex[:8]}"
        directory = self.directory if self.is_chief else posixpath.join(self.directory, scratch)
        self._manager = tf.train.CheckpointManager(ckpt, directory, max_to_keep=3)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        super().on_train_batch_end(batch, logs)
        step = self.step
        if step % self.every == 0:
            assert self._manager is not None, "on_train_begin makes the manager"
            self._manager.save(checkpoint_number=step)
            if not self.is_chief:
                tf.io.gfile.rmtree(self._manager.directory)
