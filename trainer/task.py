"""Training entry point: `python -m trainer.task --examples DIR --model-dir DIR --work-dir DIR`.

Reads the Examples artifact, trains the GPT with Keras `fit` under a distribution strategy
(resumable through BackupAndRestore in the work folder), and has the chief write the Model
artifact: Format-Serving/ (SavedModel), config.json and train_metrics.json. On SIGTERM every
worker backs up at the same step and exits 143, which the operator retries (docs/training.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import posixpath
import signal
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tensorflow as tf
import tf_keras as keras

from trainer import config as config_lib
from trainer import data, export, model
from trainer.config import Config
from contracts.errors import UserError

log = logging.getLogger("trainer")

# 128 + SIGTERM, what Kubernetes reports for a container stopped by SIGTERM: retryable under the
# operator's ExitCode restart policy. The trainer exits with it when preempted (after its backup)
# and when it loses a peer worker.
EXIT_PREEMPTED = 128 + signal.SIGTERM
FAULT_SIGNALS = ("KILL", "TERM")


class ExportFailed(Exception):
    """Writing the Model failed after training; the backup is kept, so a restart only exports."""


class Preempted(Exception):
    """The worker group stopped at `step` because a worker got SIGTERM; the backup is at `step`."""

    def __init__(self, step: int):
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

    def _handler(self, signum, frame) -> None:
        if not self.requested:
            log.warning("received SIGTERM: backing up and stopping at the end of this step")
        self.requested = True


@dataclass(frozen=True)
class Fault:
    """Test-only fault injection (`--fault-at-step`): worker `worker` sends itself `signal_name`
    after step `step`, only in a run that started from step 0, so the restarted job runs clean."""

    step: int  # optimizer step after which the signal is sent
    worker: int = 1  # TF_CONFIG task index of the worker that signals itself
    signal_name: str = "KILL"  # one of FAULT_SIGNALS


def choose_strategy(tf_config: str | None = None) -> tf.distribute.Strategy:
    """MultiWorkerMirrored when TF_CONFIG names >1 task, Mirrored for >1 local GPU, else default.

    `tf_config` is the TF_CONFIG JSON, read by the caller at the process edge. Call this before
    anything else touches TensorFlow: collective ops must be configured first.
    """
    if _cluster_size(tf_config) > 1:
        return tf.distribute.MultiWorkerMirroredStrategy()
    if len(tf.config.list_physical_devices("GPU")) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


def _cluster_size(tf_config: str | None) -> int:
    cluster = json.loads(tf_config).get("cluster", {}) if tf_config else {}
    return sum(len(cluster.get(kind, [])) for kind in ("chief", "worker"))


def _task_index(tf_config: str | None) -> int:
    """This worker's TF_CONFIG task index (0 without TF_CONFIG)."""
    return int(json.loads(tf_config).get("task", {}).get("index", 0)) if tf_config else 0


def _is_chief(tf_config: str | None) -> bool:
    """The chief is task `chief`, or `worker` 0 when the cluster has no chief."""
    if not tf_config:
        return True
    spec = json.loads(tf_config)
    task = spec.get("task", {})
    kind, index = task.get("type", "worker"), int(task.get("index", 0))
    has_chief = bool(spec.get("cluster", {}).get("chief"))
    return kind == "chief" or (kind == "worker" and index == 0 and not has_chief)


class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """Warmup then cosine decay, in TF ops; the same curve as config.learning_rate_at."""

    def __init__(self, peak_lr: float, warmup_steps: int, total_steps: int, min_lr_ratio: float):
        self.peak_lr = peak_lr
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.min_lr_ratio = min_lr_ratio

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warmup = self.peak_lr * (step + 1.0) / max(self.warmup_steps, 1)
        decay_steps = max(1, self.total_steps - self.warmup_steps)
        progress = tf.clip_by_value((step - self.warmup_steps) / decay_steps, 0.0, 1.0)
        cosine = 0.5 * (1.0 + tf.cos(math.pi * progress))
        decayed = self.peak_lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine)
        return tf.where(step < self.warmup_steps, warmup, decayed)

    def get_config(self):
        return {
            "peak_lr": self.peak_lr,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "min_lr_ratio": self.min_lr_ratio,
        }


