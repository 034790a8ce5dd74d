"""Reading lineage back: artifacts, executions and the links between them, as plain dicts (views).

No MLMD proto leaves this module. The functions that take a store address open the store
themselves; the ones that take an open store (`original_producer`, `execution_views`...) are
shared with `record.py`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, TypedDict

from ml_metadata.metadata_store import metadata_store

from components.lineage.schema import (
    DATASET_CONTEXT,
    MODEL_TYPE,
    PUSHED_MODEL_TYPE,
    RUN_CONTEXT,
    event_index,
    event_key,
    plain_values,
)
from components.lineage.store import mlmd, open_store
from contracts.errors import UserError


class ArtifactView(TypedDict):
    """An artifact read back from the store, as plain JSON-able values."""

    id: int
    type_name: str
    uri: str
    state: str
    properties: dict[str, Any]
    create_time_ms: int


class ExecutionView(TypedDict):
    """An execution read back from the store, as plain JSON-able values."""

    id: int
    type_name: str
    step: str
    state: str
    properties: dict[str, Any]
    create_time_ms: int
    update_time_ms: int


# ---- one artifact, one execution ------------------------------------------------------------


def find_artifact(store_uri: str, uri: str, type_name: str | None = None) -> ArtifactView | None:
    """The latest artifact at a URI (of one type if given), or None."""
    store = open_store(store_uri)
    views = artifact_views(store, store.get_artifacts_by_uri(uri))
    views = [v for v in views if type_name is None or v["type_name"] == type_name]
    return max(views, key=lambda v: (v["create_time_ms"], v["id"])) if views else None


def producer_of(store_uri: str, artifact: ArtifactView) -> ExecutionView | None:
    """The execution that wrote an artifact (its OUTPUT event), or None for an external input.

    An artifact a CACHED execution also claims is the original execution's.
    """
    store = open_store(store_uri)
    producer = original_producer(store, artifact["id"])
    return execution_views(store, [producer])[0] if producer is not None else None


def inputs_of(store_uri: str, execution: ExecutionView) -> dict[str, list[ArtifactView]]:
    """An execution's input artifacts by input key."""
    return _linked(open_store(store_uri), execution["id"], mlmd.Event.INPUT)


def outputs_of(store_uri: str, execution: ExecutionView) -> dict[str, list[ArtifactView]]:
    """An execution's output artifacts by output key."""
    return _linked(open_store(store_uri), execution["id"], mlmd.Event.OUTPUT)


def parameters_of(execution: ExecutionView) -> dict[str, Any]:
    """The parameters an execution was recorded with, exactly as the step passed them."""
    recorded = execution["properties"].get("parameters")
    return dict(json.loads(recorded)) if isinstance(recorded, str) else {}


# ---- runs, datasets, the latest -------------------------------------------------------------


def run_summary(store_uri: str, run_id: str) -> dict[str, Any]:
    """What one run did: its dataset version and, per step, the latest execution with outputs.

    `executions` lists every attempt in order (id, step, state), so retries stay visible.
    """
    store = open_store(store_uri)
    context = store.get_context_by_type_and_name(RUN_CONTEXT, run_id)
    if context is None:
        raise UserError(f"no run {run_id!r} in metadata store {store_uri}: check the run id")
    views = _in_start_order(execution_views(store, store.get_executions_by_context(context.id)))
    steps: dict[str, dict[str, Any]] = {}
    for view in views:
        steps[view["step"]] = {
            **view,
            "outputs": _linked(store, view["id"], mlmd.Event.OUTPUT),
        }
    versions = {
        str(v["properties"]["dataset_version"])
        for v in views
        if "dataset_version" in v["properties"]
    }
    return {
        "run_id": run_id,
        "pipeline_name": context.custom_properties["pipeline_name"].string_value,
        "dataset_version": next(iter(versions)) if len(versions) == 1 else None,
        "steps": steps,
        "executions": [{"id": v["id"], "step": v["step"], "state": v["state"]} for v in views],
    }


def failure_of(store_uri: str, run_id: str) -> tuple[str, str] | None:
    """Return (step, error message) of the run's first step whose last attempt FAILED, or
    None. An attempt a retry replaced does not count: a train step that failed once and
    succeeded on KFP's retry is no failure of the run."""
    store = open_store(store_uri)
    context = store.get_context_by_type_and_name(RUN_CONTEXT, run_id)
    if context is None:
        return None
    last: dict[str, ExecutionView] = {}
    for view in _in_start_order(
        execution_views(store, store.get_executions_by_context(context.id))
    ):
        last.pop(view["step"], None)  # re-inserted: the dict keeps the steps' last starts' order
        last[view["step"]] = view
    for view in last.values():
        if view["state"] == "FAILED":
            return view["step"], str(view["properties"].get("error", "see the step's log"))
    return None


def models_for_dataset(store_uri: str, dataset_version: str) -> list[dict[str, Any]]:
    """Every Model trained on a dataset version, oldest first, with the execution that made it.

    Models are the outputs of executions in the dataset's context, not every Model attributed
    to it: an evaluate step also attributes the baseline it read, whatever data trained that.
    """
    store = open_store(store_uri)
    context = store.get_context_by_type_and_name(DATASET_CONTEXT, dataset_version)
    if context is None:
        return []
    executions = [
        e
        for e in execution_views(store, store.get_executions_by_context(context.id))
        if e["state"] != "CACHED"  # a cached train made no new model
    ]
    found = [
        {"model": model, "execution": execution}
        for execution in executions
        for arts in _linked(store, execution["id"], mlmd.Event.OUTPUT).values()
        for model in arts
        if model["type_name"] == MODEL_TYPE
    ]
    return sorted(found, key=lambda m: (m["model"]["create_time_ms"], m["model"]["id"]))


