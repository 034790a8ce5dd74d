"""Training entry point: `python -m trainer.task`, the program every training worker runs.

    python -m trainer.task --examples DIR --model-dir DIR --work-dir DIR --config-json JSON

Reads the Examples artifact, trains the GPT with Keras `fit` under a distribution strategy
(resumable through BackupAndRestore in the work folder), and has the chief write the Model
artifact. The config arrives resolved, as the JSON of `config_to_dict`. On SIGTERM every worker
backs up at the same step and exits 143, which the operator retries (docs/training.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import posixpath
import sys
from collections.abc import Sequence
from typing import NamedTuple

import tensorflow as tf
import tf_keras as keras

from contracts import records, termination
from contracts.artifacts import (
    BACKUP_DIR,
    CHECKED_SHARDS_DIR,
    CHECKPOINT_DIR,
    EXAMPLES_MANIFEST,
    MODEL_TEXT_SKETCH,
    TRAIN_METRICS,
    TRAIN_TEXT_SKETCH,
)
from contracts.errors import UserError
from contracts.process import exit_without_final_gc
from contracts.progress import Progress
from contracts.training import TrainMetrics, parse_metrics
from trainer import (
    budget,
    cluster,
    data,
    exits,
    export,
    flops,
    model,
    precision,
    restarts,
    run_plan,
    train_step,
)
from trainer import config as config_lib
from trainer.budget import UNPLANNED_STEPS, TimeBudget
from trainer.callbacks import Measured, PeriodicCheckpoint, TrainMonitor
from trainer.config import Config, ConfigError
from trainer.faults import FAULT_SIGNALS, Fault, InjectFault
from trainer.history import TrainHistory
from trainer.metrics_server import MetricsServer
from trainer.optimization import WarmupCosine, build_optimizer
from trainer.preemption import (
    Agreement,
    Preempted,
    PreemptibleBackup,
    PreemptionWatch,
    backed_up_step,
    preemption_agreement,
)
from trainer.telemetry import Telemetry

log = logging.getLogger("trainer")

# The default of --metrics-port, so that `GPTPIPE_METRICS_PORT=9100 gptpipe run --local` can
# turn metrics on for local workers, which inherit the environment (only the chief serves).
METRICS_PORT_ENV = "GPTPIPE_METRICS_PORT"


def train(
    examples_dir: str,
    model_dir: str,
    work_dir: str,
    cfg: Config,
    strategy: tf.distribute.Strategy | None = None,
    tf_config: str | None = None,
    watch: PreemptionWatch | None = None,
    fault: Fault | None = None,
    progress: Progress | None = None,
    metrics_port: int = 0,
) -> TrainMetrics:
    """Train on the Examples artifact and write the Model artifact; returns train_metrics.

    Raises `Preempted` after backing up when `watch` saw SIGTERM (on any worker), and
    `export.ExportFailed` when writing the Model fails. `fault` is a test-only fault injection.
    The chief reports to `progress` and, with a `metrics_port`, serves Prometheus metrics there.
    """
    strategy = strategy or cluster.choose_strategy(tf_config)
    manifest = data.read_manifest(examples_dir)
    data.check_manifest(manifest, cfg)
    keras.utils.set_random_seed(cfg.train.seed)
    workers = max(1, cluster.cluster_size(tf_config))
    replicas = strategy.num_replicas_in_sync
    agree = preemption_agreement(strategy, workers)
    policy, jit = precision.set_precision_and_choose_xla(cfg, workers, replicas, agree)
    plan = run_plan.plan_run(cfg, replicas)
    if cfg.train.max_minutes:  # a restart runs to the length its first attempt planned
        plan = budget.with_kept_plan(plan, work_dir)
    global_batch = plan.global_batch
    resume_step = backed_up_step(_backup_dir(work_dir))
    is_chief = cluster.is_chief(tf_config)
    if is_chief:  # a restart that cannot resume says so, and counts what it lost
        backup_every = cfg.train.checkpoint_every
        restarts.begin(work_dir, _backup_dir(work_dir), resume_step, backup_every, plan.steps)
    checked = posixpath.join(work_dir, CHECKED_SHARDS_DIR)
    datasets = data.distributed_datasets(
        strategy, examples_dir, manifest, cfg, plan, resume_step, checked
    )
    gpt, trainee, optimizer, schedule = compiled_model(strategy, cfg, plan, policy, jit)
    log.info(
        "training %d params, policy %s, jit_compile %s, recompute %s; %s",
        gpt.count_params(),
        policy,
        jit,
        cfg.train.recompute,
        plan.describe(),
    )
    telemetry = _telemetry(is_chief, work_dir, progress, metrics_port)
    monitor = _monitor(cfg, plan, work_dir, schedule, telemetry, jit, workers)
    backup = PreemptibleBackup(
        _backup_dir(work_dir),
        cfg.train.checkpoint_every,
        watch or PreemptionWatch(),
        agree,
        check_every=cfg.train.preemption_check_every,
    )
    fault_cb = (
        InjectFault(fault, cluster.task_index(tf_config), _backup_dir(work_dir), model_dir)
        if fault
        else None
    )
    planner = _budget(cfg, plan, work_dir, is_chief, agree, workers, schedule, monitor)
    callbacks = _callbacks(cfg, work_dir, is_chief, monitor, backup, fault_cb, planner)
    try:
        _fit(trainee, cfg, plan, datasets, callbacks)
    except Preempted:
        # fit skips on_train_end when a callback raises: keep this attempt's curve up to its
        # backup, and its time, for the attempt that resumes there.
        monitor.on_train_end()
        raise
    finally:
        telemetry.close()
    metrics = _attempt_metrics(
        _metrics(optimizer, monitor, global_batch, replicas, workers, policy),
        monitor,
        work_dir,
        is_chief,
    )
    tokenizer_path = posixpath.join(examples_dir, manifest.tokenizer.file)
    parts = export.ModelParts(
        gpt, cfg, tokenizer_path, metrics, monitor.history, _extras(examples_dir)
    )
    if fault_cb:
        fault_cb.before_export()
    export.write_model_artifact(parts, model_dir, work_dir, is_chief)
    if fault_cb:
        fault_cb.after_export()
    _export_barrier(agree)
    # The backup stays: the train step removes it once the whole job has succeeded. Removing
    # it here, after peers may have exited 0, would let a chief killed mid-removal restart
    # alone (ExitCode never recreates a Succeeded pod) and wait for them until the deadline.
    log.info("done: %s", records.to_json(metrics))
    return metrics


def _extras(examples_dir: str) -> dict[str, str]:
    """What the SavedModel carries from the Examples besides its tokenizer: the sketch of the
    train text, so that a later evaluation can tell how much of its eval text this model
    trained on (Examples written before the sketch existed have none)."""
    sketch = posixpath.join(examples_dir, TRAIN_TEXT_SKETCH)
    return {MODEL_TEXT_SKETCH: sketch} if tf.io.gfile.exists(sketch) else {}


def _telemetry(
    is_chief: bool, work_dir: str, progress: Progress | None, metrics_port: int
) -> Telemetry:
    """The chief's publishers (TensorBoard, Prometheus, progress); nothing on other workers."""
    if not is_chief:
        return Telemetry.off()
    gpus = bool(tf.config.list_physical_devices("GPU"))
    metrics = MetricsServer(metrics_port, gpus) if metrics_port > 0 else None
    return Telemetry(work_dir, metrics, progress)