class TrainMonitor(keras.callbacks.Callback):
    """Logs every log_every steps, stops at train_steps, and stops (not crashes) on a NaN loss."""

    def __init__(self, train_steps: int, log_every: int, tokens_per_step: int, schedule):
        super().__init__()
        self.train_steps = train_steps
        self.log_every = log_every
        self.tokens_per_step = tokens_per_step
        self.schedule = schedule
        self.diverged_at_step: int | None = None
        self.last_loss = float("nan")
        self.timed_steps = 0
        self.timed_seconds = 0.0
        self._batch_start = 0.0

    def on_train_batch_begin(self, batch, logs=None):
        self._batch_start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        loss = float(logs["loss"])
        if batch > 0:  # the first batch of each fit chunk includes tracing and compiling
            self.timed_steps += 1
            self.timed_seconds += time.perf_counter() - self._batch_start
        self.last_loss = loss
        if not math.isfinite(loss):
            self.diverged_at_step = step
            self.model.stop_training = True
            log.warning("step %d: loss is %s, training diverged; stopping", step, loss)
            return
        if step % self.log_every == 0 or step == 1:
            lr = float(self.schedule(step - 1))
            log.info(
                "step %d loss %.4f lr %.2e tokens/s %.0f", step, loss, lr, self.tokens_per_second()
            )
        if step >= self.train_steps:
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
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

    def __init__(self, directory: str, every: int, is_chief: bool):
        super().__init__()
        self.directory = directory
        self.every = every
        self.is_chief = is_chief
        self._manager = None

    def on_train_begin(self, logs=None):
        ckpt = tf.train.Checkpoint(model=self.model, optimizer=self.model.optimizer)
        directory = (
            self.directory
            if self.is_chief
            else (posixpath.join(self.directory, f".worker-tmp-{uuid.uuid4().hex[:8]}"))
        )
        self._manager = tf.train.CheckpointManager(ckpt, directory, max_to_keep=3)

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if step % self.every == 0:
            self._manager.save(checkpoint_number=step)
            if not self.is_chief:
                tf.io.gfile.rmtree(self._manager.directory)


class PreemptibleBackup(keras.callbacks.BackupAndRestore):
    """BackupAndRestore every `save_freq` steps that also backs up and stops when preempted.

    A SIGTERM reaches one worker; the others must stop at the same step, because the backup is
    a collective save under MultiWorkerMirroredStrategy. So at every step end all workers sum
    their preemption flags (`agree`, one scalar all-reduce); when the sum is non-zero each takes
    the backup and raises `Preempted`.
    """

    def __init__(self, backup_dir: str, save_freq: int, watch: PreemptionWatch, agree):
        # The backup outlives fit: it is removed only once the Model is exported, so a job that
        # fails while exporting resumes at its last step instead of training again from 0.
        super().__init__(backup_dir=backup_dir, save_freq=save_freq, delete_checkpoint=False)
        self.watch = watch
        self.agree = agree  # local flag (0.0/1.0) -> the sum over all workers
        self.initial_step = 0

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)  # restores the backup, if any
        self.initial_step = int(self.model.optimizer.iterations.numpy())
        if self.initial_step:
            log.info("resumed at step %d from the backup in %s", self.initial_step, self.backup_dir)

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        if self.agree(1.0 if self.watch.requested else 0.0) > 0:
            step = int(self.model.optimizer.iterations.numpy())
            self._backup(epoch=self._current_epoch, batch=batch)
            log.warning("preempted: backed up at step %d; exiting %d", step, EXIT_PREEMPTED)
            raise Preempted(step)

    def on_train_end(self, logs=None):
        # A non-chief worker's write folder (backup/workertemp_<i>) is made when training starts
        # but only removed after a save; an attempt that saves nothing would leave it behind.
        state = self._training_state
        if state.write_checkpoint_manager is not state.read_checkpoint_manager:
            scratch = state.write_checkpoint_manager.directory
            if tf.io.gfile.exists(scratch):
                tf.io.gfile.rmtree(scratch)
        super().on_train_end(logs)


