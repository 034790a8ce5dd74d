"""Where a logging step's numbers go on the chief: TensorBoard, Prometheus and the run view.

`TrainMonitor` (trainer/callbacks.py) measures a `LogPoint` every train.log_every steps on every
worker; the chief's `Telemetry` publishes it:

- TensorBoard scalars under `<work>/logs/train` (and `loss` under `<work>/logs/validation`),
  written with tf.summary, locally or on gs://;
- the Prometheus gauges of trainer/metrics_server.py, when a metrics port is given;
- progress events for `gptpipe run`'s live view (contracts.progress; nothing without
  GPTPIPE_PROGRESS);
- the training curve, kept in the work folder at every validation and at the end.

The other workers get `Telemetry.off()`, which publishes nothing.
"""

from __future__ import annotations

import logging
import math
import posixpath
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from contracts.artifacts import TENSORBOARD_DIR
from contracts.progress import Progress
from trainer.history import TrainHistory
from trainer.metrics_server import MetricsServer

log = logging.getLogger("trainer")

# How often TensorBoard's files are written out; on gs:// each write uploads the file again.
RUNS = ("train", "validation")  # TensorBoard runs, each a folder under logs/
_TRIM_SUFFIX = ".trim-tmp"
FLUSH_MILLIS = 30_000


@dataclass(frozen=True)
class Speed:
    """How fast the steps since the previous logging step went."""

    steps: int  # steps in the interval
    seconds: float  # its wall time, validation and checkpoint pauses left out
    tokens_per_s: float  # global tokens per second
    input_wait_s: float | None  # mean seconds a step waited for its batch; None: not measured
    allreduce_s: float | None  # mean seconds per step in the gradient all-reduce; None: not
    mfu: float | None  # model FLOPs utilisation; None off known accelerators

    @property
    def step_time_s(self) -> float:
        return self.seconds / self.steps

    @property
    def input_wait_frac(self) -> float | None:
        return None if self.input_wait_s is None else self.input_wait_s / self.step_time_s

    @property
    def compute_s(self) -> float | None:
        """Step time not spent waiting for input: the device's work, collectives, host."""
        return None if self.input_wait_s is None else self.step_time_s - self.input_wait_s


@dataclass(frozen=True)
class LogPoint:
    """What one logging step measured."""

    step: int  # optimizer steps taken (global)
    total_steps: int  # train.train_steps
    tokens: int  # global tokens trained up to `step`
    loss: float  # Keras' running mean of the training loss since the epoch began
    learning_rate: float  # learning rate of this step
    grad_norm: float  # global gradient norm before clipping, this step
    speed: Speed | None  # None at the first step an attempt trains (it includes tracing)

    def history_record(self) -> dict[str, Any]:
        """The point as train_history.json keeps it (trainer/history.py); needs `speed`."""
        assert self.speed is not None, "a history point has a speed"
        record: dict[str, Any] = {
            "step": self.step,
            "tokens": self.tokens,
            "loss": self.loss,
            "learning_rate": self.learning_rate,
            "tokens_per_s": round(self.speed.tokens_per_s, 2),
            "grad_norm": self.grad_norm,
        }
        if self.speed.input_wait_frac is not None:
            record["input_wait_frac"] = round(self.speed.input_wait_frac, 4)
        if self.speed.mfu is not None:
            record["mfu"] = round(self.speed.mfu, 4)
        return record