def _monitor(
    cfg: Config,
    plan: run_plan.RunPlan,
    work_dir: str,
    schedule: WarmupCosine,
    telemetry: Telemetry,
    jit: bool,
    workers: int,
) -> TrainMonitor:
    """The monitor, continuing the curve an earlier attempt kept in the work folder, measuring
    what this host can (trainer/train_step.py says why the rest is left out)."""
    replicas = plan.replicas
    history = TrainHistory(precision.device_name(), replicas, plan.global_batch)
    history.load(work_dir)
    peak = flops.peak_flops(history.device)
    timed = train_step.times_steps(jit, precision.device_kind()[0])
    measured = Measured(
        input_wait=timed,
        allreduce=timed and workers > 1,
        flops_per_token=flops.flops_per_token(cfg.model),
        peak_flops=peak * replicas if peak else None,
    )
    return TrainMonitor(
        plan.steps or UNPLANNED_STEPS,
        cfg.train.log_every,
        plan.global_batch_tokens,
        schedule,
        history,
        telemetry,
        measured,
    )


def _export_barrier(agree: Agreement) -> None:
    """Wait until every worker has written its export (one more all-reduce in the ring).

    No worker may exit 0 before the chief has written the Model: under `restartPolicy: ExitCode`
    a Succeeded pod is never recreated, so a chief that died during its export would restart
    alone and wait for them forever. Here the others are still in the group: when the chief
    dies they lose it (UnavailableError, exit 143) and the whole job restarts, resumes from the
    backup (kept until this point) at its last step and only exports again.
    """
    try:
        agree(0.0)
    except tf.errors.OpError as err:
        raise export.ExportFailed(f"a worker failed to export: {err.message}") from err


