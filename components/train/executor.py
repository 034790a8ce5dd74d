"""Train: run the trainer on `workers` workers (local processes or a TFJob), collect the Model.

The trainer (`python -m trainer.task`) is the same program in both places; only the launcher
changes. This module builds its command line from the config route (preset + overrides), hands a
`JobSpec` to the launcher, and reads back what the chief wrote.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from components import provenance, storage
from components.train import launcher as launchers
from components.train.tfjob import job_name
from trainer.config import config_hash, resolve_config
from contracts.errors import UserError

CONTAINER_PYTHON = "python"  # the interpreter on the trainer image's PATH


@dataclass(frozen=True)
class TrainJob:
    """How to run the training job; the same description for both launchers."""

    launcher: str = "local"  # "local" worker processes or a "tfjob"
    workers: int = 1  # trainer workers (MultiWorkerMirroredStrategy when > 1)
    gpus_per_worker: int = 0  # nvidia.com/gpu per worker (tfjob only)
    image: str = ""  # trainer image by digest (tfjob only)
    backoff_limit: int = launchers.JobSpec.backoff_limit  # restarts after retryable exits
    deadline_seconds: int | None = None  # the job fails after this long
    node_selector: Mapping[str, str] = field(default_factory=dict)  # tfjob pod nodeSelector
    tolerations: Sequence[Mapping[str, Any]] = ()  # tfjob pod tolerations
    namespace: str = "kubeflow"  # namespace of the TFJob (the launcher pod's, in a cluster)
    owner: launchers.OwnerPod | None = None  # the launcher's pod; deleting it deletes the TFJob


@dataclass(frozen=True)
class TrainResult:
    """What training produced, split by where lineage records it."""

    model_properties: dict  # on the Model artifact: steps, loss, config hash...
    execution_properties: dict  # on the train execution: job name, GPU-hours, restarts...


def run(
    examples_uri: str,
    model_uri: str,
    work_dir: str,
    *,
    config: str,
    overrides: Sequence[str],
    job: TrainJob,
    run_id: str,
) -> TrainResult:
    """Train on the Examples at `examples_uri`; the chief writes the Model to `model_uri`.

    `work_dir` holds checkpoints and the BackupAndRestore state; it is derived from the run, so a
    restarted job (or a retried step) resumes instead of starting over.
    """
    cfg = resolve_config(config, overrides)
    spec = job_spec(
        examples_uri,
        model_uri,
        work_dir,
        config=config,
        overrides=overrides,
        job=job,
        run_id=run_id,
    )
    log_dir = None  # tfjob: the pods keep their logs; local: beside the checkpoints when on disk
    if job.launcher == "local":
        log_dir = storage.join(work_dir, "worker-logs") if not storage.is_gcs(work_dir) else None
    launched = launchers.launch(spec, job.launcher, log_dir=log_dir)
    metrics = json.loads(storage.read_bytes(storage.join(model_uri, "train_metrics.json")))
    model_properties = {
        "config_hash": config_hash(cfg),
        "steps": metrics.get("steps"),
        "final_loss": _json_number(metrics.get("final_loss")),
        "diverged": int(bool(metrics.get("diverged"))),
        "global_batch_size": metrics.get("global_batch_size"),
        "tokens_per_second": metrics.get("tokens_per_second"),
        "gpu_hours": launched.gpu_hours,  # the step's output metadata in the KFP UI, too
    }
    execution_properties = {
        "job_name": launched.job_name,
        "attempts": launched.attempts,
        "restarts": launched.restarts,
        "wall_seconds": round(launched.wall_seconds, 3),
        "gpu_hours": launched.gpu_hours,
        "worker_image_digests": dict(launched.image_digests),
    }
    return TrainResult(model_properties, execution_properties)


def check_cache_inputs(
    examples_uri: str,
    dataset_version: str,
    expected_config_hash: str,
    *,
    config: str,
    overrides: Sequence[str],
) -> None:
    """Fail if the cache-key inputs disagree with the Examples and the config they stand for.

    The pipeline passes both from the tokenize task; a disagreement means a hand-edited
    pipeline, and training on it would file the model under the wrong data or config.
    """
    manifest = json.loads(storage.read_bytes(storage.join(examples_uri, "manifest.json")))
    found = manifest.get("dataset_version")
    if found != dataset_version:
        raise UserError(f"dataset_version input {dataset_version!r} is not the Examples' {found!r}")
    resolved = config_hash(resolve_config(config, overrides))
    if resolved != expected_config_hash:
        raise UserError(
            f"config_hash input {expected_config_hash!r} is not that of config {config!r} with "
            f"overrides {list(overrides)} ({resolved!r})"
        )


def job_spec(
    examples_uri: str,
    model_uri: str,
    work_dir: str,
    *,
    config: str,
    overrides: Sequence[str],
    job: TrainJob,
    run_id: str,
) -> launchers.JobSpec:
    """The launcher's description of this job (also what `gptpipe tfjob-manifest` prints)."""
    resolve_config(config, overrides)  # a bad key fails here, not in the pods
    python = sys.executable if job.launcher == "local" else CONTAINER_PYTHON
    return launchers.JobSpec(
        name=job_name(run_id, "train"),  # one train task per run: a retry re-attaches
        command=trainer_command(python, examples_uri, model_uri, work_dir, config, overrides),
        image=job.image,
        namespace=job.namespace,
        run_id=_label_safe(run_id),
        workers=job.workers,
        gpus_per_worker=job.gpus_per_worker,
        backoff_limit=job.backoff_limit,
        active_deadline_seconds=job.deadline_seconds,
        node_selector=dict(job.node_selector),
        tolerations=tuple(job.tolerations),
        owner=job.owner,
        allow_unpinned=job.launcher == "local",
    )


def cluster_placement(
    env: Mapping[str, str], namespace_file: str = provenance.SERVICE_ACCOUNT_NAMESPACE
) -> dict[str, Any]:
    """Where the TFJob goes when the launcher runs in a KFP pod: its namespace, owned by the pod.

    KFP v2 gives every executor pod KFP_POD_NAME and KFP_POD_UID (downward API); outside a pod
    this returns {} and the TrainJob defaults apply.
    """
    placement: dict[str, Any] = {}
    if env.get("KFP_POD_NAME") and env.get("KFP_POD_UID"):
        placement["owner"] = launchers.OwnerPod(env["KFP_POD_NAME"], env["KFP_POD_UID"])
    try:
        with open(namespace_file, encoding="utf-8") as f:
            placement["namespace"] = f.read().strip()
    except OSError:
        pass
    return placement


def trainer_command(
    python: str,
    examples_uri: str,
    model_uri: str,
    work_dir: str,
    config: str,
    overrides: Sequence[str],
) -> list[str]:
    """The command line every worker runs: `python -m trainer.task ...`."""
    command = [
        python,
        "-m",
        "trainer.task",
        "--examples",
        examples_uri,
        "--model-dir",
        model_uri,
        "--work-dir",
        work_dir,
        "--config",
        config,
    ]
    for override in overrides:
        command += ["--set", override]
    return command


def _label_safe(value: str) -> str:
    cleaned = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in value)[:63]
    return cleaned.strip("-_.")


def _json_number(value: Any) -> Any:
    return value if isinstance(value, int | float) and value == value else None
