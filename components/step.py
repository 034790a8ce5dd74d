"""What every step does around its executor, once: TFX's driver and publisher for our steps.

A component is its KFP signature plus one call, `step.run(NAME, executor.execute, inputs)`, its
inputs being its `locals()`. `run` reads the step's edge (run id, provenance, the ML Metadata
address, the pod), records the execution with the step's parameters (every input that is neither
an artifact, nor the edge's own, nor an upstream task's output), and calls the executor's
`execute(step, **inputs)` inside that record: COMPLETE when it returns, FAILED with its error
when it raises. A step told to stop (SIGTERM: a cancelled run's pod, or a local run that ended)
raises `StepCancelled` and is recorded FAILED with it, never left RUNNING; the launchers that
train and tokenize start take the signal over while they run, to stop their workers first.
Every executor has that entry point shape. A step of a local run ends with the run, however the
run ended (components/runner_watch.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from components import lineage, runner_watch, step_edge, storage
from components.step_edge import StepEdge
from contracts.params import params_class
from contracts.process import raise_on_stop
from contracts.progress import Progress

T = TypeVar("T")
EDGE_INPUTS = ("image", "metadata", "pipeline_name")  # every component's, read by `run` alone
# Inputs an upstream task produced (tokenize's outputs), not run parameters: lineage records
# them as the Examples input and the execution's dataset version.
UPSTREAM_INPUTS = ("examples_uri", "dataset_version")


class StepCancelled(RuntimeError):
    """The step was told to stop (`contracts.process.raise_on_stop`)."""


@dataclass(frozen=True)
class Step:
    """One running step, as its executor sees it."""

    name: str  # the step's name in the DAG: tokenize, train, evaluate, push
    image: str  # the image the step's pod runs (the compiled reference)
    edge: StepEdge  # its pod and run: run id, provenance, store, pod
    rec: lineage.StepRecorder  # its lineage record: inputs, outputs, properties
    progress: Progress  # the run view's events, when a local run watches; else silent

    def check_shared(self, uri: str, what: str) -> None:
        """Refuse `uri` (named `what` in the error) unless later steps and pods can read it:
        on a cluster, nothing on a pod's local disk outlives the step."""
        storage.check_shared_root(uri, what, in_cluster=self.edge.in_cluster)


def run(name: str, execute: Callable[..., T], arguments: Mapping[str, Any]) -> T:
    """Run step `name`: `execute(step, **inputs)` inside its lineage record; its result.

    `arguments` is the component's `locals()`: its inputs and outputs by name, with the edge
    inputs every component takes (`EDGE_INPUTS`). Read once, here, from the process
    environment.
    """
    inputs = dict(arguments)
    image, metadata, pipeline_name = (inputs.pop(key) for key in EDGE_INPUTS)
    parameters = {
        key: value
        for key, value in inputs.items()
        if key not in UPSTREAM_INPUTS and not _is_artifact(value)
    }
    edge = step_edge.read(name, image, metadata, os.environ)
    runner_watch.end_with(edge.runner)
    progress = Progress.from_env(os.environ, name)
    # Outside the record, so that a second signal cannot cut short the writing of FAILED.
    with (
        raise_on_stop(StepCancelled),
        lineage.step(
            edge.store, name, pipeline_name, edge.run_id, parameters, edge.provenance
        ) as rec,
    ):
        _record_whole_objects(rec)
        return execute(Step(name, image, edge, rec, progress), **inputs)


def _record_whole_objects(rec: lineage.StepRecorder) -> None:
    """Record each step parameter object whole, as this version reads it: a run may pass only
    the fields it sets (`--param train_job.workers=8`), and lineage keeps what ran. A bad one
    fails the step here, on its record."""
    for key, value in rec.parameters.items():
        cls = params_class(key)
        if cls is not None:
            rec.parameters[key] = cls.from_dict(value).to_dict()


def _is_artifact(value: object) -> bool:
    """A KFP input or output artifact (it has a URI and metadata), not a parameter."""
    return hasattr(value, "uri") and hasattr(value, "metadata")
