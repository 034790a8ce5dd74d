"""KFP v2's task cache and the ML Metadata records it reads, for tests/doubles/kfp/backend.py.

Follows KFP backend 2.5.0 (`git show 2.5.0:<path>` in kubeflow/pipelines):

- `cache_key`, `fingerprint`: backend/src/v2/cacheutils/cache.go (GenerateCacheKey,
  GenerateFingerPrint), called from backend/src/v2/driver/driver.go (getFingerPrint): the input
  parameter values, the input artifacts' *names* (their MLMD ids, new for every produced
  artifact), the output artifacts with the URI wiped, the output parameter types, and the
  container's image with its unresolved command and args. Not in the key: environment
  variables, the Kubernetes executor config, the image digest behind a tag. (From 2.15 the
  mounted PVC names are in the key too: driver/cache.go getFingerPrint.)
- `CacheStore`: what the KFP API server's task table (cacheutils Client: CreateExecutionCache /
  GetExecutionCache, newest entry first, scoped to "pipeline/<name>" and the namespace) and the
  MLMD executions and artifacts that a cache hit reuses (driver.go reuseCachedOutputs,
  collectOutputArtifactMetadataFromCache) hold, kept in memory across runs. Only what the
  harness needs of MLMD is kept: ids, output parameters, output artifacts.
- `record_artifact` / `runtime_artifact`: backend/src/v2/metadata/converter.go (toMLMDArtifact,
  StructValueToMLMDValue, toRuntimeArtifact) and client.go (RecordArtifact): what a downstream
  task receives is the artifact as MLMD stored it, not as the producer wrote it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import struct_pb2
from kfp.pipeline_spec import pipeline_spec_pb2 as pb

from tests.doubles.kfp.gojson import encoding_json_dumps, message_to_py, value_from_py, value_to_py

# client.go RecordArtifact: the launcher stores the bucket's session info on every artifact;
# config/gcs.go gives this for a gs:// root with no provider config (credentials from the env).
GCS_SESSION_INFO = json.dumps(
    {"Provider": "gs", "Params": {"fromEnv": "true"}}, separators=(",", ":")
)


def cache_key(
    inputs: pb.ExecutorInput.Inputs,
    outputs: pb.ExecutorInput.Outputs,
    output_parameter_types: dict[str, str],
    cmd_args: list[str],
    image: str,
) -> dict[str, Any]:
    """cacheutils.GenerateCacheKey as the protojson object GenerateFingerPrint marshals."""
    key: dict[str, Any] = {}
    names = {
        name: {"artifactNames": [a.name for a in artifacts.artifacts]}
        for name, artifacts in inputs.artifacts.items()
    }
    if names:
        key["inputArtifactNames"] = names
    if inputs.parameter_values:
        key["inputParameterValues"] = {
            name: value_to_py(value) for name, value in inputs.parameter_values.items()
        }
    specs = {}
    for name, artifacts in outputs.artifacts.items():
        if not artifacts.artifacts:
            continue
        first = artifacts.artifacts[0]
        wiped = pb.RuntimeArtifact(name=first.name)
        if first.HasField("type"):
            wiped.type.CopyFrom(first.type)
        if first.HasField("metadata"):
            wiped.metadata.CopyFrom(first.metadata)
        specs[name] = message_to_py(wiped)
    if specs:
        key["outputArtifactsSpec"] = specs
    if outputs.parameters:
        missing = set(outputs.parameters) - set(output_parameter_types)
        if missing:
            raise ValueError(
                f"unknown parameter {sorted(missing)[0]!r} found in ExecutorInput_Outputs"
            )
        key["outputParametersSpec"] = {n: output_parameter_types[n] for n in outputs.parameters}
    container: dict[str, Any] = {}
    if image:
        container["image"] = image
    if cmd_args:
        container["cmdArgs"] = list(cmd_args)
    key["containerSpec"] = container
    return key


def fingerprint(key: dict[str, Any]) -> str:
    """cacheutils.GenerateFingerPrint: sha256 of the key re-marshalled by encoding/json."""
    return hashlib.sha256(encoding_json_dumps(key).encode("utf-8")).hexdigest()


@dataclass
class RecordedArtifact:
    """An MLMD artifact as the launcher recorded it (client.go RecordArtifact)."""

    id: int
    uri: str
    custom_properties: dict[str, Any]  # StructValueToMLMDValue of the metadata, plus two keys


@dataclass
class ExecutionRecord:
    """The part of an MLMD container execution that a cache hit reuses."""

    id: int
    task_name: str
    run_id: str
    output_parameters: dict[str, struct_pb2.Value] = field(default_factory=dict)
    output_artifacts: dict[str, RecordedArtifact] = field(default_factory=dict)


@dataclass(frozen=True)
class CacheEntry:
    """A row of the API server's task table: fingerprint -> the MLMD execution that made it."""

    fingerprint: str
    pipeline_name: str  # "pipeline/<pipelineInfo.name>", as the launcher writes it
    namespace: str
    run_id: str
    execution_id: int


