"""Surviving preemption: on SIGTERM every worker backs up at the same step and exits retryably.

docs/training.md ("Preemption") tells why it is built this way and not on TensorFlow's
PreemptionCheckpointHandler.
"""

from __future__ import annotations

import logging
import posixpath
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import tensorflow as tf
import tf_keras as keras

log = logging.getLogger("trainer")

# 128 + SIGTERM, what Kubernetes reports for a container stopped by SIGTERM: retryable under the
# operator's ExitCode restart policy. The trainer exits with it when preempted (after its backup)
# and when it loses a peer worker.
EXIT_PREEMPTED = 128 + signal.SIGTERM

Agreement = Callable[[float], float]  # this worker's flag (0.0/1.0) -> the sum over all workers


class Preempted(Exception):
    """The worker group stopped at `step` because a worker got SIGTERM; the backup is at `step`."""

    def __init__(self, step: int) -> None:
        super().__init__(f"preempted: backed up at step {step}")
        self.step = step


class PreemptionWatch:
    """Turns SIGTERM into a flag that training polls; the process keeps running until it saves."""

    def __init__(self) -> None:
        self.requested = False

    def install(self) -> None:
        """Handle SIGTERM from now on (in the main thread only, where Python allows it)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._handler)

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if not self.requested:
            log.warning("received SIGTERM: backing up and stopping at the end of this step")
        self.requested = True


def preemption_agreement(strategy: tf.distribute.Strategy, workers: int) -> Agreement:
    """A function: this worker's flag -> the sum of all workers' flags (all-reduce when >1)."""
    if workers <= 1:
        return lambda flag: flag

    @tf.function
    def all_reduce(flag: tf.Tensor) -> tf.Tensor:
        def replica_fn(value: tf.Tensor) -> tf.Tensor:
            ctx = tf.distribute.get_replica_context()
            # identity places the value on this replica's device: all_reduce reduces to there.
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(value))

        per_replica = strategy.run(replica_fn, args=(flag,))
        return strategy.experimental_local_results(per_replica)[0]

    return lambda flag: float(all_reduce(tf.constant(flag, tf.float32)))


def backed_up_step(backup_dir: str) -> int:
    """The step of the backup that PreemptibleBackup (Keras' BackupAndRestore) will restore from
    `backup_dir`, or 0 without one: read before training, so that the input can start where
    those steps left it (data.TrainOrder). BackupAndRestore reads `<backup_dir>/chief`
    (tf_keras/src/distribute/worker_training_state.py) and restores the optimizer's step counter.
    """
    latest = tf.train.latest_checkpoint(posixpath.join(backup_dir, "chief"))
    if latest is None:
        return 0
    reader = tf.train.load_checkpoint(latest)
    steps = [
        int(reader.get_tensor(key))
        for key in reader.get_variable_to_shape_map()
        if key.endswith("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE")
    ]
    return max(steps, default=0)


class PreemptibleBackup(keras.callbacks.BackupAndRestore):
    """BackupAndRestore every `save_freq` steps that also backs up and stops when preempted.

    A SIGTERM reaches one worker; the others must stop at the same step, because the backup is
    a collective save under MultiWorkerMirroredStrategy. So every `check_every` steps (counted
    from step 0, so every worker checks at the same steps, resumed or not) all workers sum
    their preemption flags (`agree`, one scalar all-reduce); when the sum is non-zero each takes
    the backup and raises `Preempted`. Checking every step would cost an all-reduce and a host
    sync per step, which stalls a GPU.
    """

    def __init__(
        self,
        backup_dir: str,
        save_freq: int,
        watch: PreemptionWatch,
        agree: Agreement,
        check_every: int = 1,
    ) -> None:
        # The backup outlives fit: it is removed only once the Model is exported, so a job that
        # fails while exporting resumes at its last step instead of training again from 0.
        super().__init__(backup_dir=backup_dir, save_freq=save_freq, delete_checkpoint=False)
        self.watch = watch
        self.agree = agree
        self.check_every = check_every
        self.initial_step = 0
        self._steps = 0  # steps this attempt trained

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        super().on_train_begin(logs)  # restores the backup, if any
        self.initial_step = int(self.model.optimizer.iterations.numpy())
        if self.initial_step:
            log.info("resumed at step %d from the backup in %s", self.initial_step, self.backup_dir)
        # Keras counts batches toward save_freq from this attempt's start; resumed mid-epoch
        # (a preemption backup), that would put every later backup off the epoch ends, and the
        # last one short of the last step, which a restart after a failed export then trains
        # again. Counted from step 0, backups stay at multiples of save_freq.
        if isinstance(self.save_freq, int):
            self._batches_count = self.initial_step % self.save_freq

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        super().on_train_batch_end(batch, logs)
        due = self.check_due()
        # A step after which training stops anyway (the last one, or a divergence: the monitor,
        # which runs first, decided it from the step count and the global loss, so on every
        # worker alike) ends training normally: its validation and metrics are kept and the
        # export follows at once. Backed up here instead, the job would resume with nothing
        # left to train, and its Model would carry no training metrics.
        if due and not self.model.stop_training and self.agree(float(self.watch.requested)) > 0:
            step = int(self.model.optimizer.iterations.numpy())
            self._backup(epoch=self._current_epoch, batch=batch)
            log.warning("preempted: backed up at step %d; exiting %d", step, EXIT_PREEMPTED)
            raise Preempted(step)

    def check_due(self) -> bool:
        """Count one trained step; True if the workers check their flags after it."""
        self._steps += 1
        return (self.initial_step + self._steps) % self.check_every == 0

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        # A non-chief worker's write folder (backup/workertemp_<i>) is made when training starts
        # but only removed after a save; an attempt that saves nothing would leave it behind.
        state = self._training_state
        if state.write_checkpoint_manager is not state.read_checkpoint_manager:
            scratch = state.write_checkpoint_manager.directory
            if tf.io.gfile.exists(scratch):
                tf.io.gfile.rmtree(scratch)
        super().on_train_end(logs)
