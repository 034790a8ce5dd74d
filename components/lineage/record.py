"""Recording lineage: one execution per step run, with its inputs, outputs and contexts.

`step()` wraps a step's code and records it when the block ends (COMPLETE, or FAILED with the
error); `record_execution` is the one write underneath it. When KFP served an upstream task from
its cache, a CACHED execution of it is recorded in this run first, so a run's record is whole.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import re
import sys
import time
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any

from ml_metadata import errors
from ml_metadata.metadata_store import metadata_store

from components.lineage.query import original_producer, run_executions
from components.lineage.schema import (
    ARTIFACT_TYPES,
    DATASET_CONTEXT,
    EXECUTION_TYPE_PREFIX,
    PIPELINE_CONTEXT,
    RUN_CONTEXT,
    ArtifactRecord,
    event_index,
    event_key,
    new_event,
    plain_values,
    set_values,
    to_scalar,
)
from components.lineage.store import failure_reason, mlmd, open_store
from contracts.errors import UserError, one_line_errors

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


# ---- recording -----------------------------------------------------------------------------


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
    execution_id: int | None = None,
) -> int:
    """Record one step execution with its inputs, outputs and contexts, atomically.

    `execution_id` names an execution recorded earlier (RUNNING, by `step`) to complete.

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
    if execution_id is not None:
        _check_started(store, execution_id, step, run_id)
    execution = mlmd.Execution(
        type_id=_put_execution_type(store, step),
        last_known_state=mlmd.Execution.State.Value(state),
    )
    if execution_id is not None:
        execution.id = execution_id
    set_values(
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
        (_stored_or_new(store, record), new_event(mlmd.Event.INPUT, key, index))
        for key, records in inputs.items()
        for index, record in enumerate(records)
    ]
    cached_from = [
        artifact.id
        for (artifact, event) in pairs
        if artifact.HasField("id") and event_key(event) in upstream
    ]
    served_ms = int((time.time() if start_time is None else start_time) * 1000)
    _record_cached(store, run_id, pipeline_name, cached_from, served_ms)
    pairs += [
        (_new_artifact(store, record), new_event(mlmd.Event.OUTPUT, key, index))
        for key, records in outputs.items()
        for index, record in enumerate(records)
    ]
    contexts = [
        _context(store, PIPELINE_CONTEXT, pipeline_name),
        _run_context(store, run_id, pipeline_name),
    ]
    if dataset_version:
        contexts.append(_context(store, DATASET_CONTEXT, dataset_version))
    return _put_execution(store, execution, pairs, contexts)


def _check_started(
    store: metadata_store.MetadataStore, execution_id: int, step: str, run_id: str
) -> None:
    """Refuse to complete an execution that is not the one `step` recorded at its start.

    Recording it again would write into whatever the store now holds under that id: after
    the SQLite file was removed (a new one is created) or replaced, another step's execution.
    """
    found = store.get_executions_by_id([execution_id])
    props = plain_values(found[0].custom_properties) if found else {}
    if (props.get("step"), props.get("run_id")) != (step, run_id):
        raise UserError(
            f"the {step} execution {execution_id} recorded at the step's start is not in the "
            "store any more: was the store removed or replaced while the step ran?"
        )


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
    store: metadata_store.MetadataStore,
    run_id: str,
    pipeline_name: str,
    artifact_ids: list[int],
    served_ms: int,
) -> None:
    """Record, in this run, a CACHED execution for each upstream step KFP skipped.

    A skipped step leaves no trace of its own, but the step that reads its output sees an
    artifact made by another run. Like KFP's driver, the CACHED execution copies the original's
    properties (image, parameters, code version...), adds `cached_from_execution_id` and
    `cached_from_run_id`, and has OUTPUT events to the same artifacts. The original's own
    upstream inputs from its run are followed too, so a chain of skipped steps is complete.
    Its time is just before `served_ms`, when the step that read its output started (each
    step further up the chain a millisecond earlier), so runs list steps in DAG order.
    """
    done = {view["step"] for view in run_executions(store, run_id)}
    pending: list[tuple[int, str | None, int]] = [(a, None, served_ms - 1) for a in artifact_ids]
    while pending:
        artifact_id, from_run, at_ms = pending.pop()
        producer = original_producer(store, artifact_id)
        if producer is None:
            continue
        props = producer.custom_properties
        step, its_run = props["step"].string_value, props["run_id"].string_value
        if its_run == run_id or step in done or (from_run is not None and its_run != from_run):
            continue
        done.add(step)
        # Another step of this run recording the same one at the same moment wins the name.
        with contextlib.suppress(errors.AlreadyExistsError):
            _put_cached(store, producer, run_id, pipeline_name, at_ms)
        inputs = store.get_events_by_execution_ids([producer.id])
        pending += [
            (e.artifact_id, its_run, at_ms - 1) for e in inputs if e.type == mlmd.Event.INPUT
        ]


