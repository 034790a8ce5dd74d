"""Shared by the TFJob tests: a JobSpec with every option set, and its worker pod template."""

from __future__ import annotations

from typing import Any

from components.jobs.spec import JobSpec, OwnerPod
from tests.doubles.kubernetes.apiserver import IMAGE_DIGEST

IMAGE = "us-docker.pkg.dev/proj/gptpipe/trainer@" + IMAGE_DIGEST


def make_spec(**overrides: Any) -> JobSpec:
    fields: dict[str, Any] = dict(
        name="train-run-1",
        namespace="ml",
        image=IMAGE,
        command=["python", "-m", "trainer.task", "--work-dir", "gs://b/work"],
        run_id="3f2a9c1e-5b7d-4e0a-9c1b-2d3e4f5a6b7c",
        workers=2,
        gpus_per_worker=1,
        cpu="8",
        memory="32Gi",
        node_selector={"cloud.google.com/gke-accelerator": "nvidia-l4"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        backoff_limit=2,
        active_deadline_seconds=7200,
        ttl_seconds_after_finished=3600,
        env={"GPTPIPE_LOG_LEVEL": "info"},
        owner=OwnerPod(name="launcher-pod-abc", uid="0f1e2d3c-aaaa-bbbb-cccc-111122223333"),
        service_account="trainer",
        image_pull_secrets=["registry-pull"],
    )
    fields.update(overrides)
    return JobSpec(**fields)


def worker_template(manifest: dict[str, Any]) -> dict[str, Any]:
    """The Worker replica's pod template of a TFJob manifest."""
    return dict(manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"])
