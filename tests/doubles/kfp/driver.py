"""The KFP v2 driver's part of running a task, for tests/doubles/kfp/backend.py.

Follows KFP backend 2.5.0, backend/src/v2/driver/driver.go unless said otherwise (later
releases moved this code to driver/resolve.go, container.go, dag.go, k8s.go and cache.go):

- `resolve_inputs` (resolveInputs, resolveInputParameter, resolveUpstreamParameters,
  resolveUpstreamArtifacts): a task's inputs from its parent DAG's parameters, from upstream
  tasks' recorded outputs, or from constants. Of the runtime placeholders only the five the
  driver knows are resolved, and only when the whole constant is exactly one of them;
  `{{$.pipeline_root}}` and anything else stays literal, as on a cluster.
- `_check_types` (handleParamTypeValidationAndConversion): STRING inputs are converted to text,
  other types must match; optional inputs without a value are left to the launcher.
- `provision_outputs` (provisionOutputs, metadata/client.go GenerateOutputURI): output URIs
  `<root>/<pipeline>/<run id>/<task>/<uuid>/<output>`, parameter files under /tmp/kfp/outputs,
  and the `executor-logs` artifact that publish_logs (default "true") adds.
- `container_task` (Container, getFingerPrintsAndID, reuseCachedOutputs) and `dag_task` (DAG).
- `pod_for` (initPodSpecPatch, extendPodSpecPatch; argocompiler/container.go and common.go for
  the executor template: KFP_POD_NAME/KFP_POD_UID and the metadata-grpc-configmap envFrom;
  apiserver/template/v2_template.go for the `pipeline/runid` pod label): the pod's environment.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import struct_pb2
from kfp.kubernetes import kubernetes_executor_config_pb2 as k8s_pb
from kfp.pipeline_spec import pipeline_spec_pb2 as pb

from tests.doubles.kfp.cache import (
    CacheStore,
    ExecutionRecord,
    cache_key,
    fingerprint,
    runtime_artifact,
)
from tests.doubles.kfp.gojson import value_to_text
from tests.doubles.kfp.ir import PT, Pipeline

DRIVER_PLACEHOLDERS = (
    "{{$.pipeline_job_name}}",
    "{{$.pipeline_job_resource_name}}",
    "{{$.pipeline_job_uuid}}",
    "{{$.pipeline_task_name}}",
    "{{$.pipeline_task_uuid}}",
)
OUTPUT_METADATA_FILE = "/tmp/kfp_outputs/output_metadata.json"  # component.OutputMetadataFilepath
LOGS_ARTIFACT = "executor-logs"


class DriverError(RuntimeError):
    """The driver pod failed; Argo never starts the task's executor pod."""


@dataclass
class RunContext:
    """What every driver of one run knows (its command-line flags and the MLMD pipeline context)."""

    pipeline: Pipeline
    run_id: str  # {{workflow.uid}}, replaced by the API server with the run id
    run_name: str  # {{workflow.name}}: the Argo Workflow's name
    display_name: str  # the run's display name
    run_root: str  # GenerateOutputURI(pipeline root, [pipeline name, run id])
    namespace: str
    store: CacheStore


@dataclass
class DagExecution:
    """An MLMD DAG execution: its inputs and the tasks recorded in it and its sub-DAGs.

    MLMD knows a task by its `task_name` property, which is the task's taskInfo.name (the
    display name), while a consumer names its producer by the DAG key: the two must agree
    (metadata/client.go GetExecutionsInDAG, driver.go resolveUpstreamParameters).
    """

    id: int
    parameters: dict[str, struct_pb2.Value]
    artifacts: dict[str, pb.ArtifactList]
    parent: DagExecution | None = None
    tasks: dict[str, ExecutionRecord] = field(default_factory=dict)
    duplicates: set[str] = field(default_factory=set)

    def record(self, task_name: str, execution: ExecutionRecord) -> None:
        """Make a task's execution visible here and in every enclosing DAG (getDAGTasks)."""
        dag: DagExecution | None = self
        while dag is not None:
            if task_name in dag.tasks and dag.tasks[task_name].id != execution.id:
                dag.duplicates.add(task_name)
            dag.tasks[task_name] = execution
            dag = dag.parent

    def producer(self, name: str) -> ExecutionRecord | None:
        if self.duplicates:
            raise DriverError(f"two tasks have the same task name {sorted(self.duplicates)[0]!r}")
        return self.tasks.get(name)


