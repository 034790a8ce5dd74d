"""What tests/doubles/kfp/backend.py reports about a run: per task state, pods, outputs, logs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SUCCEEDED, FAILED, CACHED, SKIPPED, CANCELED = (
    "SUCCEEDED",
    "FAILED",
    "CACHED",
    "SKIPPED",
    "CANCELED",
)


@dataclass
class Attempt:
    """One pod of a task (Argo creates a new pod for every retry)."""

    pod_name: str
    pod_uid: str
    exit_code: int
    error: str
    log: str


@dataclass
class ArtifactResult:
    """An output artifact as ML Metadata recorded it."""

    uri: str
    metadata: dict[str, Any]  # the custom properties: the executor's metadata, display_name...


@dataclass
class TaskResult:
    """A task's outcome. `kind` is "CONTAINER" or "DAG" (a group such as an ExitHandler)."""

    name: str
    kind: str
    state: str = SKIPPED
    attempts: list[Attempt] = field(default_factory=list)
    output_parameters: dict[str, Any] = field(default_factory=dict)
    output_artifacts: dict[str, ArtifactResult] = field(default_factory=dict)
    executor_input: dict[str, Any] = field(default_factory=dict)  # as the driver built it
    fingerprint: str = ""
    cached_from_run: str = ""  # the run whose execution a cache hit reused
    error: str = ""

    @property
    def log(self) -> str:
        return self.attempts[-1].log if self.attempts else ""

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.splitlines()[-lines:])


@dataclass
class RunResult:
    """A finished run: SUCCEEDED or FAILED (naming the first failed task; a cancelled run too)."""

    run_id: str
    run_name: str  # the Argo Workflow's name ({{$.pipeline_job_resource_name}})
    run_root: str  # <pipeline root>/<pipeline name>/<run id>, where outputs go
    state: str
    tasks: dict[str, TaskResult]
    error: str = ""
    warnings: list[str] = field(default_factory=list)
