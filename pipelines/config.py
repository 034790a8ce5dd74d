"""Pipeline-level settings: every knob of the run that is not a model hyperparameter.

Model and training hyperparameters live in `trainer.config`: the CLI or the compiler resolves
them once (preset or YAML file, then `key=value` overrides) and the pipeline carries the resolved
values. The pipeline's parameter defaults are read from `RunConfig()`, never copied.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from components.train.launcher import JobSpec
from trainer.config import DEFAULT_PRESET

DEFAULT_ROOT = Path("runs")  # local run root: serving/, metadata.sqlite, pipeline_root/
KFP_METADATA_SERVICE = "metadata-grpc-service.kubeflow:8080"  # KFP's in-cluster MLMD gRPC service


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
    deadline_seconds: int = 0  # training fails (and its TFJob is deleted) after this; 0: none
    metadata: str = KFP_METADATA_SERVICE  # ML Metadata store: host:port or a SQLite file path
