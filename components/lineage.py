"""The lineage layer: the only module that talks to ML Metadata (MLMD).

Steps describe what they did with plain Python (`ArtifactRecord`, dicts of parameters) and read
lineage back as plain dicts; no MLMD proto leaves this module, so the store can be replaced
without touching a step. Types use TFX's names (`Examples`, `Model`, `ModelEvaluation`,
`ModelBlessing`, `PushedModel`) and contexts TFX's and KFP's (`pipeline`, `pipeline_run`), so
TFX and Vertex tools can read the same store.

A store is addressed by one string: a local path is a SQLite file (created on first use), and
`host:port` or `grpc://host:port` is an MLMD gRPC service, such as KFP's
`metadata-grpc-service.kubeflow:8080`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import math
import re
import sys
import time
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from google.protobuf import json_format
from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

from contracts.errors import UserError

Scalar = str | int | float
# The generated protos have no type stubs; annotations below name them as Any.
mlmd: Any = metadata_store_pb2

# Artifact types with TFX's names and typed properties; everything else is a custom property.
ARTIFACT_TYPES: dict[str, dict[str, int]] = {
    "Examples": {"span": mlmd.INT, "split_names": mlmd.STRING, "version": mlmd.INT},
    "Model": {},
    "ModelEvaluation": {},
    "ModelBlessing": {},
    "PushedModel": {},
}
PIPELINE_CONTEXT = "pipeline"
RUN_CONTEXT = "pipeline_run"
DATASET_CONTEXT = "dataset_version"
EXECUTION_TYPE_PREFIX = "gptpipe."

# Execution custom properties this module writes itself; callers may not pass them.
_RESERVED = frozenset(
    {
        "step",
        "pipeline_name",
        "run_id",
        "dataset_version",
        "environment_digest",
        "start_time_ms",
        "end_time_ms",
        "parameters",
        "cached_from_execution_id",
        "cached_from_run_id",
    }
)
_STATES = ("NEW", "RUNNING", "COMPLETE", "FAILED", "CACHED", "CANCELED")
_STEP_RE = re.compile(r"[a-z][a-z0-9_]*")
_GRPC_RE = re.compile(r"(?:grpc://)?(?P<host>[A-Za-z0-9.\-]+):(?P<port>\d{1,5})")


@dataclass(frozen=True)
class ArtifactRecord:
    """One artifact a step read or wrote, as the step knows it."""

    type_name: str  # one of ARTIFACT_TYPES, e.g. "Examples"
    uri: str  # where the bytes are (local path or gs://)
    properties: dict[str, Any] = field(default_factory=dict)  # str/int/float; lists, dicts as JSON


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


# --- store addressing ----------------------------------------------------------------------


def store_config(uri: str) -> Any:
    """Build the MLMD connection config for a store address (gRPC service or SQLite path)."""
    uri = uri.strip()
    if not uri:
        raise UserError("metadata store address is empty: pass a SQLite path or host:port")
    grpc_match = _GRPC_RE.fullmatch(uri)
    if grpc_match:
        return mlmd.MetadataStoreClientConfig(host=grpc_match["host"], port=int(grpc_match["port"]))
    if "://" in uri:
        raise UserError(
            f"metadata store {uri!r} is not supported: pass a local SQLite path "
            "or an MLMD gRPC address (host:port or grpc://host:port)"
        )
    config = mlmd.ConnectionConfig()
    config.sqlite.filename_uri = str(Path(uri).expanduser().resolve())
    config.sqlite.connection_mode = mlmd.SqliteMetadataSourceConfig.READWRITE_OPENCREATE
    return config


def is_service(uri: str) -> bool:
    """True when a store address names an MLMD gRPC service rather than a SQLite file."""
    return _GRPC_RE.fullmatch(uri.strip()) is not None


def open_store(uri: str) -> metadata_store.MetadataStore:
    """Open the raw MLMD store at an address; for tests and tools that need the MLMD API.

    A SQLite store's parent folder is created. A gRPC store is not contacted until first use.
    """
    config = store_config(uri)
    if isinstance(config, mlmd.ConnectionConfig):
        Path(config.sqlite.filename_uri).parent.mkdir(parents=True, exist_ok=True)
    return metadata_store.MetadataStore(config)


# --- environment ---------------------------------------------------------------------------


@functools.cache
def environment_digest() -> str:
    """sha256 of the Python version and every installed distribution with its version.

    Two executions with the same digest ran with the same packages; computed once per process.
    """
    dists = {
        f"{(d.metadata['Name'] or '').lower()}=={d.version}"
        for d in importlib.metadata.distributions()
    }
    text = "\n".join([sys.version, *sorted(dists)])
    return hashlib.sha256(text.encode()).hexdigest()


# --- recording -----------------------------------------------------------------------------


def record_execution(
    store_uri: str,
    *,
    step: str,
    pipeline_name: str,
    run_id: str,
    parameters: Mapping[str, Any],
    inputs: Mapping[str, Iterable[ArtifactRecord]],
    outputs: Mapping[str, Iterable[ArtifactRecord]],
    properties: Mapping[str, Any] | None = None,
    state: str = "COMPLETE",
    start_time: float | None = None,
    end_time: float | None = None,
    dataset_version: str | None = None,
    upstream: Collection[str] = (),
) -> int:
    """Record one step execution with its inputs, outputs and contexts, atomically.

    Inputs already in the store (same type and URI, latest wins) are reused, so the lineage
    graph connects across steps; outputs are always new LIVE artifacts. Times are epoch
    seconds; `end_time` defaults to now. Returns the execution id.

    `upstream` names the input keys that an upstream task of this pipeline produced. When such
    an input was made in another run, KFP served that task from its cache and nothing ran it
    in this run: a CACHED execution of it is recorded here first (see `_record_cached`).
    """
    if not _STEP_RE.fullmatch(step):
        raise ValueError(f"step {step!r} must be a lowercase identifier such as 'train'")
    if state not in _STATES:
        raise ValueError(f"state {state!r} must be one of {', '.join(_STATES)}")
    store = open_store(store_uri)
    execution = mlmd.Execution(
        type_id=_put_execution_type(store, step),
        last_known_state=mlmd.Execution.State.Value(state),
    )
    _set_values(
        execution.custom_properties,
        _execution_values(
            step=step,
            pipeline_name=pipeline_name,
            run_id=run_id,
            parameters=parameters,
            properties=properties or {},
            start_time=start_time,
            end_time=end_time,
            dataset_version=dataset_version,
        ),
    )
    pairs = [
        (_stored_or_new(store, record), _event(mlmd.Event.INPUT, key, index))
        for key, records in inputs.items()
        for index, record in enumerate(records)
    ]
    cached_from = [
        artifact.id
        for (artifact, event) in pairs
        if artifact.HasField("id") and _event_key(event) in upstream
    ]
    _record_cached(store, run_id, pipeline_name, cached_from)
    pairs += [
        (_new_artifact(store, record), _event(mlmd.Event.OUTPUT, key, index))
        for key, records in outputs.items()
        for index, record in enumerate(records)
    ]
    contexts = [
        _context(store, PIPELINE_CONTEXT, pipeline_name),
        _run_context(store, run_id, pipeline_name),
    ]
    if dataset_version:
        contexts.append(_context(store, DATASET_CONTEXT, dataset_version))
    execution_id, _, _ = store.put_execution(
        execution, pairs, contexts, reuse_context_if_already_exist=True, force_reuse_context=True
    )
    return int(execution_id)


def _execution_values(
    *,
    step: str,
    pipeline_name: str,
    run_id: str,
    parameters: Mapping[str, Any],
    properties: Mapping[str, Any],
    start_time: float | None,
    end_time: float | None,
    dataset_version: str | None,
) -> dict[str, Any]:
    """Merge caller parameters and properties with the values this module always records."""
    clash = (set(parameters) & set(properties)) | ((set(parameters) | set(properties)) & _RESERVED)
    if clash:
        raise ValueError(f"execution property names used twice or reserved: {sorted(clash)}")
    values: dict[str, Any] = {**parameters, **properties}
    values.update(
        parameters=json.dumps(dict(parameters), sort_keys=True, default=str),
        step=step,
        pipeline_name=pipeline_name,
        run_id=run_id,
        environment_digest=environment_digest(),
        end_time_ms=int((time.time() if end_time is None else end_time) * 1000),
    )
    if start_time is not None:
        values["start_time_ms"] = int(start_time * 1000)
    if dataset_version:
        values["dataset_version"] = dataset_version
    return values


def _record_cached(
    store: metadata_store.MetadataStore, run_id: str, pipeline_name: str, artifact_ids: list[int]
) -> None:
    """Record, in this run, a CACHED execution for each upstream step KFP skipped.

    A skipped step leaves no trace of its own, but the step that reads its output sees an
    artifact made by another run. Like KFP's driver, the CACHED execution copies the original's
    properties (image, parameters, code version...), adds `cached_from_execution_id` and
    `cached_from_run_id`, and has OUTPUT events to the same artifacts. The original's own
    upstream inputs from its run are followed too, so a chain of skipped steps is complete.
    """
    done = {view["step"] for view in _run_executions(store, run_id)}
    pending: list[tuple[int, str | None]] = [(a, None) for a in artifact_ids]
    while pending:
        artifact_id, from_run = pending.pop()
        producer = _original_producer(store, artifact_id)
        if producer is None:
            continue
        props = producer.custom_properties
        step, its_run = props["step"].string_value, props["run_id"].string_value
        if its_run == run_id or step in done or (from_run is not None and its_run != from_run):
            continue
        done.add(step)
        _put_cached(store, producer, run_id, pipeline_name)
        inputs = store.get_events_by_execution_ids([producer.id])
        pending += [(e.artifact_id, its_run) for e in inputs if e.type == mlmd.Event.INPUT]


def _put_cached(
    store: metadata_store.MetadataStore, original: Any, run_id: str, pipeline_name: str
) -> None:
    execution = mlmd.Execution(
        type_id=original.type_id, last_known_state=mlmd.Execution.State.Value("CACHED")
    )
    execution.custom_properties.MergeFrom(original.custom_properties)
    now_ms = int(time.time() * 1000)
    _set_values(
        execution.custom_properties,
        {
            "run_id": run_id,
            "pipeline_name": pipeline_name,
            "cached_from_execution_id": original.id,
            "cached_from_run_id": original.custom_properties["run_id"].string_value,
            "start_time_ms": now_ms,
            "end_time_ms": now_ms,
        },
    )
    outputs = [
        e for e in store.get_events_by_execution_ids([original.id]) if e.type == mlmd.Event.OUTPUT
    ]
    artifacts = {a.id: a for a in store.get_artifacts_by_id([e.artifact_id for e in outputs])}
    pairs = [
        (artifacts[e.artifact_id], _event(mlmd.Event.OUTPUT, _event_key(e), _event_index(e)))
        for e in outputs
    ]
    contexts = [
        _context(store, PIPELINE_CONTEXT, pipeline_name),
        _run_context(store, run_id, pipeline_name),
    ]
    version = original.custom_properties["dataset_version"].string_value
    if version:
        contexts.append(_context(store, DATASET_CONTEXT, version))
    store.put_execution(
        execution, pairs, contexts, reuse_context_if_already_exist=True, force_reuse_context=True
    )


def _original_producer(store: metadata_store.MetadataStore, artifact_id: int) -> Any:
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


def _run_executions(store: metadata_store.MetadataStore, run_id: str) -> list[ExecutionView]:
    context = store.get_context_by_type_and_name(RUN_CONTEXT, run_id)
    if context is None:
        return []
    return _execution_views(store, store.get_executions_by_context(context.id))


def _event(kind: int, key: str, index: int) -> Any:
    """An event whose path names the step's input or output key, as TFX writes it."""
    event = mlmd.Event(type=kind)
    event.path.steps.add().key = key
    event.path.steps.add().index = index
    return event


