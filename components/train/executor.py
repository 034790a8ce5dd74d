"""Train: run the trainer on `workers` workers (local processes or a TFJob), collect the Model.

The trainer (`python -m trainer.task`) is the same program in both places; only the launcher
changes. This module builds its command line from the resolved config, describes the job as one
`JobSpec`, picks the launcher (the one place that does), and reads back what the chief wrote.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from components import model_artifact, storage
from components.jobs.launcher import Launcher, LaunchResult
from components.jobs.naming import job_name, run_label
from components.jobs.placement import cluster_placement
from components.jobs.spec import METRICS_FLAG, METRICS_PORT, JobSpec
from contracts.artifacts import (
    BACKUP_DIR,
    CHECKPOINT_DIR,
    EXAMPLES_MANIFEST,
    TRAIN_METRICS,
    WORKER_CHECKPOINT_SCRATCH_PREFIX,
    WORKER_LOGS_DIR,
    WORKER_MODEL_SCRATCH_PREFIX,
    step_work_dir,
)
from contracts.errors import UserError
from contracts.examples import parse_manifest
from contracts.params import LAUNCHERS, TrainJob
from contracts.training import TrainMetrics, parse_metrics
from trainer.config import Config, config_from_dict, config_hash, config_to_dict

if TYPE_CHECKING:
    from components.step import Step

CONTAINER_PYTHON = "python"  # the interpreter on the trainer image's PATH
# The trainer's process environment, set where its workers start (every train job's spec, so
# local workers and TFJob pods alike; the trainer image's ENV says the same) and never inside
# the trainer, which reads no such variable. TF_ENABLE_ONEDNN_OPTS=1: TensorFlow's oneDNN CPU
# kernels on every x86 CPU; TensorFlow 2.19 turns them on by itself only where the CPU has
# AVX512-VNNI, AVX512-BF16, AVX-VNNI or AMX (docs/training.md, "CPU: oneDNN").
WORKER_ENV = {"TF_ENABLE_ONEDNN_OPTS": "1"}


@dataclass(frozen=True)
class TrainResult:
    """What training produced: what the chief wrote, and how the job ran."""

    config_hash: str  # of the resolved config the workers trained with
    metrics: TrainMetrics  # the chief's TRAIN_METRICS
    launched: LaunchResult  # the job: its name, attempts, restarts, wall time, GPU-hours

    @property
    def model_properties(self) -> dict[str, Any]:
        """The Model artifact's lineage properties (and the train step's KFP UI metadata)."""
        m = self.metrics
        return {
            "config_hash": self.config_hash,
            "steps": m.steps,
            "final_loss": None if math.isnan(m.final_loss) else m.final_loss,
            "diverged": int(m.diverged),
            "global_batch_size": m.global_batch_size,
            "tokens_per_second": m.tokens_per_second,
            "precision_policy": m.precision_policy,
            "gpu_hours": self.launched.gpu_hours,
        }

    @property
    def execution_properties(self) -> dict[str, Any]:
        """The train execution's lineage properties."""
        launched = self.launched
        return {
            "job_name": launched.job_name,
            "attempts": launched.attempts,
            "restarts": launched.restarts,
            "wall_seconds": round(launched.wall_seconds, 3),
            "gpu_hours": launched.gpu_hours,
            "worker_image_digests": dict(launched.image_digests),
        }


