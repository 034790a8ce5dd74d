"""Shared by the TFJob tests: a JobSpec with every option set, and the CRD schema check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from components.jobs.launcher import JobSpec, OwnerPod
from tests.doubles.kubernetes.apiserver import IMAGE_DIGEST

IMAGE = "us-docker.pkg.dev/proj/gptpipe/trainer@" + IMAGE_DIGEST
SCHEMA = json.loads((Path(__file__).parents[3] / "data" / "tfjob_crd_v1_schema.json").read_text())


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


# -- a tiny OpenAPI v3 validator: types, required, enum, properties, unknown fields --

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "integer": int}


def schema_errors(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Errors of `obj` against a structural schema; unknown fields are errors (the apiserver
    would silently prune them, which is how misplaced fields get lost)."""
    if "anyOf" in schema:
        if all(schema_errors(obj, s, path) for s in schema["anyOf"]):
            return [f"{path}: {obj!r} matches none of {schema['anyOf']}"]
        return []
    kind = schema.get("type")
    if kind:
        ok = isinstance(obj, _TYPES[kind]) and not (kind == "integer" and isinstance(obj, bool))
        if not ok:
            return [f"{path}: expected {kind}, got {type(obj).__name__}"]
    if "enum" in schema and obj not in schema["enum"]:
        return [f"{path}: {obj!r} not in {schema['enum']}"]
    errors: list[str] = []
    if isinstance(obj, dict):
        errors += [f"{path}.{k}: required" for k in schema.get("required", []) if k not in obj]
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        names = schema.get("propertyNames")
        for key, value in obj.items():
            if names and key not in names["enum"]:
                errors.append(f"{path}.{key}: key not in {names['enum']}")
            elif key in props:
                errors += schema_errors(value, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                errors += schema_errors(value, extra, f"{path}.{key}")
            elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                errors.append(f"{path}.{key}: unknown field")
    if isinstance(obj, list) and "items" in schema:
        for i, item in enumerate(obj):
            errors += schema_errors(item, schema["items"], f"{path}[{i}]")
    return errors


def worker_template(manifest: dict[str, Any]) -> dict[str, Any]:
    """The Worker replica's pod template of a TFJob manifest."""
    return dict(manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"])