def _stored_or_new(store: metadata_store.MetadataStore, record: ArtifactRecord) -> Any:
    """The latest stored artifact with this type and URI, or a new one if there is none."""
    type_id = _put_artifact_type(store, record.type_name)
    matches = [a for a in store.get_artifacts_by_uri(record.uri) if a.type_id == type_id]
    if matches:
        return max(matches, key=lambda a: (a.create_time_since_epoch, a.id))
    return _new_artifact(store, record)


def _new_artifact(store: metadata_store.MetadataStore, record: ArtifactRecord) -> Any:
    """A new LIVE artifact: TFX's typed properties where declared, the rest custom."""
    type_id = _put_artifact_type(store, record.type_name)
    declared = ARTIFACT_TYPES[record.type_name]
    artifact = mlmd.Artifact(type_id=type_id, uri=record.uri, state=mlmd.Artifact.LIVE)
    typed = {k: v for k, v in record.properties.items() if k in declared}
    for key, value in typed.items():
        expected = int if declared[key] == mlmd.INT else str
        if isinstance(value, bool) or not isinstance(_plain(value), expected):
            raise ValueError(
                f"{record.type_name} property {key!r} must be {expected.__name__}, got {value!r}"
            )
    _set_values(artifact.properties, typed)
    _set_values(
        artifact.custom_properties,
        {k: v for k, v in record.properties.items() if k not in declared},
    )
    return artifact


