"""Pipeline-level settings: every knob of the run that is not a model hyperparameter.

Model and training hyperparameters live in `trainer.config`: the CLI or the compiler resolves
them once (preset or YAML file, then `key=value` overrides) and the pipeline carries the resolved
values. The pipeline's parameter defaults are read from `RunConfig()`, never copied.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from components.jobs.spec import JobSpec
from trainer.config import DEFAULT_PRESET

DEFAULT_ROOT = Path("runs")  # local run root: serving/, metadata.sqlite, pipeline_root/
DAY_SECONDS = 24 * 3600


@dataclass(frozen=True)
class RunConfig:
    """Defaults for one pipeline run."""

    model_name: str = "gpt"  # serving name: models are pushed to <serving root>/<model_name>/
    config: str = DEFAULT_PRESET  # trainer preset or YAML file the CLI resolves by default
    eval_fraction: float = 0.1  # share of the corpus held out for evaluation
    max_nats_per_char: float = 2.2  # blessing threshold on eval loss (tokenizer-independent)
    tolerance: float = 0.01  # a candidate may be this much (relative) worse than the baseline
    launcher: str = "tfjob"  # how training runs: "tfjob" on a cluster, "local" on one machine
    workers: int = 2  # training worker processes (TFJob Worker replicas)
    gpus_per_worker: int = 1  # nvidia.com/gpu per worker on a cluster; 0 locally
    backoff_limit: int = JobSpec.backoff_limit  # restarts allowed after retryable exits (128-255)
    # Training fails, and its TFJob is deleted, after this (runPolicy.activeDeadlineSeconds, so
    # the operator enforces it even when the launcher is gone); 0: no deadline.
    deadline_seconds: int = DAY_SECONDS
    worker_cpu: str = JobSpec.cpu  # CPU of each TFJob worker, request and limit (a quantity)
    worker_memory: str = JobSpec.memory  # memory of each TFJob worker, request and limit
    service_account: str = ""  # TFJob workers' service account; "": the train step's own
    # ML Metadata store: "" for the service KFP names in every step's environment
    # (METADATA_GRPC_SERVICE_HOST and _PORT), host:port or grpcs://host:port, or a SQLite file.
    metadata: str = ""


@dataclass(frozen=True)
class StepResources:
    """CPU and memory of one step's pod: requests and limits (a ResourceQuota needs both)."""

    cpu_request: str  # Kubernetes quantity, e.g. "500m"
    cpu_limit: str  # the step is throttled above this
    memory_request: str  # Kubernetes quantity, e.g. "2Gi"
    memory_limit: str  # the step is OOM-killed above this (exit 137, which Argo may retry)


# Per step, sized for the demo corpus and gpt2-small on a cluster. Tokenize holds the corpus in
# memory (docs/design.md); evaluate runs TensorFlow on CPU over both models; train only
# launches and watches its TFJob, whose workers have their own resources (RunConfig.worker_*).
STEP_RESOURCES = {
    "tokenize": StepResources("2", "4", "8Gi", "8Gi"),
    "train": StepResources("250m", "1", "1Gi", "1Gi"),
    "evaluate": StepResources("2", "4", "8Gi", "8Gi"),
    "push": StepResources("500m", "2", "2Gi", "2Gi"),
    "release": StepResources("100m", "500m", "512Mi", "512Mi"),
}