def preemption_agreement(strategy: tf.distribute.Strategy, workers: int):
    """A function: this worker's flag -> the sum of all workers' flags (all-reduce when >1)."""
    if workers <= 1:
        return lambda flag: flag

    @tf.function
    def all_reduce(flag):
        def replica_fn(value):
            ctx = tf.distribute.get_replica_context()
            # identity places the value on this replica's device: all_reduce reduces to there.
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(value))

        per_replica = strategy.run(replica_fn, args=(flag,))
        return strategy.experimental_local_results(per_replica)[0]

    return lambda flag: float(all_reduce(tf.constant(flag, tf.float32)))


class InjectFault(keras.callbacks.Callback):
    """Test-only: signals this process after `fault.step` when training started from step 0."""

    def __init__(self, fault: Fault, task_index: int):
        super().__init__()
        self.fault = fault
        self.armed = fault.worker == task_index
        self._checked = False

    def on_train_batch_begin(self, batch, logs=None):
        if not self._checked:  # after every on_train_begin, so after the backup's restore
            self._checked = True
            self.armed = self.armed and int(self.model.optimizer.iterations.numpy()) == 0

    def on_train_batch_end(self, batch, logs=None):
        if self.armed and int(self.model.optimizer.iterations.numpy()) == self.fault.step:
            name = self.fault.signal_name
            log.warning("fault injection: SIG%s at step %d", name, self.fault.step)
            os.kill(os.getpid(), getattr(signal, f"SIG{name}"))