def _set_values(target: Any, values: Mapping[str, Any]) -> None:
    """Write plain values into an MLMD property map; None is left out."""
    for key, raw in values.items():
        value = _plain(raw)
        if value is None:
            continue
        if isinstance(value, int):
            target[key].int_value = value
        elif isinstance(value, float):
            target[key].double_value = value
        else:
            target[key].string_value = value


def _plain(value: Any) -> Scalar | None:
    """Map a Python value onto MLMD's scalars: bool as 0/1, lists and dicts as JSON.

    SQL has no NaN or infinity, so a non-finite float (a diverged loss) is stored as the
    string "nan", "inf" or "-inf".
    """
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, str | float):
        return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, list | tuple | dict):
        return json.dumps(value, sort_keys=True)
    raise TypeError(f"cannot record {type(value).__name__} value {value!r} in ML Metadata")


# --- types and contexts --------------------------------------------------------------------


def _put_artifact_type(store: metadata_store.MetadataStore, name: str) -> int:
    if name not in ARTIFACT_TYPES:
        raise ValueError(f"artifact type {name!r} is not one of {', '.join(ARTIFACT_TYPES)}")
    artifact_type = mlmd.ArtifactType(name=name)
    for key, kind in ARTIFACT_TYPES[name].items():
        artifact_type.properties[key] = kind
    return int(store.put_artifact_type(artifact_type, can_add_fields=True))


