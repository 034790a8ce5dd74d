"""The launcher interface alone: a `Launcher` runs a `JobSpec` to the end and returns a
`LaunchResult`, or raises a `LaunchError` (components/jobs/errors.py).

Every implementation runs the same `JobSpec` with the same semantics (components/jobs/spec.py
says them) and returns the same `LaunchResult`. This module imports no implementation; each
imports it, and the train executor (`executor.make_launcher`) is the one place that picks one
for training (`gptpipe gpu-bench`, pipelines/cli/gpu_bench.py, runs only as a TFJob), as KFP's
`kfp/local/task_handler_interface.py` keeps the interface apart from its handlers:

- `local` (components/jobs/local.py): worker processes on this machine, with TF_CONFIG
  written as the Training Operator writes it. For tests, laptops and `kfp.local`.
- `tfjob` (components/jobs/tfjob/launcher.py): a Kubeflow Training Operator v1 TFJob on the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # a type only: JobSpec's home is spec.py, and nobody imports it from here
    from components.jobs.spec import JobSpec


@dataclass(frozen=True)
class LaunchResult:
    """What a finished, successful job reports, whichever launcher ran it."""

    launcher: str  # "local" or "tfjob"
    job_name: str  # JobSpec.name
    workers: int  # worker replicas
    attempts: int  # times the worker group was started (1 + restarts)
    restarts: int  # group restarts after retryable exits
    wall_seconds: float  # from the first start to success
    gpu_hours: float  # workers * gpus_per_worker * wall_seconds / 3600 (0 locally)
    image_digests: Mapping[str, str] = field(default_factory=dict)  # pod -> observed sha256 digest
    reattached: bool = False  # the launcher found the job already running (a retried launcher)


class Launcher(Protocol):
    """Runs a `JobSpec` to the end: local worker processes or a TFJob, same semantics."""

    def run(self, spec: JobSpec, *, timeout_seconds: float | None = None) -> LaunchResult:
        """Run `spec` to success and report it; raise `LaunchError` (or a subclass) if it fails.

        `timeout_seconds` is the launcher's own limit on top of `spec.active_deadline_seconds`.
        """
        ...
