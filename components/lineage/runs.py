"""Past runs, read back from ML Metadata: one row per run, with what a reader asks of a run.

A run is a `pipeline_run` context; its row is made from the latest execution of each step in it
(a retried step's last attempt): when it started and ended, its dataset version, evaluate's
nats/char, the blessing, and what push published. Read-only: nothing here writes to the store,
and no MLMD proto leaves this module.
"""

from __future__ import annotations

from typing import Any, TypedDict

from ml_metadata.metadata_store import metadata_store

from components.lineage.query import ArtifactView, ExecutionView, artifact_views, execution_views
from components.lineage.schema import RUN_CONTEXT, event_key
from components.lineage.store import mlmd, open_store

# A run's state, from its steps' latest executions: any FAILED (or CANCELED) makes it FAILED,
# else any still RUNNING (or NEW) makes it RUNNING; COMPLETE and CACHED steps are done.
_FAILED = frozenset({"FAILED", "CANCELED"})
_UNFINISHED = frozenset({"RUNNING", "NEW"})


class RunRow(TypedDict):
    """One run as `gptpipe runs` shows it; plain JSON-able values, None for what is unknown."""

    run_id: str
    pipeline_name: str
    state: str  # COMPLETE, FAILED or RUNNING
    start_time_ms: int  # when its first step started (epoch milliseconds)
    end_time_ms: int | None  # when its last step ended; None while it runs
    dataset_version: str | None  # None when no step recorded one (a rollback)
    # As evaluate recorded it: a float, or the string "nan"/"inf" for a non-finite loss.
    eval_nats_per_char: float | str | None
    blessed: bool | None  # None when evaluate recorded no blessing
    pushed: bool | None  # None when push recorded no outcome
    pushed_version: int | None  # the serving version push published, if it did
    pushed_destination: str | None  # the serving folder it published to, if it did
    steps: dict[str, str]  # step -> state of its latest execution, in the order they started


def list_runs(store_uri: str, limit: int | None = None) -> list[RunRow]:
    """The runs recorded in a store, newest first (by when their first step started).

    `limit` keeps only the newest ones. A run context with no execution is left out.
    """
    store = open_store(store_uri)
    rows = []
    for context in store.get_contexts_by_type(RUN_CONTEXT):
        views = execution_views(store, store.get_executions_by_context(context.id))
        if views:
            pipeline = context.custom_properties["pipeline_name"].string_value
            rows.append((context.id, _row(store, str(context.name), pipeline, views)))
    rows.sort(key=lambda pair: (pair[1]["start_time_ms"], pair[0]), reverse=True)
    return [row for _, row in rows[:limit]]


def _row(
    store: metadata_store.MetadataStore,
    run_id: str,
    pipeline_name: str,
    views: list[ExecutionView],
) -> RunRow:
    latest: dict[str, ExecutionView] = {}
    for view in sorted(views, key=lambda v: (_started(v), v["id"])):
        latest.pop(view["step"], None)  # re-inserted: steps stay in the order they last started
        latest[view["step"]] = view
    states = {step: view["state"] for step, view in latest.items()}
    outputs = _outputs(store, [view["id"] for view in latest.values()])
    evaluation = _properties(outputs, latest.get("evaluate"), "evaluation")
    blessing = _properties(outputs, latest.get("evaluate"), "blessing")
    push = _properties(outputs, latest.get("push"), "pushed_model")
    pushed = bool(push.get("pushed")) if "pushed" in push else None
    versions = {str(v["properties"]["dataset_version"]) for v in views if _has_dataset(v)}
    state = _state(set(states.values()))
    return RunRow(
        run_id=run_id,
        pipeline_name=pipeline_name,
        state=state,
        start_time_ms=min(_started(v) for v in views),
        end_time_ms=None if state == "RUNNING" else max(_ended(v) for v in views),
        dataset_version=versions.pop() if len(versions) == 1 else None,
        eval_nats_per_char=evaluation.get("eval_nats_per_char"),
        blessed=bool(blessing["blessed"]) if "blessed" in blessing else None,
        pushed=pushed,
        pushed_version=int(push["pushed_version"]) if pushed else None,
        pushed_destination=str(push["pushed_destination"]) if pushed else None,
        steps=states,
    )


def _outputs(
    store: metadata_store.MetadataStore, execution_ids: list[int]
) -> dict[tuple[int, str], ArtifactView]:
    """{(execution id, output key): the first artifact under it} for these executions."""
    events = [
        e for e in store.get_events_by_execution_ids(execution_ids) if e.type == mlmd.Event.OUTPUT
    ]
    artifacts = {
        a["id"]: a
        for a in artifact_views(store, store.get_artifacts_by_id([e.artifact_id for e in events]))
    }
    found: dict[tuple[int, str], ArtifactView] = {}
    for event in sorted(events, key=lambda e: e.artifact_id):
        found.setdefault((event.execution_id, event_key(event)), artifacts[event.artifact_id])
    return found


def _properties(
    outputs: dict[tuple[int, str], ArtifactView], execution: ExecutionView | None, key: str
) -> dict[str, Any]:
    """The properties of an execution's output `key`; {} if it has none (or did not run)."""
    if execution is None:
        return {}
    artifact = outputs.get((execution["id"], key))
    return dict(artifact["properties"]) if artifact else {}


def _state(states: set[str]) -> str:
    if states & _FAILED:
        return "FAILED"
    if states & _UNFINISHED:
        return "RUNNING"
    return "COMPLETE"


def _has_dataset(view: ExecutionView) -> bool:
    return bool(view["properties"].get("dataset_version"))


def _started(view: ExecutionView) -> int:
    """When a step started: recorded as it starts; a CACHED one keeps a time in this run."""
    return int(view["properties"].get("start_time_ms", view["create_time_ms"]))


def _ended(view: ExecutionView) -> int:
    return int(view["properties"].get("end_time_ms", view["update_time_ms"]))