def _put_execution_type(store: metadata_store.MetadataStore, step: str) -> int:
    name = EXECUTION_TYPE_PREFIX + "".join(part.capitalize() for part in step.split("_"))
    return int(store.put_execution_type(mlmd.ExecutionType(name=name), can_add_fields=True))


def _put_context_type(store: metadata_store.MetadataStore, name: str) -> int:
    return int(store.put_context_type(mlmd.ContextType(name=name), can_add_fields=True))


def _context(store: metadata_store.MetadataStore, type_name: str, name: str) -> Any:
    """The stored context of this type and name, or a new one put_execution will create."""
    if not name:
        raise ValueError(f"{type_name} context needs a non-empty name")
    type_id = _put_context_type(store, type_name)
    stored = store.get_context_by_type_and_name(type_name, name)
    return stored if stored is not None else mlmd.Context(type_id=type_id, name=name)


def _run_context(store: metadata_store.MetadataStore, run_id: str, pipeline_name: str) -> Any:
    """The run's context; a run id already used by another pipeline is an error."""
    context = _context(store, RUN_CONTEXT, run_id)
    if not context.HasField("id"):
        context.custom_properties["pipeline_name"].string_value = pipeline_name
    elif context.custom_properties["pipeline_name"].string_value != pipeline_name:
        raise UserError(
            f"run id {run_id!r} already belongs to pipeline "
            f"{context.custom_properties['pipeline_name'].string_value!r}: use a new run id"
        )
    return context


