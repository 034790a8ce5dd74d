"""What every pipeline step reads from its pod once, at its edge, before any work.

The run id (from the pod label KFP sets), the provenance lineage records (image digest, code
version), the pod's identity (is this a cluster? which namespace?) and the ML Metadata address
(the `metadata` parameter, else KFP's METADATA_GRPC_SERVICE_HOST/_PORT), and on a local run the
run's own process, which the step watches so as to end with it (components/runner_watch.py). A
mistake in any of them is one line naming the fix and exit 2, not a traceback.

Reading it also makes the step's process quick to end (contracts/process.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from components import lineage, provenance, runner_watch
from components.jobs import kube
from contracts.errors import one_line_errors
from contracts.process import exit_without_final_gc


@dataclass(frozen=True)
class StepEdge:
    """A step's view of its pod and run."""

    run_id: str  # the pipeline run's id
    provenance: dict[str, Any]  # execution properties: image, digest, code version...
    store: str  # the ML Metadata address to record into
    pod: kube.PodIdentity  # the step's own pod; every field "" outside a cluster
    runner: dict[str, object] | None = None  # the local run's process; None on a cluster

    @property
    def in_cluster(self) -> bool:
        """True in a KFP pod, where nothing on local disk outlives the step."""
        return bool(self.pod.name)


def read(step: str, image: str, metadata: str, env: Mapping[str, str]) -> StepEdge:
    """Read the edge of step `step` (running `image`) from `env`, the process environment."""
    exit_without_final_gc()
    with one_line_errors(f"gptpipe {step}"):
        pod = kube.pod_identity(env)
        run_id = provenance.run_id(env)
        found = provenance.detect(image, env, pod=pod).properties()
        store = lineage.store_address(metadata, env)
        return StepEdge(run_id, found, store, pod, runner_watch.runner_of(env))