def _put_cached(
    store: metadata_store.MetadataStore,
    original: Any,
    run_id: str,
    pipeline_name: str,
    at_ms: int,
) -> None:
    execution = mlmd.Execution(
        type_id=original.type_id,
        name=f"{run_id}/cached",  # unique per type, i.e. step: at most one per step and run
        last_known_state=mlmd.Execution.State.Value("CACHED"),
    )
    execution.custom_properties.MergeFrom(original.custom_properties)
    set_values(
        execution.custom_properties,
        {
            "run_id": run_id,
            "pipeline_name": pipeline_name,
            "cached_from_execution_id": original.id,
            "cached_from_run_id": original.custom_properties["run_id"].string_value,
            "start_time_ms": at_ms,
            "end_time_ms": at_ms,
        },
    )
    outputs = [
        e for e in store.get_events_by_execution_ids([original.id]) if e.type == mlmd.Event.OUTPUT
    ]
    artifacts = {a.id: a for a in store.get_artifacts_by_id([e.artifact_id for e in outputs])}
    pairs = [
        (artifacts[e.artifact_id], new_event(mlmd.Event.OUTPUT, event_key(e), event_index(e)))
        for e in outputs
    ]
    contexts = [
        _context(store, PIPELINE_CONTEXT, pipeline_name),
        _run_context(store, run_id, pipeline_name),
    ]
    version = original.custom_properties["dataset_version"].string_value
    if version:
        contexts.append(_context(store, DATASET_CONTEXT, version))
    _put_execution(store, execution, pairs, contexts)


def _put_execution(
    store: metadata_store.MetadataStore, execution: Any, pairs: list[Any], contexts: list[Any]
) -> int:
    """Put the execution with its events, linked to `contexts`, in one transaction.

    The contexts are named by type and name only (`_context`), never by a stored id. KFP 2.5
    runs ml-metadata 1.14, whose PutExecution upserts every context it is given
    (ml_metadata/metadata_store/metadata_store.cc at v1.14.0, `UpsertContextWithOptions`): one
    with an id is updated as a whole with the copy the caller read, so a property another
    writer set since that read is lost; one without an id is looked up by type and name
    (`reuse_context_if_already_exist`), then linked as stored, or created when new. The
    `force_reuse_context` option that would link a context by id without updating it came in
    1.15, and a 1.14 server does not read it. Two writers that create the same new context at
    once: the second transaction is ABORTED, and store.py runs it again, finding the context.
    """
    execution_id, _, _ = store.put_execution(
        execution, pairs, contexts, reuse_context_if_already_exist=True
    )
    return int(execution_id)


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
        if isinstance(value, bool) or not isinstance(to_scalar(value), expected):
            raise ValueError(
                f"{record.type_name} property {key!r} must be {expected.__name__}, got {value!r}"
            )
    set_values(artifact.properties, typed)
    set_values(
        artifact.custom_properties,
        {k: v for k, v in record.properties.items() if k not in declared},
    )
    return artifact


# ---- types and contexts -------------------------------------------------------------------


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
    """The context of this type and name as `_put_execution` links it: by type and name, no id,
    so the store links the stored one untouched, or creates it with what this one holds."""
    if not name:
        raise ValueError(f"{type_name} context needs a non-empty name")
    return mlmd.Context(type_id=_put_context_type(store, type_name), name=name)


def _run_context(store: metadata_store.MetadataStore, run_id: str, pipeline_name: str) -> Any:
    """The run's context, with the pipeline it belongs to if it is new; a run id already used
    by another pipeline is an error."""
    context = _context(store, RUN_CONTEXT, run_id)
    stored = store.get_context_by_type_and_name(RUN_CONTEXT, run_id)
    owner = stored.custom_properties["pipeline_name"].string_value if stored else pipeline_name
    if owner != pipeline_name:
        raise UserError(
            f"run id {run_id!r} already belongs to pipeline {owner!r}: use a new run id"
        )
    context.custom_properties["pipeline_name"].string_value = pipeline_name
    return context