# --- reading back --------------------------------------------------------------------------


def find_artifact(store_uri: str, uri: str, type_name: str | None = None) -> ArtifactView | None:
    """The latest artifact at a URI (of one type if given), or None."""
    store = open_store(store_uri)
    return _find_artifact(store, uri, type_name)


def producer_of(store_uri: str, artifact: ArtifactView) -> ExecutionView | None:
    """The execution that wrote an artifact (its OUTPUT event), or None for an external input."""
    store = open_store(store_uri)
    return _producer_of(store, artifact["id"])


def inputs_of(store_uri: str, execution: ExecutionView) -> dict[str, list[ArtifactView]]:
    """An execution's input artifacts by input key."""
    return _linked(open_store(store_uri), execution["id"], mlmd.Event.INPUT)


def outputs_of(store_uri: str, execution: ExecutionView) -> dict[str, list[ArtifactView]]:
    """An execution's output artifacts by output key."""
    return _linked(open_store(store_uri), execution["id"], mlmd.Event.OUTPUT)


def run_summary(store_uri: str, run_id: str) -> dict[str, Any]:
    """What one run did: its dataset version and, per step, the latest execution with outputs.

    `executions` lists every attempt in order (id, step, state), so retries stay visible.
    """
    store = open_store(store_uri)
    context = store.get_context_by_type_and_name(RUN_CONTEXT, run_id)
    if context is None:
        raise UserError(f"no run {run_id!r} in metadata store {store_uri}: check the run id")
    executions = sorted(store.get_executions_by_context(context.id), key=lambda e: e.id)
    views = _execution_views(store, executions)
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


def trace(store_uri: str, pushed_model_uri: str) -> dict[str, Any]:
    """Walk back from a pushed model to the data it was trained on.

    PushedModel <- push <- Model (+ ModelBlessing <- evaluate -> ModelEvaluation)
    <- train <- Examples <- tokenize. A link the store lacks is None.
    """
    store = open_store(store_uri)
    pushed = _find_artifact(store, pushed_model_uri, "PushedModel")
    if pushed is None:
        raise UserError(
            f"no PushedModel at {pushed_model_uri!r} in metadata store {store_uri}: "
            "pass the URI of a push step's output"
        )
    push = _producer_of(store, pushed["id"])
    push_inputs = _linked(store, push["id"], mlmd.Event.INPUT) if push else {}
    model = _pick(push_inputs, "Model", "model")
    blessing = _pick(push_inputs, "ModelBlessing", "blessing")
    evaluate = _producer_of(store, blessing["id"]) if blessing else None
    evaluate_outputs = _linked(store, evaluate["id"], mlmd.Event.OUTPUT) if evaluate else {}
    train = _producer_of(store, model["id"]) if model else None
    train_inputs = _linked(store, train["id"], mlmd.Event.INPUT) if train else {}
    examples = _pick(train_inputs, "Examples", "examples")
    return {
        "pushed_model": pushed,
        "push": push,
        "model": model,
        "blessing": blessing,
        "evaluate": evaluate,
        "evaluations": [
            a
            for arts in evaluate_outputs.values()
            for a in arts
            if a["type_name"] == "ModelEvaluation"
        ],
        "train": train,
        "examples": examples,
        "tokenize": _producer_of(store, examples["id"]) if examples else None,
        "dataset_version": examples["properties"].get("dataset_version") if examples else None,
    }


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
        for e in _execution_views(store, store.get_executions_by_context(context.id))
        if e["state"] != "CACHED"  # a cached train made no new model
    ]
    found = [
        {"model": model, "execution": execution}
        for execution in executions
        for arts in _linked(store, execution["id"], mlmd.Event.OUTPUT).values()
        for model in arts
        if model["type_name"] == "Model"
    ]
    return sorted(found, key=lambda m: (m["model"]["create_time_ms"], m["model"]["id"]))


