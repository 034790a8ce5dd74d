"""Pipeline-level settings: where a run reads and writes, and what each step's pod gets.

Each step's own knobs live in its parameter object (`contracts.params`), and model and training
hyperparameters in `trainer.config`: the CLI or the compiler resolves both once and the pipeline
carries the resolved values. The pipeline's parameter defaults are read from those objects and
`RunConfig()`, never copied.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainer.config import DEFAULT_PRESET

DEFAULT_ROOT = Path("runs")  # local run root: serving/, metadata.sqlite, pipeline_root/


@dataclass(frozen=True)
class RunConfig:
    """Defaults for one pipeline run."""

    model_name: str = "gpt"  # serving name: models are pushed to <serving root>/<model_name>/
    config: str = DEFAULT_PRESET  # trainer preset or YAML file the CLI resolves by default
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
# launches and watches its TFJob, whose workers have their own resources (TrainJob).
STEP_RESOURCES = {
    "tokenize": StepResources("2", "4", "8Gi", "8Gi"),
    "train": StepResources("250m", "1", "1Gi", "1Gi"),
    "evaluate": StepResources("2", "4", "8Gi", "8Gi"),
    "push": StepResources("500m", "2", "2Gi", "2Gi"),
    "release": StepResources("100m", "500m", "512Mi", "512Mi"),
}