def execute(
    step: Step,
    *,
    examples_uri: str,
    dataset_version: str,
    config: dict,
    train_job: dict,
    trainer_image: str,
    artifact_root: str,
    model: Any,
) -> None:
    """The train step: run `train_job` on the Examples, record the Model the chief wrote.

    The workers write the Model and the work folder themselves: both must be on gs:// in a
    cluster (a minio:// pipeline root is refused here, before any GPU starts).
    """
    from components import kfp_metadata, lineage

    step.rec.input("examples", lineage.EXAMPLES_TYPE, examples_uri, upstream=True)
    cfg = config_from_dict(config)  # a hand-edited config fails here, on the record
    job = TrainJob.from_dict(train_job)
    step.rec.parameters["config_hash"] = config_hash(cfg)
    check_plan(cfg, job)  # before any worker, or TFJob, exists
    check_cache_inputs(examples_uri, dataset_version)
    step.check_shared(artifact_root, "artifact_root")
    step.check_shared(model.uri, "the pipeline root")
    placement = (
        cluster_placement(step.edge.pod, job.service_account) if job.launcher == "tfjob" else {}
    )
    work_dir = storage.join(artifact_root, step_work_dir(step.edge.run_id, "train"))
    spec = job_spec(
        examples_uri,
        model.uri,
        work_dir,
        cfg,
        launcher=job.launcher,
        run_id=step.edge.run_id,
        image=trainer_image,
        allow_unpinned=allows_unpinned(job.launcher, step.image),
        **job.job_fields(),
        **placement,
    )
    result = run(spec, cfg, model.uri, work_dir, make_launcher(job.launcher, work_dir))
    properties = {**result.model_properties, "dataset_version": dataset_version}
    model.metadata.update(kfp_metadata.recordable(properties))
    step.rec.set(**result.execution_properties)
    step.rec.output("model", lineage.MODEL_TYPE, model.uri, properties)
    step.rec.dataset_version = dataset_version


def check_plan(cfg: Config, job: TrainJob) -> None:
    """Refuse, in one line, a run the workers would fail on at their first step: a global batch
    that does not split into the job's replicas (trainer/run_plan.py), or, where the job's
    node selector names the GPU type (GKE's accelerator label or GPU Feature Discovery's
    product label: trainer/gpus.py), a micro-batch that does not fit its memory
    (trainer/capacity.py). Without such a label the memory is not known here and not checked."""
    from trainer import capacity, gpus
    from trainer.run_plan import plan_run

    if job.launcher == "local":  # one replica a worker process (CPU, or its host's GPUs)
        plan_run(cfg, job.workers)
        return
    replicas = job.workers * max(1, job.gpus_per_worker)
    gpu = gpus.gpu_of_nodes(job.node_selector) if job.gpus_per_worker else None
    if gpu is None:
        plan_run(cfg, replicas)
        return
    capacity.check_fits(capacity.plan_capacity(cfg, replicas, gpu))


def job_spec(
    examples_uri: str,
    model_uri: str,
    work_dir: str,
    cfg: Config,
    *,
    launcher: str,
    run_id: str,
    **options: Any,
) -> JobSpec:
    """The one description of this training job (also what `gptpipe tfjob-manifest` prints).

    `options` are `JobSpec` fields under their own names (workers, gpus_per_worker, cpu, memory,
    image, backoff_limit, active_deadline_seconds, node_selector, tolerations, namespace, owner,
    service_account, image_pull_secrets, ...; `cluster_placement`, components/jobs/placement.py,
    gives the last four); the name, command, run label and the workers' environment (WORKER_ENV,
    under any `env` given) are derived here. `work_dir` holds checkpoints and the
    BackupAndRestore state; it is derived from the run, so a restarted job (or a retried step)
    resumes instead of starting over. A TFJob's chief serves Prometheus metrics on
    `METRICS_PORT`; local workers serve none (docs/monitoring.md).
    """
    local = launcher == "local"
    python = sys.executable if local else CONTAINER_PYTHON
    port = 0 if local else METRICS_PORT
    fields: dict[str, Any] = {"allow_unpinned": local, **options}
    fields["env"] = {**WORKER_ENV, **fields.get("env", {})}
    return JobSpec(
        name=job_name(run_id, "train"),  # one train task per run: a retry re-attaches
        command=trainer_command(python, examples_uri, model_uri, work_dir, cfg, port),
        run_id=run_label(run_id),
        **fields,
    )


def allows_unpinned(launcher: str, step_image: str) -> bool:
    """Whether the train step may start workers from an image not pinned by digest: locally,
    or in a pipeline compiled with `--allow-unpinned`, whose steps' own image (`step_image`,
    from the same lock or its absence) is then a tag too. A pipeline compiled from the lock
    refuses one: its train step would otherwise run whatever a tag points at today."""
    from components import provenance

    return launcher == "local" or not provenance.is_pinned(step_image)