def _find_artifact(
    store: metadata_store.MetadataStore, uri: str, type_name: str | None
) -> ArtifactView | None:
    views = _artifact_views(store, store.get_artifacts_by_uri(uri))
    views = [v for v in views if type_name is None or v["type_name"] == type_name]
    return max(views, key=lambda v: (v["create_time_ms"], v["id"])) if views else None


def _producer_of(store: metadata_store.MetadataStore, artifact_id: int) -> ExecutionView | None:
    producer = _original_producer(store, artifact_id)
    return _execution_views(store, [producer])[0] if producer is not None else None


def _linked(
    store: metadata_store.MetadataStore, execution_id: int, kind: int
) -> dict[str, list[ArtifactView]]:
    """The artifacts an execution read (INPUT) or wrote (OUTPUT), by event key, in index order."""
    events = [e for e in store.get_events_by_execution_ids([execution_id]) if e.type == kind]
    events.sort(key=lambda e: (_event_key(e), _event_index(e)))
    views = {
        v["id"]: v
        for v in _artifact_views(store, store.get_artifacts_by_id([e.artifact_id for e in events]))
    }
    linked: dict[str, list[ArtifactView]] = {}
    for event in events:
        linked.setdefault(_event_key(event), []).append(views[event.artifact_id])
    return linked


def _pick(linked: dict[str, list[ArtifactView]], type_name: str, key: str) -> ArtifactView | None:
    """The artifact under `key` if it has that type, else the first of that type."""
    candidates = [a for a in linked.get(key, []) if a["type_name"] == type_name]
    candidates += [a for arts in linked.values() for a in arts if a["type_name"] == type_name]
    return candidates[0] if candidates else None


def _event_key(event: Any) -> str:
    return next((s.key for s in event.path.steps if s.HasField("key")), "")


def _event_index(event: Any) -> int:
    return next((s.index for s in event.path.steps if s.HasField("index")), 0)


def _artifact_views(
    store: metadata_store.MetadataStore, artifacts: Iterable[Any]
) -> list[ArtifactView]:
    artifacts = list(artifacts)
    type_names = _type_names(store.get_artifact_types_by_id, {a.type_id for a in artifacts})
    return [
        ArtifactView(
            id=a.id,
            type_name=type_names[a.type_id],
            uri=a.uri,
            state=mlmd.Artifact.State.Name(a.state),
            properties={**_values(a.properties), **_values(a.custom_properties)},
            create_time_ms=a.create_time_since_epoch,
        )
        for a in artifacts
    ]


def _execution_views(
    store: metadata_store.MetadataStore, executions: Iterable[Any]
) -> list[ExecutionView]:
    executions = list(executions)
    type_names = _type_names(store.get_execution_types_by_id, {e.type_id for e in executions})
    views = []
    for e in executions:
        properties = {**_values(e.properties), **_values(e.custom_properties)}
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


def _values(values: Any) -> dict[str, Any]:
    """An MLMD property map as plain Python; structs (from other writers) as dicts."""
    plain: dict[str, Any] = {}
    for key, value in values.items():
        kind = value.WhichOneof("value")
        if kind == "struct_value":
            plain[key] = json_format.MessageToDict(value.struct_value)
        elif kind in ("int_value", "double_value", "string_value", "bool_value"):
            plain[key] = getattr(value, kind)
    return plain


def parameters_of(execution: ExecutionView) -> dict[str, Any]:
    """The parameters an execution was recorded with, exactly as the step passed them."""
    recorded = execution["properties"].get("parameters")
    return dict(json.loads(recorded)) if isinstance(recorded, str) else {}


def latest_pushed_model(store_uri: str) -> str | None:
    """The URI of the most recently pushed model (a PushedModel with pushed=1), or None."""
    store = open_store(store_uri)
    pushed = [
        v
        for v in _artifact_views(store, store.get_artifacts_by_type("PushedModel"))
        if v["properties"].get("pushed") == 1
    ]
    return max(pushed, key=lambda v: (v["create_time_ms"], v["id"]))["uri"] if pushed else None