def latest_pushed_model(store_uri: str) -> str | None:
    """The URI of the most recently pushed model (a PushedModel with pushed=1), or None."""
    store = open_store(store_uri)
    pushed = [
        v
        for v in artifact_views(store, store.get_artifacts_by_type(PUSHED_MODEL_TYPE))
        if v["properties"].get("pushed") == 1
    ]
    return max(pushed, key=lambda v: (v["create_time_ms"], v["id"]))["uri"] if pushed else None


def latest_run_id(store_uri: str, pipeline_name: str) -> str:
    """Return the id of the most recently created run of `pipeline_name`."""
    runs = run_ids(store_uri, pipeline_name)
    if not runs:
        raise UserError(f"no run of pipeline {pipeline_name!r} in metadata store {store_uri}")
    return runs[0]


def run_ids(store_uri: str, pipeline_name: str) -> list[str]:
    """The ids of every run of `pipeline_name`, newest first (rollbacks are runs too)."""
    store = open_store(store_uri)
    runs = [
        c
        for c in store.get_contexts_by_type(RUN_CONTEXT)
        if c.custom_properties["pipeline_name"].string_value == pipeline_name
    ]
    runs.sort(key=lambda c: (c.create_time_since_epoch, c.id), reverse=True)
    return [str(c.name) for c in runs]


# ---- on an open store (shared with record.py) -----------------------------------------------


def original_producer(store: metadata_store.MetadataStore, artifact_id: int) -> Any:
    """The execution that really made an artifact: the first non-CACHED one with an OUTPUT."""
    ids = sorted(
        e.execution_id
        for e in store.get_events_by_artifact_ids([artifact_id])
        if e.type == mlmd.Event.OUTPUT
    )
    if not ids:
        return None
    executions = store.get_executions_by_id(ids)
    ran = [e for e in executions if e.last_known_state != mlmd.Execution.CACHED]
    return min(ran or executions, key=lambda e: e.id)


def _in_start_order(views: list[ExecutionView]) -> list[ExecutionView]:
    """Executions by when they started: a step records itself RUNNING as it starts, and a
    CACHED execution, recorded later by the step that read its output, keeps its original's
    start time."""

    def started(view: ExecutionView) -> int:
        return int(view["properties"].get("start_time_ms", view["create_time_ms"]))

    return sorted(views, key=lambda v: (started(v), v["id"]))


def run_executions(store: metadata_store.MetadataStore, run_id: str) -> list[ExecutionView]:
    """Every execution recorded in a run's context; none for an unknown run."""
    context = store.get_context_by_type_and_name(RUN_CONTEXT, run_id)
    if context is None:
        return []
    return execution_views(store, store.get_executions_by_context(context.id))


def _linked(
    store: metadata_store.MetadataStore, execution_id: int, kind: int
) -> dict[str, list[ArtifactView]]:
    """The artifacts an execution read (INPUT) or wrote (OUTPUT), by event key, in index order."""
    events = [e for e in store.get_events_by_execution_ids([execution_id]) if e.type == kind]
    events.sort(key=lambda e: (event_key(e), event_index(e)))
    views = {
        v["id"]: v
        for v in artifact_views(store, store.get_artifacts_by_id([e.artifact_id for e in events]))
    }
    linked: dict[str, list[ArtifactView]] = {}
    for event in events:
        linked.setdefault(event_key(event), []).append(views[event.artifact_id])
    return linked


def artifact_views(
    store: metadata_store.MetadataStore, artifacts: Iterable[Any]
) -> list[ArtifactView]:
    """Artifact protos as ArtifactViews, their type names looked up once."""
    artifacts = list(artifacts)
    type_names = _type_names(store.get_artifact_types_by_id, {a.type_id for a in artifacts})
    return [
        ArtifactView(
            id=a.id,
            type_name=type_names[a.type_id],
            uri=a.uri,
            state=mlmd.Artifact.State.Name(a.state),
            properties={**plain_values(a.properties), **plain_values(a.custom_properties)},
            create_time_ms=a.create_time_since_epoch,
        )
        for a in artifacts
    ]


def execution_views(
    store: metadata_store.MetadataStore, executions: Iterable[Any]
) -> list[ExecutionView]:
    """Execution protos as ExecutionViews, their type names looked up once."""
    executions = list(executions)
    type_names = _type_names(store.get_execution_types_by_id, {e.type_id for e in executions})
    views = []
    for e in executions:
        properties = {**plain_values(e.properties), **plain_values(e.custom_properties)}
        views.append(
            ExecutionView(
                id=e.id,
                type_name=type_names[e.type_id],
                step=str(properties.get("step", "")),
                state=mlmd.Execution.State.Name(e.last_known_state),
                properties=properties,
                create_time_ms=e.create_time_since_epoch,
                update_time_ms=e.last_update_time_since_epoch,
            )
        )
    return views


def _type_names(get_types: Any, type_ids: set[int]) -> dict[int, str]:
    return {t.id: t.name for t in get_types(sorted(type_ids))} if type_ids else {}