@dataclass
class ContainerPlan:
    """The container driver's outputs: the executor input, the cache decision, the pod config."""

    task_name: str  # the key in its DAG (taskInfo.name may differ: the display name)
    execution_id: int
    executor_input: pb.ExecutorInput
    component: pb.ComponentSpec
    container: pb.PipelineDeploymentConfig.PipelineContainerSpec
    kubernetes: k8s_pb.KubernetesExecutorConfig
    fingerprint: str = ""  # set when the task enables caching
    cached: ExecutionRecord | None = None  # the execution whose outputs a cache hit reuses


def resolve_inputs(
    run: RunContext, dag: DagExecution, task: pb.PipelineTaskSpec, component: pb.ComponentSpec
) -> pb.ExecutorInput.Inputs:
    """resolveInputs for a task that is not a loop iteration."""
    inputs = pb.ExecutorInput.Inputs()
    for pname, spec in task.inputs.parameters.items():
        value = _resolve_parameter(run, dag, task.task_info.name, pname, spec)
        if value is None:
            definition = component.input_definitions.parameters.get(pname)
            if definition is not None and definition.is_optional:
                continue  # ErrResolvedParameterNull on an optional input: the launcher defaults it
            raise DriverError(
                f"resolving input parameter {pname!r}: null value for a required input"
            )
        inputs.parameter_values[pname].CopyFrom(value)
    for aname, spec in task.inputs.artifacts.items():
        inputs.artifacts[aname].CopyFrom(_resolve_artifact(dag, aname, spec))
    _check_types(inputs, component)
    return inputs


def _resolve_parameter(
    run: RunContext,
    dag: DagExecution,
    task_name: str,
    pname: str,
    spec: pb.TaskInputsSpec.InputParameterSpec,
) -> struct_pb2.Value | None:
    """`task_name` is taskInfo.name, the display name."""
    kind = spec.WhichOneof("kind")
    if kind == "component_input_parameter":
        key = spec.component_input_parameter
        if key not in dag.parameters:
            raise DriverError(f"parent DAG does not have input parameter {key}")
        value = dag.parameters[key]
        return None if value.WhichOneof("kind") == "null_value" else value
    if kind == "task_output_parameter":
        producer = spec.task_output_parameter.producer_task
        record = dag.producer(producer)
        if record is None:
            raise DriverError(f"producer task, {producer}, not in tasks")
        return record.output_parameters.get(spec.task_output_parameter.output_parameter_key)
    if kind == "runtime_value":
        constant = spec.runtime_value.constant
        resolved = {
            "{{$.pipeline_job_name}}": run.display_name,
            "{{$.pipeline_job_resource_name}}": run.run_name,
            "{{$.pipeline_job_uuid}}": run.run_id,
            "{{$.pipeline_task_name}}": task_name,
            "{{$.pipeline_task_uuid}}": str(dag.id),  # 2.5.0 uses the *parent DAG's* execution id
        }
        text = constant.string_value if constant.WhichOneof("kind") == "string_value" else None
        if text in resolved:
            return struct_pb2.Value(string_value=resolved[text])
        return constant
    raise DriverError(f"parameter {pname!r}: parameter spec of type {kind} not implemented yet")


def _resolve_artifact(
    dag: DagExecution, aname: str, spec: pb.TaskInputsSpec.InputArtifactSpec
) -> pb.ArtifactList:
    kind = spec.WhichOneof("kind")
    if kind == "component_input_artifact":
        key = spec.component_input_artifact
        if key not in dag.artifacts:
            raise DriverError(f"parent DAG does not have input artifact {key}")
        return dag.artifacts[key]
    if kind == "task_output_artifact":
        producer, key = (
            spec.task_output_artifact.producer_task,
            spec.task_output_artifact.output_artifact_key,
        )
        record = dag.producer(producer)
        if record is None or key not in record.output_artifacts:
            raise DriverError(
                f"cannot find output artifact key {key!r} in producer task {producer!r}"
            )
        return pb.ArtifactList(artifacts=[runtime_artifact(record.output_artifacts[key])])
    raise DriverError(f"artifact {aname!r}: artifact spec of type {kind} not implemented yet")