def latest_run_id(store_uri: str, pipeline_name: str) -> str:
    """Return the id of the most recently created run of `pipeline_name`."""
    store = open_store(store_uri)
    runs = [
        c
        for c in store.get_contexts_by_type(RUN_CONTEXT)
        if c.custom_properties["pipeline_name"].string_value == pipeline_name
    ]
    if not runs:
        raise UserError(f"no run of pipeline {pipeline_name!r} in metadata store {store_uri}")
    return str(max(runs, key=lambda c: (c.create_time_since_epoch, c.id)).name)


class StepRecorder:
    """Collects what one step did while it runs; `step()` records it when the step ends."""

    def __init__(self, parameters: Mapping[str, Any]) -> None:
        self.parameters = dict(parameters)
        self.inputs: dict[str, list[ArtifactRecord]] = {}
        self.outputs: dict[str, list[ArtifactRecord]] = {}
        self.properties: dict[str, Any] = {}
        self.dataset_version: str | None = None
        self.upstream: set[str] = set()

    def input(
        self,
        key: str,
        type_name: str,
        uri: str,
        properties: Mapping[str, Any] | None = None,
        *,
        upstream: bool = False,
    ) -> None:
        """Name an artifact the step read; `upstream` if a task of this pipeline made it."""
        self.inputs.setdefault(key, []).append(
            ArtifactRecord(type_name, uri, dict(properties or {}))
        )
        if upstream:
            self.upstream.add(key)

    def output(
        self, key: str, type_name: str, uri: str, properties: Mapping[str, Any] | None = None
    ) -> None:
        """Name an artifact the step wrote."""
        self.outputs.setdefault(key, []).append(
            ArtifactRecord(type_name, uri, dict(properties or {}))
        )

    def set(self, **properties: Any) -> None:
        """Add execution properties (image digests, GPU-hours, job names...)."""
        self.properties.update(properties)


@contextlib.contextmanager
def step(
    store_uri: str,
    step_name: str,
    pipeline_name: str,
    run_id: str,
    parameters: Mapping[str, Any],
    properties: Mapping[str, Any] | None = None,
) -> Iterator[StepRecorder]:
    """Record one execution of `step_name` around the block: COMPLETE, or FAILED on an error.

    A failed execution keeps its inputs but records no outputs, so nothing downstream can
    mistake a half-made artifact for a real one.
    """
    recorder = StepRecorder(parameters)
    recorder.set(**(properties or {}))
    start = time.time()
    state = "FAILED"
    try:
        yield recorder
        state = "COMPLETE"
    except UserError as err:
        # A mistake in the input, not a bug: one clear line in the step's log, no traceback,
        # and the message on the FAILED execution so a runner can show it (`failure_of`).
        recorder.set(error=str(err))
        print(f"gptpipe {step_name}: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except Exception as err:
        recorder.set(error=f"{type(err).__name__}: {err}")
        raise
    finally:
        record_execution(
            store_uri,
            step=step_name,
            pipeline_name=pipeline_name,
            run_id=run_id,
            parameters=recorder.parameters,
            inputs=recorder.inputs,
            outputs=recorder.outputs if state == "COMPLETE" else {},
            properties=recorder.properties,
            state=state,
            start_time=start,
            dataset_version=recorder.dataset_version,
            upstream=recorder.upstream,
        )


def failure_of(store_uri: str, run_id: str) -> tuple[str, str] | None:
    """Return (step, error message) of the run's first FAILED execution, or None."""
    store = open_store(store_uri)
    context = store.get_context_by_type_and_name(RUN_CONTEXT, run_id)
    if context is None:
        return None
    for view in _execution_views(
        store, sorted(store.get_executions_by_context(context.id), key=lambda e: e.id)
    ):
        if view["state"] == "FAILED":
            return view["step"], str(view["properties"].get("error", "see the step's log"))
    return None