def _backup_dir(work_dir: str) -> str:
    return posixpath.join(work_dir, BACKUP_DIR)


class Compiled(NamedTuple):
    """What `compiled_model` builds under the strategy's scope."""

    gpt: keras.Model  # the GPT, exported after training
    trainee: train_step.InstrumentedGPT  # the GPT with the measuring train step, which fit runs
    optimizer: keras.optimizers.Optimizer
    schedule: WarmupCosine


def compiled_model(
    strategy: tf.distribute.Strategy, cfg: Config, plan: run_plan.RunPlan, policy: str, jit: bool
) -> Compiled:
    """The model as the trainer trains it, built under the strategy's scope; its `trainee`,
    which shares the `gpt`'s weights, is compiled for `fit` (also bench/gpu_bench.py's).
    train.recompute=blocks recomputes its blocks in training only: the export builds a fresh
    model (export.serving_model), the weights and checkpoints are the same either way."""
    with strategy.scope():
        gpt = model.build_gpt(
            cfg.model,
            xla_kernels=config_lib.use_xla_kernels(cfg.train.jit_compile),
            recompute=cfg.train.recompute == "blocks",
        )
        timed = train_step.times_steps(jit, precision.device_kind()[0])
        trainee = train_step.instrumented(gpt, timed=timed, accumulation=plan.accumulation)
        optimizer, schedule = build_optimizer(cfg, plan, policy)
        trainee.compile(
            optimizer=optimizer,
            jit_compile=jit,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        # Logged metrics are already global means; the default "sum" would add them up again
        # across MultiWorkerMirrored workers (loss x workers).
        trainee.distribute_reduction_method = "first"
    return Compiled(gpt, trainee, optimizer, schedule)


def _budget(
    cfg: Config,
    plan: run_plan.RunPlan,
    work_dir: str,
    is_chief: bool,
    agree: Agreement,
    workers: int,
    schedule: WarmupCosine,
    monitor: TrainMonitor,
) -> TimeBudget | None:
    """The time budget's planner (train.max_minutes), or None without one."""
    if not cfg.train.max_minutes:
        return None

    def set_length(steps: int) -> None:
        schedule.set_total_steps(steps)
        monitor.train_steps = steps

    return TimeBudget(
        cfg.train.max_minutes * 60,
        plan.steps,
        plan.warmup_steps,
        set_length,
        agree,
        budget.agreed_copies(workers, plan.replicas),
        work_dir,
        is_chief,
    )


def _callbacks(
    cfg: Config,
    work_dir: str,
    is_chief: bool,
    monitor: TrainMonitor,
    backup: PreemptibleBackup,
    fault_cb: InjectFault | None,
    planner: TimeBudget | None = None,
) -> list[keras.callbacks.Callback]:
    """The callbacks in the order they must run.

    `backup` restores in on_train_begin; the callbacks read the restored step at their first
    batch. The time budget plans before the monitor checks for the last step. The monitor runs
    before the saves, so that their time at an epoch's end stays out of its throughput. It
    writes TensorBoard's logs itself (trainer/telemetry.py).
    """
    t = cfg.train
    return [
        *([fault_cb] if fault_cb else []),  # first: the backup sees its signal in the same step
        *([planner] if planner else []),
        monitor,
        backup,
        PeriodicCheckpoint(posixpath.join(work_dir, CHECKPOINT_DIR), t.checkpoint_every, is_chief),
    ]


def _fit(
    gpt: keras.Model,
    cfg: Config,
    plan: run_plan.RunPlan,
    datasets: data.DistributedData,
    callbacks: list[keras.callbacks.Callback],
) -> None:
    """Run fit in epochs of checkpoint_every steps so that validation happens that often."""
    steps = plan.steps or UNPLANNED_STEPS  # a time budget alone stops it (trainer/budget.py)
    steps_per_epoch = min(cfg.train.checkpoint_every, steps)
    gpt.fit(
        datasets.train,
        validation_data=datasets.eval,
        validation_steps=datasets.eval_steps or None,
        epochs=math.ceil(steps / steps_per_epoch),
        steps_per_epoch=steps_per_epoch,
        callbacks=callbacks,
        verbose=0,
    )


def _metrics(
    optimizer: keras.optimizers.Optimizer,
    monitor: TrainMonitor,
    global_batch: int,
    replicas: int,
    workers: int,
    policy: str,
) -> TrainMetrics:
    return TrainMetrics(
        steps=int(optimizer.iterations.numpy()),
        final_loss=monitor.last_loss,
        diverged=monitor.diverged_at_step is not None,
        diverged_at_step=monitor.diverged_at_step,
        tokens_per_second=monitor.tokens_per_second(),
        global_batch_size=global_batch,
        replicas=replicas,
        workers=workers,
        precision_policy=policy,
    )


def _attempt_metrics(
    metrics: TrainMetrics, monitor: TrainMonitor, work_dir: str, is_chief: bool
) -> TrainMetrics:
    """The metrics of the training behind these weights, kept in the work folder for restarts.

    A restart that resumes from a backup taken at the last step trains nothing and only exports
    again (after a failed export); its own loss is NaN and its throughput 0, so it reports the
    metrics the chief saved, before its export, in the attempt that trained.
    """
    saved = posixpath.join(work_dir, TRAIN_METRICS)
    if monitor.batches == 0 and tf.io.gfile.exists(saved):
        with tf.io.gfile.GFile(saved, "r") as f:
            return parse_metrics(f.read(), saved)
    if is_chief:
        tf.io.gfile.makedirs(work_dir)
        with tf.io.gfile.GFile(saved, "w") as f:
            f.write(records.to_json(metrics))
    return metrics


def config_from_json(text: str) -> Config:
    """The run's Config from `--config-json`: the JSON of `config_to_dict`, resolved upstream."""
    try:
        sections = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(
            f"--config-json: not valid JSON ({e}); pass the JSON of trainer.config.config_to_dict"
        ) from None
    if not isinstance(sections, dict) or not all(isinstance(v, dict) for v in sections.values()):
        raise UserError(
            "--config-json: must be a JSON object of 'model' and 'train' objects "
            "(trainer.config.config_to_dict)"
        )
    try:
        return config_lib.config_from_dict(sections)
    except ConfigError as e:
        raise ConfigError(f"--config-json: {e}") from None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line flags of the trainer."""
    p = argparse.ArgumentParser(
        prog="python -m trainer.task", description=__doc__.split("\n")[0], allow_abbrev=False
    )
    p.add_argument(
        "--examples", required=True, help=f"Examples artifact folder ({EXAMPLES_MANIFEST})"
    )
    p.add_argument("--model-dir", required=True, help="where the Model artifact is written")
    p.add_argument("--work-dir", required=True, help="checkpoints, backup and logs (resumable)")
    p.add_argument(
        "--config-json",
        required=True,
        metavar="JSON",
        help="the run's resolved config: the JSON of trainer.config.config_to_dict(cfg)",
    )
    p.add_argument("--intra-op-threads", type=int, default=0, help="TF intra-op threads (0: TF's)")
    p.add_argument("--inter-op-threads", type=int, default=0, help="TF inter-op threads (0: TF's)")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help=f"the chief serves Prometheus metrics on this port at /metrics (0: off; default "
        f"${METRICS_PORT_ENV}, else 0)",
    )
    testing = p.add_argument_group("testing only: fault injection")
    testing.add_argument(
        "--fault-at-step", type=int, default=0, help="send the fault signal after this step"
    )
    testing.add_argument("--fault-worker", type=int, default=1, help="task index that signals")
    testing.add_argument("--fault-signal", choices=FAULT_SIGNALS, default="KILL")
    testing.add_argument(
        "--fault-at-export",
        action="store_true",
        help="send the fault signal once this worker has written its export (before the barrier)",
    )
    testing.add_argument(
        "--fault-lose-backup",
        action="store_true",
        help="remove the backup folder before sending the fault signal",
    )
    testing.add_argument(
        "--fault-no-space",
        action="store_true",
        help="instead of a signal, fail that write as a full disk does: the backup after "
        "--fault-at-step, or the export with --fault-at-export",
    )
    return p.parse_args(argv)


def metrics_port(flag: int | None, env_value: str | None) -> int:
    """The port to serve metrics on: --metrics-port, else $GPTPIPE_METRICS_PORT, else 0 (off)."""
    text = str(flag) if flag is not None else env_value or "0"
    if not text.isdigit() or int(text) > 65535:
        raise UserError(
            f"metrics port {text!r} (--metrics-port or ${METRICS_PORT_ENV}) is not a port: "
            "give 1-65535, or 0 for none"
        )
    return int(text)


def _run(
    args: argparse.Namespace,
    tf_config: str | None,
    watch: PreemptionWatch,
    progress: Progress,
    port_env: str | None,
) -> None:
    """Set TensorFlow up in the order it needs, read the config and the Examples, and train."""
    # Thread pools and collectives are configured before anything initializes TensorFlow.
    if args.intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
    if args.inter_op_threads:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)
    strategy = cluster.choose_strategy(tf_config)
    # MultiWorkerMirrored starts TF's coordination agent, whose C++ preemption notifier
    # takes SIGTERM over (it feeds tf.distribute's PreemptionCheckpointHandler): take it back.
    watch.install()
    cfg = config_from_json(args.config_json)
    if not tf.io.gfile.isdir(args.examples):
        raise UserError(f"examples: folder {args.examples!r} not found; pass --examples DIR")
    fault = (
        Fault(
            args.fault_at_step,
            args.fault_worker,
            args.fault_signal,
            args.fault_at_export,
            args.fault_no_space,
            args.fault_lose_backup,
        )
        if args.fault_at_step > 0 or args.fault_at_export
        else None
    )
    train(
        args.examples,
        args.model_dir,
        args.work_dir,
        cfg,
        strategy,
        tf_config,
        watch,
        fault,
        progress,
        metrics_port(args.metrics_port, port_env),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: user errors print one line to stderr and exit 2, failures no restart can mend exit
    3, retryable ones exit 143 (docs/training.md, "Exit codes")."""
    args = parse_args(argv)
    exit_without_final_gc()  # a worker's end is the train step's wall time too
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    tf_config = os.environ.get("TF_CONFIG")  # the process edge: read the environment once
    progress = Progress.from_env(os.environ, "train")
    port_env = os.environ.get(METRICS_PORT_ENV)
    message_file = os.environ.get(termination.WORKER_MESSAGE_ENV)  # why we stop, for the launcher
    watch = PreemptionWatch()
    watch.install()
    try:
        _run(args, tf_config, watch, progress, port_env)
    except Exception as e:  # noqa: BLE001 -- raised again unless it is one a worker exits on
        return exits.exit_code(e, message_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