_KINDS = {
    PT.NUMBER_DOUBLE: {"number_value"},
    PT.NUMBER_INTEGER: {"number_value"},
    PT.BOOLEAN: {"bool_value"},
    PT.LIST: {"list_value"},
    PT.STRUCT: {"struct_value"},
}


def _check_types(inputs: pb.ExecutorInput.Inputs, component: pb.ComponentSpec) -> None:
    for name, spec in component.input_definitions.parameters.items():
        has_value = name in inputs.parameter_values
        if not has_value and spec.is_optional:
            continue
        if not has_value and not spec.HasField("default_value"):
            raise DriverError(
                f"neither value nor default value provided for non-optional parameter {name!r}"
            )
        value = inputs.parameter_values[name]  # an empty Value when absent, as Go's nil
        kind = value.WhichOneof("kind")
        if spec.parameter_type == PT.STRING:
            if kind != "string_value":
                inputs.parameter_values[name].CopyFrom(
                    struct_pb2.Value(string_value=value_to_text(value))
                )
        elif kind == "null_value":
            raise DriverError(f"got null for input parameter {name!r}")
        elif kind not in _KINDS.get(spec.parameter_type, set()):
            raise DriverError(
                f"input parameter {name!r} type mismatch: "
                f"expect {PT.Name(spec.parameter_type)}, got {kind}"
            )


def provision_outputs(
    run_root: str, task_name: str, outputs: pb.ComponentOutputsSpec
) -> pb.ExecutorInput.Outputs:
    """provisionOutputs with publish_logs "true" (the 2.5.0 driver's default and the manifests')."""
    salt = str(uuid.uuid4())
    result = pb.ExecutorInput.Outputs(output_file=OUTPUT_METADATA_FILE)
    specs = dict(outputs.artifacts)
    specs[LOGS_ARTIFACT] = pb.ComponentOutputsSpec.ArtifactSpec(
        artifact_type=pb.ArtifactTypeSchema(schema_title="system.Artifact")
    )
    for name, spec in specs.items():
        artifact = pb.RuntimeArtifact(uri=f"{run_root.rstrip('/')}/{task_name}/{salt}/{name}")
        artifact.type.CopyFrom(spec.artifact_type)
        if spec.HasField("metadata"):
            artifact.metadata.CopyFrom(spec.metadata)
        result.artifacts[name].artifacts.append(artifact)
    for name in outputs.parameters:
        result.parameters[name].output_file = f"/tmp/kfp/outputs/{name}"
    return result


def container_task(
    run: RunContext, dag: DagExecution, name: str, task: pb.PipelineTaskSpec
) -> ContainerPlan:
    """driver.Container: inputs, outputs, the fingerprint and the cache lookup."""
    component = run.pipeline.component(task)
    executor = run.pipeline.executors[component.executor_label]
    executor_input = pb.ExecutorInput(inputs=resolve_inputs(run, dag, task, component))
    outputs = provision_outputs(run.run_root, task.task_info.name, component.output_definitions)
    executor_input.outputs.CopyFrom(outputs)
    plan = ContainerPlan(
        task_name=name,
        execution_id=run.store.new_id(),
        executor_input=executor_input,
        component=component,
        container=executor.container,
        kubernetes=run.pipeline.kubernetes.get(
            component.executor_label, k8s_pb.KubernetesExecutorConfig()
        ),
    )
    if task.caching_options.enable_cache:
        types = {
            n: PT.Name(p.parameter_type) for n, p in component.output_definitions.parameters.items()
        }
        cmd_args = list(executor.container.command) + list(executor.container.args)
        key = cache_key(
            executor_input.inputs, executor_input.outputs, types, cmd_args, executor.container.image
        )
        plan.fingerprint = fingerprint(key)
        plan.cached = run.store.lookup(plan.fingerprint, run.pipeline.name, run.namespace)
    return plan


def dag_task(
    run: RunContext, parent: DagExecution, name: str, task: pb.PipelineTaskSpec
) -> DagExecution:
    """driver.DAG for a group task (an ExitHandler, a sub-pipeline): its inputs become its scope."""
    component = run.pipeline.component(task)
    inputs = resolve_inputs(run, parent, task, component)
    return DagExecution(
        run.store.new_id(), dict(inputs.parameter_values), dict(inputs.artifacts), parent
    )