def make_launcher(kind: str, work_dir: str) -> Launcher:
    """The launcher named `kind`; only its module is imported, so a local run loads no Kubernetes.

    `local` keeps every worker's log under `work_dir` when that is on local disk; `tfjob` talks
    to the cluster with the default client (in-cluster, then kubeconfig), and the pods keep the
    logs.
    """
    if kind == "local":
        from components.jobs.local import LocalLauncher

        on_disk = not storage.is_gcs(work_dir)
        return LocalLauncher(log_dir=storage.join(work_dir, WORKER_LOGS_DIR) if on_disk else None)
    if kind == "tfjob":
        from components.jobs.tfjob.launcher import TFJobLauncher

        return TFJobLauncher()
    raise UserError(f"launcher {kind!r} is unknown: use one of {LAUNCHERS}")


def run(
    spec: JobSpec, cfg: Config, model_uri: str, work_dir: str, launcher: Launcher
) -> TrainResult:
    """Run `spec` (built by `job_spec` from `cfg`) with `launcher`; read the Model the chief wrote.

    Once the whole job has succeeded, the training backup in `work_dir` has served its purpose
    and is removed here, not by the workers, with any scratch folder a worker that died left
    (docs/training.md). Raises `LaunchError` if the job fails.
    """
    launched = launcher.run(spec)
    storage.delete_tree(storage.join(work_dir, BACKUP_DIR))
    for scratch in worker_scratch(work_dir):
        storage.delete_tree(scratch)
    # TensorFlow's GCS file system leaves an empty "<folder>/" object per folder it creates;
    # KFP's launcher, downloading the Model for evaluate and push, would make each a file and
    # then fail to create the folder of the same name.
    storage.delete_folder_markers(model_uri)
    model_artifact.require_complete(model_uri)
    metrics_uri = storage.join(model_uri, TRAIN_METRICS)
    metrics = parse_metrics(storage.read_bytes(metrics_uri), metrics_uri)
    return TrainResult(config_hash(cfg), metrics, launched)


def worker_scratch(work_dir: str) -> list[str]:
    """The scratch folders non-chief workers left in `work_dir` (contracts/artifacts.py): each
    worker removes its own, so only a worker killed before it could leaves one."""
    found = set()
    for name in storage.list_tree(work_dir):  # a missing folder is empty
        top, _, rest = name.partition("/")
        if top.startswith(WORKER_MODEL_SCRATCH_PREFIX) and rest:
            found.add(top)
        elif (
            top == CHECKPOINT_DIR
            and rest.startswith(WORKER_CHECKPOINT_SCRATCH_PREFIX)
            and "/" in rest
        ):
            found.add(f"{top}/{rest.split('/')[0]}")
    return [storage.join(work_dir, name) for name in sorted(found)]


def check_cache_inputs(examples_uri: str, dataset_version: str) -> None:
    """Fail if the `dataset_version` input disagrees with the Examples it stands for.

    The pipeline passes both from the tokenize task; a disagreement means a hand-edited
    pipeline, and training on it would file the model under the wrong data.
    """
    manifest_uri = storage.join(examples_uri, EXAMPLES_MANIFEST)
    found = parse_manifest(storage.read_bytes(manifest_uri), manifest_uri).dataset_version
    if found != dataset_version:
        raise UserError(f"dataset_version input {dataset_version!r} is not the Examples' {found!r}")


def trainer_command(
    python: str,
    examples_uri: str,
    model_uri: str,
    work_dir: str,
    cfg: Config,
    metrics_port: int = 0,
) -> list[str]:
    """The command line every worker runs: `python -m trainer.task ...` with the resolved config.

    The config travels as canonical JSON on the command line, so no worker resolves a preset or
    opens a YAML file again. `metrics_port` > 0 makes the chief serve Prometheus metrics there;
    it is a flag, not a config field: where a run is watched from does not change its model.
    """
    config_json = json.dumps(config_to_dict(cfg), sort_keys=True, separators=(",", ":"))
    metrics = [METRICS_FLAG, str(metrics_port)] if metrics_port > 0 else []
    return [
        python,
        "-m",
        "trainer.task",
        "--examples",
        examples_uri,
        "--model-dir",
        model_uri,
        "--work-dir",
        work_dir,
        "--config-json",
        config_json,
        *metrics,
    ]