# ---- around a step -------------------------------------------------------------------------


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

    Lineage is part of what a run delivers, so a store that fails (unreachable, locked by
    other writers past `LOCK_RETRY_S`, removed or replaced, not a store, holding a type that
    clashes with ours) is never ignored, and never hides what the step itself did:

    - at the start: the step stops before any work, with one line naming the store and exit
      status 2, so a wrong address costs seconds, not a training run;
    - when the block raised: its own error propagates unchanged, and the failure that could
      not be recorded is one warning line; the execution stays RUNNING until the run's exit
      handler closes it (`close_unfinished`);
    - when the block succeeded: the step fails, with one line naming the store and every
      output it published unrecorded, and exit status 2. A store that answered but refused
      the record (a type clash) gets the execution marked FAILED with that message; an
      error that is not the store's (a bug in what the step recorded) keeps its traceback,
      with that line as a note.
    """
    recorder = StepRecorder(parameters)
    recorder.set(**(properties or {}))
    writes = _StepWrites(store_uri, step_name, pipeline_name, run_id, recorder, time.time())
    # Recorded at once, RUNNING: an unreachable store fails the step before its work, and a
    # step killed outright (SIGKILL, eviction, a cancelled run) still leaves its execution,
    # which the run's exit handler marks (`close_unfinished`).
    with one_line_errors(writes.who):
        writes.started()
    try:
        yield recorder
    except BaseException as err:
        writes.failed(err)
        if isinstance(err, UserError):
            # A mistake in the input, not a bug: one clear line in the step's log, no
            # traceback, and the message on the FAILED execution (`failure_of`).
            print(f"{writes.who}: error: {err}", file=sys.stderr)
            raise SystemExit(2) from None
        raise
    with one_line_errors(writes.who):
        writes.completed()


@dataclasses.dataclass
class _StepWrites:
    """What `step()` writes for one execution, and what it does when the store fails it."""

    store_uri: str
    step: str
    pipeline_name: str
    run_id: str
    recorder: StepRecorder
    start_time: float
    execution_id: int | None = None  # once the start is recorded

    @property
    def who(self) -> str:
        return f"gptpipe {self.step}"

    def write(self, state: str) -> None:
        """Record the execution as the recorder has it now; its outputs only if COMPLETE."""
        rec = self.recorder
        self.execution_id = record_execution(
            self.store_uri,
            step=self.step,
            pipeline_name=self.pipeline_name,
            run_id=self.run_id,
            parameters=rec.parameters,
            inputs=rec.inputs,
            outputs=rec.outputs if state == "COMPLETE" else {},
            properties=rec.properties,
            state=state,
            start_time=self.start_time,
            dataset_version=rec.dataset_version,
            upstream=rec.upstream,
            execution_id=self.execution_id,
        )

    def started(self) -> None:
        """Record the execution RUNNING; a store that fails it is a UserError naming it."""
        try:
            self.write("RUNNING")
        except errors.StatusError as err:
            failure = _store_failure(self.store_uri, err)
            raise UserError(
                f"the step's start is not recorded, so it did not run: {failure}"
            ) from None

    def failed(self, err: BaseException) -> None:
        """Record the execution FAILED with `err`; if the store fails that, warn and go on."""
        if isinstance(err, UserError):
            self.recorder.set(error=str(err))
        elif isinstance(err, Exception):
            self.recorder.set(error=f"{type(err).__name__}: {err}")
        try:
            self.write("FAILED")
        except Exception as failure:  # noqa: BLE001 -- whatever it is, the step's own error wins
            print(
                f"{self.who}: warning: its failure is not recorded: "
                f"{_store_failure(self.store_uri, failure)}; execution {self.execution_id} "
                "stays RUNNING until the run's exit handler closes it",
                file=sys.stderr,
            )

    def completed(self) -> None:
        """Record the execution COMPLETE with its outputs; if that fails, fail the step."""
        try:
            self.write("COMPLETE")
        except Exception as err:
            published = [
                f"{key}={record.uri}"
                for key, records in self.recorder.outputs.items()
                for record in records
            ]
            message = (
                f"the step succeeded but is not recorded: {_store_failure(self.store_uri, err)}; "
                f"published and not recorded: {', '.join(published) or 'nothing'}: fix the "
                "store, then run the step again"
            )
            self.recorder.set(error=message)
            # A store that answered but refused what was recorded (a clashing type, a bug)
            # still takes the FAILED mark; one locked, gone or unreachable would only fail it
            # again, after another wait.
            if not isinstance(err, errors.AbortedError | UserError):
                with contextlib.suppress(Exception):
                    self.write("FAILED")
            if isinstance(err, errors.StatusError | UserError):
                raise UserError(message) from None
            err.add_note(message)
            raise


def _store_failure(store_uri: str, err: BaseException) -> str:
    """Why the store failed a write, on one line that names the store once."""
    reason = failure_reason(err)
    if store_uri.strip() in reason:
        return reason
    kind = f"{type(err).__name__}: " if isinstance(err, errors.StatusError) else ""
    return f"metadata store {store_uri.strip()}: {kind}{reason}"


def close_unfinished(store_uri: str, run_id: str, reason: str) -> list[str]:
    """Mark the run's executions still RUNNING as FAILED with `reason`; return their steps.

    A step that ends normally completes its own execution; one whose process was killed
    cannot. The run's exit handler calls this, so lineage tells what happened to every step.
    """
    store = open_store(store_uri)
    closed = []
    for view in run_executions(store, run_id):
        if view["state"] != "RUNNING":
            continue
        (execution,) = store.get_executions_by_id([view["id"]])
        execution.last_known_state = mlmd.Execution.State.FAILED
        set_values(
            execution.custom_properties,
            {"error": reason, "end_time_ms": int(time.time() * 1000)},
        )
        store.put_executions([execution])
        closed.append(view["step"])
    return closed