@dataclass
class Pod:
    """What the executor pod's main container gets: its identity, labels and environment."""

    name: str
    uid: str
    labels: dict[str, str]
    annotations: dict[str, str]
    env: dict[str, str]
    active_deadline_seconds: int = 0


def pod_for(run: RunContext, plan: ContainerPlan, settings: dict[str, Any]) -> Pod:
    """The pod Argo creates for one attempt: a new name and uid every attempt, as a retried pod.

    `settings` holds the cluster's side: mlmd_host, mlmd_port, secrets, config_maps.
    Raises DriverError for what would keep the container from starting (a missing secret).
    """
    name = f"{run.run_name}-system-container-impl-{uuid.uuid4().int % 10**10:010d}"
    config = plan.kubernetes
    labels = {
        "pipelines.kubeflow.org/v2_component": "true",  # argo.go PodMetadata
        "pipeline/runid": run.run_id,  # v2_template.go SetPodMetadataLabels
        "workflows.argoproj.io/workflow": run.run_name,
    }
    annotations = {
        "pipelines.kubeflow.org/v2_component": "true",
        "sidecar.istio.io/inject": "false",
    }
    # container.go extendPodMetadata: the admin's labels win over the user's.
    labels = {**dict(config.pod_metadata.labels), **labels}
    annotations = {**dict(config.pod_metadata.annotations), **annotations}
    pod = Pod(name, str(uuid.uuid4()), labels, annotations, {}, int(config.active_deadline_seconds))
    env = {  # metadata-grpc-configmap, as envFrom: any env entry below overrides it
        "METADATA_GRPC_SERVICE_HOST": settings["mlmd_host"],
        "METADATA_GRPC_SERVICE_PORT": settings["mlmd_port"],
    }
    env.update({e.name: e.value for e in plan.container.env})
    for secret in config.secret_as_env:
        source = _named(settings["secrets"], "secret", _config_name(secret, "secret_name"))
        for item in secret.key_to_env:
            env[item.env_var] = _key(source, "secret", item.secret_key)
    for cm in config.config_map_as_env:
        source = _named(settings["config_maps"], "configmap", _config_name(cm, "config_map_name"))
        for item in cm.key_to_env:
            env[item.env_var] = _key(source, "configmap", item.config_map_key)
    for item in config.field_path_as_env:
        env[item.name] = _field_path(pod, item.field_path, run.namespace)
    env["KFP_POD_NAME"] = pod.name  # common.go commonEnvs: downward API metadata.name
    env["KFP_POD_UID"] = pod.uid  # and metadata.uid
    pod.env = env
    return pod


def _config_name(entry: Any, legacy: str) -> str:
    """2.5.0 prefers the `*_name_parameter` (a constant from kfp-kubernetes) over the old field."""
    param = getattr(entry, legacy + "_parameter", None)
    if param is not None and entry.HasField(legacy + "_parameter"):
        if param.WhichOneof("kind") != "runtime_value":
            raise DriverError(f"{legacy} from a pipeline parameter is not reproduced")
        return param.runtime_value.constant.string_value
    return str(getattr(entry, legacy))


def _named(sources: dict[str, dict[str, str]], kind: str, name: str) -> dict[str, str]:
    if name not in sources:
        raise DriverError(f'CreateContainerConfigError: {kind} "{name}" not found')
    return sources[name]


def _key(source: dict[str, str], kind: str, key: str) -> str:
    if key not in source:
        raise DriverError(f"CreateContainerConfigError: couldn't find key {key} in {kind}")
    return source[key]


def _field_path(pod: Pod, path: str, namespace: str) -> str:
    """The downward API's fieldRef, for the fields a pod can expose as env."""
    simple = {"metadata.name": pod.name, "metadata.uid": pod.uid, "metadata.namespace": namespace}
    if path in simple:
        return simple[path]
    for prefix, mapping in (
        ("metadata.labels", pod.labels),
        ("metadata.annotations", pod.annotations),
    ):
        if path.startswith(prefix + "['") and path.endswith("']"):
            return mapping.get(path[len(prefix) + 2 : -2], "")
    raise DriverError(f"pod rejected: fieldPath {path!r} is not supported by this harness")