def _device_kind() -> tuple[str, tuple[int, int] | None]:
    """("gpu", compute capability) for a GPU host, else ("cpu", None)."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "cpu", None
    details = tf.config.experimental.get_device_details(gpus[0])
    return "gpu", details.get("compute_capability")


def check_manifest(manifest: dict[str, Any], cfg: Config) -> None:
    """The Examples were cut for this model: same window length and vocabulary size."""
    for field in ("seq_len", "vocab_size"):
        have, want = manifest[field], getattr(cfg.model, field)
        if have != want:
            raise UserError(
                f"examples: manifest {field}={have} but model.{field}={want}; re-run tokenize with "
                f"the same config or pass --set model.{field}={have}"
            )


def _datasets(strategy, examples_dir: str, manifest: dict[str, Any], cfg: Config):
    """Distributed (train, eval, eval_steps); eval is None when the eval split is under a batch."""
    t = cfg.train
    train_files = data.split_files(examples_dir, manifest, "train")

    def train_fn(ctx):
        return data.make_dataset(
            train_files,
            cfg.model.seq_len,
            t.batch_size,
            shuffle=True,
            seed=t.seed,
            shuffle_buffer=t.shuffle_buffer,
            repeat=True,
            input_context=ctx,
        )

    train_ds = strategy.distribute_datasets_from_function(train_fn)
    global_batch = config_lib.global_batch_size(t.batch_size, strategy.num_replicas_in_sync)
    eval_windows = manifest["splits"].get("eval", {}).get("windows", 0)
    eval_steps = min(t.eval_batches, eval_windows // global_batch)
    if eval_steps == 0:
        log.warning(
            "eval split: %d windows, under one batch of %d; no validation",
            eval_windows,
            global_batch,
        )
        return train_ds, None, 0
    eval_files = data.split_files(examples_dir, manifest, "eval")

    def eval_fn(ctx):  # the same eval_steps batches every validation; a pipeline feeds replicas
        return data.make_dataset(
            eval_files, cfg.model.seq_len, t.batch_size, input_context=ctx
        ).take(eval_steps * ctx.num_replicas_in_sync // ctx.num_input_pipelines)

    return train_ds, strategy.distribute_datasets_from_function(eval_fn), eval_steps


def build_optimizer(
    cfg: Config, global_batch: int, policy: str = "float32"
) -> tuple[keras.optimizers.Optimizer, Any]:
    """AdamW with a warmup+cosine schedule whose peak LR is scaled to the global batch.

    Under mixed_float16 it is wrapped in a dynamic LossScaleOptimizer: float16 gradients of a
    small loss underflow. bfloat16 has float32's exponent range and needs no loss scaling.
    """
    t = cfg.train
    peak = config_lib.scaled_learning_rate(t.learning_rate, global_batch, t.reference_batch_size)
    schedule = WarmupCosine(peak, t.warmup_steps, t.train_steps, t.min_lr_ratio)
    optimizer = keras.optimizers.AdamW(
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


def _compiled_model(strategy, cfg: Config, global_batch: int, policy: str, jit_compile: bool):
    """(model, optimizer, schedule), created under the strategy's scope and compiled."""
    with strategy.scope():
        gpt = model.build_gpt(cfg.model)
        optimizer, schedule = build_optimizer(cfg, global_batch, policy)
        gpt.compile(
            optimizer=optimizer,
            jit_compile=jit_compile,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        # Logged metrics are already global means; the default "sum" would add them up again
        # across MultiWorkerMirrored workers (loss x workers).
        gpt.distribute_reduction_method = "first"
    return gpt, optimizer, schedule


def _fit(gpt, cfg, datasets, work_dir, is_chief, monitor, backup, fault_cb) -> None:
    """Run fit in epochs of checkpoint_every steps so that validation happens that often.

    `backup` (PreemptibleBackup) restores in on_train_begin, before the callbacks after it start.
    """
    t = cfg.train
    callbacks = [
        *([fault_cb] if fault_cb else []),  # first: the backup sees its signal in the same step
        backup,
        monitor,
        PeriodicCheckpoint(posixpath.join(work_dir, "checkpoints"), t.checkpoint_every, is_chief),
        keras.callbacks.TensorBoard(
            log_dir=posixpath.join(work_dir, "logs"), update_freq=t.log_every, profile_batch=0
        ),
    ]
    steps_per_epoch = min(t.checkpoint_every, t.train_steps)
    train_ds, eval_ds, eval_steps = datasets
    gpt.fit(
        train_ds,
        validation_data=eval_ds,
        validation_steps=eval_steps or None,
        epochs=math.ceil(t.train_steps / steps_per_epoch),
        steps_per_epoch=steps_per_epoch,
        callbacks=callbacks,
        verbose=0,
    )


def _write_model_dir(gpt, cfg, tokenizer_path: str, metrics: dict, model_dir: str) -> None:
    """Assemble the Model artifact in a temp sibling, then move it into place."""
    model_dir = model_dir.rstrip("/")
    parent, name = posixpath.split(model_dir)
    tf.io.gfile.makedirs(parent or ".")
    tmp = posixpath.join(parent, f".{name}.tmp-{uuid.uuid4().hex[:8]}")
    tf.io.gfile.makedirs(tmp)
    try:
        export.export_model(gpt, cfg, tokenizer_path, posixpath.join(tmp, "Format-Serving"))
        for fname, payload in (
            ("config.json", config_lib.config_to_dict(cfg)),
            ("train_metrics.json", metrics),
        ):
            with tf.io.gfile.GFile(posixpath.join(tmp, fname), "w") as f:
                json.dump(payload, f, indent=2, sort_keys=True)
        if tf.io.gfile.exists(model_dir):
            tf.io.gfile.rmtree(model_dir)
        tf.io.gfile.rename(tmp, model_dir)
    finally:
        if tf.io.gfile.exists(tmp):  # a failed export leaves nothing a later step could read
            tf.io.gfile.rmtree(tmp)


def _precision_and_xla(cfg: Config, workers: int, replicas: int) -> tuple[str, bool]:
    """The mixed-precision policy, set globally before any layer exists, and whether to use XLA."""
    device_kind, capability = _device_kind()
    policy = config_lib.precision_policy(cfg.train.precision, device_kind, capability)
    keras.mixed_precision.set_global_policy(policy)
    jit = config_lib.use_jit_compile(cfg.train.jit_compile, device_kind, workers, replicas)
    return policy, jit


def _float32_copy(gpt, cfg: Config, policy: str):
    """The model to serve: `gpt` itself, or its weights in a float32 model if trained mixed.

    A SavedModel keeps the compute dtype it was traced with; float16 or bfloat16 matmuls are
    slow on CPU servers (and evaluate pods), and their noise would enter the blessing margin.
    """
    if policy == "float32":
        return gpt
    keras.mixed_precision.set_global_policy("float32")
    serving = model.build_gpt(cfg.model)
    serving.set_weights(gpt.get_weights())
    return serving


def _export(gpt, cfg, tokenizer_path, metrics, model_dir, work_dir, is_chief) -> None:
    """The chief writes the Model artifact; the others export too (saving may need collectives)
    but into scratch space that they remove."""
    scratch = posixpath.join(work_dir, f"scratch-model-{uuid.uuid4().hex[:8]}")
    target = model_dir if is_chief else scratch
    try:
        _write_model_dir(gpt, cfg, tokenizer_path, metrics, target)
    finally:
        if not is_chief and tf.io.gfile.exists(target):
            tf.io.gfile.rmtree(target)


def train(
    examples_dir: str,
    model_dir: str,
    work_dir: str,
    cfg: Config,
    strategy: tf.distribute.Strategy | None = None,
    tf_config: str | None = None,
    watch: PreemptionWatch | None = None,
    fault: Fault | None = None,
) -> dict[str, Any]:
    """Train on the Examples artifact and write the Model artifact; returns train_metrics.

    Raises `Preempted` after backing up when `watch` saw SIGTERM (on any worker). `fault` is a
    test-only fault injection.
    """
    strategy = strategy or choose_strategy(tf_config)
    manifest = data.read_manifest(examples_dir)
    check_manifest(manifest, cfg)
    keras.utils.set_random_seed(cfg.train.seed)
    workers = max(1, _cluster_size(tf_config))
    replicas = strategy.num_replicas_in_sync
    policy, jit = _precision_and_xla(cfg, workers, replicas)
    global_batch = config_lib.global_batch_size(cfg.train.batch_size, replicas)
    datasets = _datasets(strategy, examples_dir, manifest, cfg)
    gpt, optimizer, schedule = _compiled_model(strategy, cfg, global_batch, policy, jit)
    log.info(
        "training %d params, policy %s, jit_compile %s, %d replicas, global batch %d",
        gpt.count_params(),
        policy,
        jit,
        replicas,
        global_batch,
    )
    monitor = TrainMonitor(
        cfg.train.train_steps, cfg.train.log_every, global_batch * cfg.model.seq_len, schedule
    )
    is_chief = _is_chief(tf_config)
    backup = PreemptibleBackup(
        posixpath.join(work_dir, "backup"),
        cfg.train.checkpoint_every,
        watch or PreemptionWatch(),
        preemption_agreement(strategy, workers),
    )
    fault_cb = InjectFault(fault, _task_index(tf_config)) if fault else None
    _fit(gpt, cfg, datasets, work_dir, is_chief, monitor, backup, fault_cb)
    metrics = {
        "steps": int(optimizer.iterations.numpy()),
        "final_loss": monitor.last_loss,
        "diverged": monitor.diverged_at_step is not None,
        "diverged_at_step": monitor.diverged_at_step,
        "tokens_per_second": monitor.tokens_per_second(),
        "global_batch_size": global_batch,
        "replicas": replicas,
        "workers": workers,
    }
    tokenizer_file = manifest.get("tokenizer", {}).get("file", "tokenizer.model")
    tokenizer_path = posixpath.join(examples_dir, tokenizer_file)
    backup_dir = posixpath.join(work_dir, "backup")
    try:
        _export(
            _float32_copy(gpt, cfg, policy),
            cfg,
            tokenizer_path,
            metrics,
            model_dir,
            work_dir,
            is_chief,
        )
    except tf.errors.OpError as err:  # storage hiccups: the backup is kept, a restart exports
        raise ExportFailed(str(err)) from err
    if is_chief and tf.io.gfile.exists(backup_dir):
        with contextlib.suppress(tf.errors.NotFoundError):  # a worker may clean its part too
            tf.io.gfile.rmtree(backup_dir)
    log.info("done: %s", json.dumps(metrics))
    return metrics


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line flags of the trainer."""
    p = argparse.ArgumentParser(prog="python -m trainer.task", description=__doc__.split("\n")[0])
    p.add_argument("--examples", required=True, help="Examples artifact folder (manifest.json)")
    p.add_argument("--model-dir", required=True, help="where the Model artifact is written")
    p.add_argument("--work-dir", required=True, help="checkpoints, backup and logs (resumable)")
    p.add_argument(
        "--config", default=config_lib.DEFAULT_PRESET, help="preset name or a .yaml/.yml file"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. --set train.train_steps=100",
    )
    p.add_argument("--intra-op-threads", type=int, default=0, help="TF intra-op threads (0: TF's)")
    p.add_argument("--inter-op-threads", type=int, default=0, help="TF inter-op threads (0: TF's)")
    testing = p.add_argument_group("testing only: fault injection")
    testing.add_argument(
        "--fault-at-step", type=int, default=0, help="send the fault signal after this step"
    )
    testing.add_argument("--fault-worker", type=int, default=1, help="task index that signals")
    testing.add_argument("--fault-signal", choices=FAULT_SIGNALS, default="KILL")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: user errors print one line to stderr and exit 2."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    tf_config = os.environ.get("TF_CONFIG")  # the process edge: read the environment once
    watch = PreemptionWatch()
    watch.install()
    fault = (
        Fault(args.fault_at_step, args.fault_worker, args.fault_signal)
        if args.fault_at_step > 0
        else None
    )
    try:
        # Thread pools and collectives are configured before anything initializes TensorFlow.
        if args.intra_op_threads:
            tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
        if args.inter_op_threads:
            tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)
        strategy = choose_strategy(tf_config)
        # MultiWorkerMirrored starts TF's coordination agent, whose C++ preemption notifier
        # takes SIGTERM over (it feeds tf.distribute's PreemptionCheckpointHandler): take it back.
        watch.install()
        cfg = config_lib.resolve_config(args.config, args.set)
        if not tf.io.gfile.isdir(args.examples):
            raise UserError(f"examples: folder {args.examples!r} not found; pass --examples DIR")
        train(args.examples, args.model_dir, args.work_dir, cfg, strategy, tf_config, watch, fault)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Preempted:
        return EXIT_PREEMPTED
    except ExportFailed as e:
        log.error("export failed (%s); exiting %d to retry from the backup", e, EXIT_PREEMPTED)
        return EXIT_PREEMPTED
    except (tf.errors.UnavailableError, tf.errors.AbortedError) as e:
        # How collectives report a lost peer worker. The whole group must restart, so this one
        # exits retryably too; exit 1 would make the operator fail the job.
        log.error("lost a peer worker or the cluster (%s); exiting %d", e.message, EXIT_PREEMPTED)
        return EXIT_PREEMPTED
    return 0


if __name__ == "__main__":
    sys.exit(main())