class Telemetry:
    """The chief's publishers; each is optional."""

    def __init__(
        self,
        work_dir: str | None,
        metrics: MetricsServer | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.work_dir = work_dir  # None: no TensorBoard logs and no curve kept
        self.metrics = metrics
        self.progress = progress
        # TensorBoard's writers, made at their first scalar: after `resume_at` has trimmed what
        # earlier attempts wrote.
        self._writers: dict[str, Any] = {}
        self._logs = None if work_dir is None else posixpath.join(work_dir, TENSORBOARD_DIR)

    @classmethod
    def off(cls) -> Telemetry:
        """Publish nothing (a worker other than the chief)."""
        return cls(None)

    def report(self, point: LogPoint) -> None:
        """Publish a logging step."""
        speed = point.speed
        scalars: dict[str, float | None] = {
            "loss": point.loss,
            "learning_rate": point.learning_rate,
            "grad_norm": point.grad_norm,
        }
        if speed is not None:
            scalars.update(
                {
                    "tokens_per_second": speed.tokens_per_s,
                    "step_time/total_s": speed.step_time_s,
                    "step_time/input_wait_s": speed.input_wait_s,
                    "step_time/compute_s": speed.compute_s,
                    "input_wait_fraction": speed.input_wait_frac,
                    "allreduce_s": speed.allreduce_s,
                    "mfu": speed.mfu,
                }
            )
        self._scalars("train", point.step, scalars)
        if self.metrics is not None:
            self.metrics.set(
                step=point.step,
                total_steps=point.total_steps,
                loss=point.loss,
                learning_rate=point.learning_rate,
                grad_norm=point.grad_norm,
            )
            if speed is not None:
                self.metrics.set(
                    tokens_per_second=speed.tokens_per_s,
                    step_seconds=speed.step_time_s,
                    input_wait_fraction=speed.input_wait_frac,
                    allreduce_seconds=speed.allreduce_s,
                    mfu=speed.mfu,
                )
        if self.progress is not None:
            numbers = {"loss": round(point.loss, 4) if math.isfinite(point.loss) else point.loss}
            if speed is not None:
                numbers["tokens_per_s"] = round(speed.tokens_per_s, 1)
            # Never throttled away: the last step, and a divergence (training stops there).
            final = point.step >= point.total_steps or not math.isfinite(point.loss)
            self.progress.update(point.step, point.total_steps, "steps", final=final, **numbers)

    def resume_at(self, step: int) -> None:
        """Drop the scalars earlier attempts logged after `step`, where this attempt resumes
        (its backup): it logs those steps again, and TensorBoard does not purge a step logged
        twice by tf.summary's event files, so the curves would double back on themselves.
        Called before this attempt's first scalar (history.resume_at's twin)."""
        if self._logs is None or self._writers:
            return
        for run in RUNS:
            folder = posixpath.join(self._logs, run)
            try:
                for left in tf.io.gfile.glob(posixpath.join(folder, f"*{_TRIM_SUFFIX}")):
                    tf.io.gfile.remove(left)  # an earlier trim's, killed before its rename
                for path in tf.io.gfile.glob(posixpath.join(folder, "events.out.tfevents.*")):
                    _trim_events(path, step)
            except tf.errors.OpError as err:  # housekeeping: training goes on without it
                log.warning(
                    "TensorBoard: could not drop steps after %d in %s: %s", step, folder, err
                )

    def report_eval(self, step: int, val_loss: float, history: TrainHistory) -> None:
        """Publish a validation, and keep the curve so far in the work folder."""
        self._scalars("validation", step, {"loss": val_loss})
        for writer in self._writers.values():
            writer.flush()
        if self.metrics is not None:
            self.metrics.set(val_loss=val_loss)
        self.keep(history)

    def keep(self, history: TrainHistory) -> None:
        """Keep the curve in the work folder, for a restarted job to continue."""
        if self.work_dir is not None:
            history.save(self.work_dir)

    def close(self) -> None:
        """Flush TensorBoard's files and stop the metrics server."""
        for writer in self._writers.values():
            writer.close()
        self._writers = {}
        if self.metrics is not None:
            self.metrics.close()

    def _scalars(self, run: str, step: int, values: dict[str, float | None]) -> None:
        if self._logs is None:
            return
        writer = self._writers.get(run)
        if writer is None:
            folder = posixpath.join(self._logs, run)
            writer = tf.summary.create_file_writer(folder, flush_millis=FLUSH_MILLIS)
            self._writers[run] = writer
        with writer.as_default(step=step):
            for tag, value in values.items():
                if value is not None:
                    tf.summary.scalar(tag, value)


def _trim_events(path: str, step: int) -> None:
    """Rewrite one TensorBoard event file without its summaries after `step` (a temporary file,
    renamed over it); a file with none is left alone. Records after a torn one (a process
    killed mid-write) are unreadable anyway and are dropped with it."""
    kept, dropped = [], 0
    try:
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            if event.HasField("summary") and event.step > step:
                dropped += 1
            else:
                kept.append(record.numpy())
    except tf.errors.DataLossError:
        dropped += 1
    if not dropped:
        return
    # Beside it (a rename within the folder), under a name TensorBoard does not read (it reads
    # any file whose name holds "tfevents"): a copy left by a kill would double its steps.
    folder, name = posixpath.split(path)
    tmp = posixpath.join(folder, f".{name.replace('tfevents', 'trim')}{_TRIM_SUFFIX}")
    with tf.io.TFRecordWriter(tmp) as writer:
        for record in kept:
            writer.write(record)
    tf.io.gfile.rename(tmp, path, overwrite=True)