class CacheStore:
    """MLMD ids and executions plus the cache table; one object can serve many runs."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.executions: dict[int, ExecutionRecord] = {}
        self.entries: list[CacheEntry] = []
        self.artifacts: dict[int, RecordedArtifact] = {}

    def new_id(self) -> int:
        """A fresh MLMD id (executions and artifacts share one counter here; MLMD has two)."""
        with self._lock:
            return next(self._ids)

    def lookup(self, fp: str, pipeline_name: str, namespace: str) -> ExecutionRecord | None:
        """GetExecutionCache: the newest entry with this fingerprint, pipeline and namespace."""
        for entry in reversed(self.entries):
            if (entry.fingerprint, entry.pipeline_name, entry.namespace) == (
                fp,
                f"pipeline/{pipeline_name}",
                namespace,
            ):
                return self.executions[entry.execution_id]
        return None

    def add_entry(
        self, fp: str, pipeline_name: str, namespace: str, record: ExecutionRecord
    ) -> None:
        """CreateExecutionCache, which the launcher calls after a successful, uncached task."""
        entry = CacheEntry(fp, f"pipeline/{pipeline_name}", namespace, record.run_id, record.id)
        self.entries.append(entry)

    def record_execution(self, record: ExecutionRecord) -> None:
        self.executions[record.id] = record

    def record_artifact(self, output_name: str, artifact: pb.RuntimeArtifact) -> RecordedArtifact:
        """RecordArtifact: metadata as MLMD custom properties, plus display_name and session."""
        props = {k: _to_mlmd_value(v) for k, v in artifact.metadata.fields.items()}
        props.setdefault("display_name", output_name)
        props.setdefault("store_session_info", GCS_SESSION_INFO)
        recorded = RecordedArtifact(self.new_id(), artifact.uri, props)
        self.artifacts[recorded.id] = recorded
        return recorded


def _to_mlmd_value(value: struct_pb2.Value) -> Any:
    """converter.go StructValueToMLMDValue: bools become ints, lists and dicts get wrapped."""
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "number_value":
        return float(value.number_value)
    if kind == "bool_value":
        return int(value.bool_value)
    if kind == "list_value":
        return {"list": value_to_py(value)}
    if kind == "struct_value":
        return {"struct": value_to_py(value)}
    raise ValueError(f"unknown/unsupported value type {kind} in artifact metadata")


def runtime_artifact(recorded: RecordedArtifact, schema: str = "") -> pb.RuntimeArtifact:
    """toRuntimeArtifact + OutputArtifact.ToRuntimeArtifact (client.go): what a consumer gets.

    The name is the MLMD id, the metadata the custom properties, and the type an instance
    schema, which is empty for the SDK's types (they are set by schema title).
    """
    artifact = pb.RuntimeArtifact(name=str(recorded.id), uri=recorded.uri)
    artifact.metadata.CopyFrom(struct_pb2.Struct())
    for key, prop in recorded.custom_properties.items():
        artifact.metadata.fields[key].CopyFrom(value_from_py(prop))
    artifact.type.instance_schema = schema
    return artifact
