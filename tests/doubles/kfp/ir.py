"""The compiled pipeline as KFP 2.5.0's API server and Argo compiler read it (backend.py).

- `load`: backend/src/apiserver/template/v2_template.go (NewV2SpecTemplate): the first YAML
  document is a PipelineSpec and the second a PlatformSpec, both parsed strictly (protojson:
  an unknown field rejects the upload). The deployment config and each Kubernetes executor
  config are parsed leniently, as backend/src/v2/compiler/visitor.go (GetDeploymentConfig) and
  the driver (common/util/json.go UnmarshalString, AllowUnknownFields) do: an unknown field
  there is silently dropped, which `Pipeline.warnings` reports.
- `run_parameters`: v2_template.go validatePipelineJobInputs (types, required, no extras), then
  backend/src/v2/compiler/argocompiler/argo.go (Compile) filling defaults and nulls.
- `dag_dependencies`, `exit_hooks`, `retry_policy`: argocompiler/dag.go (addImplicitDependencies,
  the ALL_UPSTREAM_TASKS_COMPLETED exit hooks) and container.go (getTaskRetryPolicySpec).
- `unsupported`: IR features the harness does not reproduce; it refuses them by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import json_format, struct_pb2
from kfp.kubernetes import kubernetes_executor_config_pb2 as k8s_pb
from kfp.pipeline_spec import pipeline_spec_pb2 as pb

EXIT_STRATEGY = pb.PipelineTaskSpec.TriggerPolicy.TriggerStrategy.ALL_UPSTREAM_TASKS_COMPLETED
PT = pb.ParameterType.ParameterTypeEnum


class PipelineRejected(ValueError):
    """The KFP API server (or its Argo compiler) would refuse this pipeline or run."""


class NotReproduced(NotImplementedError):
    """The pipeline uses a feature this harness does not reproduce."""


@dataclass
class Pipeline:
    """A compiled pipeline: the spec, its executors and their Kubernetes configs."""

    spec: pb.PipelineSpec
    executors: dict[str, pb.PipelineDeploymentConfig.ExecutorSpec]
    kubernetes: dict[str, k8s_pb.KubernetesExecutorConfig]  # by executor label
    warnings: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.pipeline_info.name

    def component(self, task: pb.PipelineTaskSpec) -> pb.ComponentSpec:
        return self.spec.components[task.component_ref.name]


def load(path: str | Path) -> Pipeline:
    """Parse a compiled pipeline YAML as the API server would accept it."""
    docs = [d for d in yaml.safe_load_all(Path(path).read_text(encoding="utf-8")) if d is not None]
    spec, platform = None, None
    for doc in docs:
        if "pipelineInfo" in doc or "root" in doc:
            if spec is not None:
                raise PipelineRejected("multiple pipeline specs provided")
            spec = _strict(doc, pb.PipelineSpec(), "pipeline spec")
        else:
            if platform is not None:
                raise PipelineRejected("multiple platform specs provided")
            if any("pipelineConfig" in p for p in (doc.get("platforms") or {}).values()):
                # SinglePlatformSpec.pipeline_config is newer than the 2.5.0 proto.
                raise PipelineRejected(
                    "cannot unmarshal platform specific configs: unknown field pipelineConfig"
                )
            platform = _strict(doc, pb.PlatformSpec(), "platform spec")
    if spec is None:
        raise PipelineRejected(f"{path}: no pipeline spec document")
    if not spec.pipeline_info.name:
        raise PipelineRejected("pipelineInfo.name is empty")
    deploy = pb.PipelineDeploymentConfig()
    json_format.ParseDict(
        json_format.MessageToDict(spec.deployment_spec), deploy, ignore_unknown_fields=True
    )
    pipeline = Pipeline(spec, dict(deploy.executors), {})
    if platform is not None and "kubernetes" in platform.platforms:
        for label, config in platform.platforms["kubernetes"].deployment_spec.executors.items():
            pipeline.kubernetes[label] = _lenient_k8s(label, config, pipeline.warnings)
    return pipeline


def _strict(doc: dict[str, Any], message: Any, what: str) -> Any:
    try:
        return json_format.ParseDict(doc, message)
    except json_format.ParseError as err:
        raise PipelineRejected(f"invalid {what}: {err}") from err


def _lenient_k8s(label: str, config: struct_pb2.Struct, warnings: list[str]) -> Any:
    data = json_format.MessageToDict(config)
    parsed = json_format.ParseDict(
        data, k8s_pb.KubernetesExecutorConfig(), ignore_unknown_fields=True
    )
    known = set(json_format.MessageToDict(parsed))
    for key in sorted(set(data) - known):
        if data[key] not in ({}, [], "", None, 0, False):
            warnings.append(
                f"{label}: Kubernetes config field {key!r} is unknown to KFP 2.5.0; ignored"
            )
    return parsed


def run_parameters(spec: pb.PipelineSpec, given: dict[str, Any]) -> dict[str, struct_pb2.Value]:
    """The run's root parameters: validated as the API server does, defaults as Argo's compiler."""
    definitions = spec.root.input_definitions.parameters
    extra = sorted(set(given) - set(definitions))
    if extra:
        raise PipelineRejected(
            f"parameter(s) provided are not required by pipeline: {', '.join(extra)}"
        )
    values: dict[str, struct_pb2.Value] = {}
    for name, definition in definitions.items():
        if name in given:
            value = struct_pb2.Value()
            json_format.ParseDict(given[name], value)
            _check_root_type(name, definition.parameter_type, value)
            values[name] = value
        elif definition.HasField("default_value"):
            values[name] = definition.default_value
        elif definition.is_optional:
            values[name] = struct_pb2.Value(null_value=struct_pb2.NULL_VALUE)
        else:
            raise PipelineRejected(
                f"parameter {name} is not optional, yet has neither default value "
                "nor user provided value"
            )
    return values


_ROOT_KINDS = {
    PT.NUMBER_DOUBLE: ("number_value", "double or integer"),
    PT.NUMBER_INTEGER: ("number_value", "double or integer"),
    PT.STRING: ("string_value", "string"),
    PT.BOOLEAN: ("bool_value", "bool"),
    PT.LIST: ("list_value", "list"),
    PT.STRUCT: ("struct_value", "struct"),
}


def _check_root_type(name: str, ptype: int, value: struct_pb2.Value) -> None:
    if ptype not in _ROOT_KINDS:
        raise PipelineRejected(f"input parameter {name} requires type {PT.Name(ptype)}")
    kind, words = _ROOT_KINDS[ptype]
    if value.WhichOneof("kind") != kind:
        raise PipelineRejected(
            f"input parameter {name} requires type {words}, but got {value.WhichOneof('kind')}"
        )


def dag_dependencies(dag: pb.DagSpec) -> dict[str, list[str]]:
    """Each task's upstream tasks: dependentTasks plus data producers (addImplicitDependencies)."""
    deps: dict[str, list[str]] = {}
    for name, task in dag.tasks.items():
        names = list(task.dependent_tasks)
        producers = []
        for spec in task.inputs.parameters.values():
            if spec.HasField("task_final_status"):
                raise PipelineRejected(
                    "failed to add implicit deps: task final status not supported yet"
                )
            if spec.HasField("task_output_parameter"):
                producers.append(spec.task_output_parameter.producer_task)
        producers += [
            s.task_output_artifact.producer_task
            for s in task.inputs.artifacts.values()
            if s.HasField("task_output_artifact")
        ]
        for producer in producers:
            if producer not in dag.tasks:
                raise PipelineRejected(
                    f"failed to add implicit deps: unknown producer task {producer!r} in DAG"
                )
            if producer not in names:
                names.append(producer)
        deps[name] = names
    return deps


def exit_hooks(dag: pb.DagSpec) -> dict[str, list[str]]:
    """dag.go: a task with strategy ALL_UPSTREAM_TASKS_COMPLETED is an Argo exit hook of each of
    its dependent tasks; it runs when that task ends, however it ends."""
    hooks: dict[str, list[str]] = {}
    for name in sorted(dag.tasks):
        task = dag.tasks[name]
        if task.trigger_policy.strategy == EXIT_STRATEGY:
            for dep in task.dependent_tasks:
                hooks.setdefault(dep, []).append(name)
    return hooks


def retry_policy(spec: pb.PipelineSpec, task_name: str) -> pb.PipelineTaskSpec.RetryPolicy | None:
    """container.go getTaskRetryPolicySpec: looked up by task name in the ROOT DAG only, so a
    retry policy on a task inside a group (an ExitHandler, a sub-pipeline) is ignored in 2.5.0."""
    task = spec.root.dag.tasks.get(task_name)
    if task is None or not task.HasField("retry_policy"):
        return None
    return task.retry_policy


def unsupported(pipeline: Pipeline) -> None:
    """Refuse what the harness does not reproduce, naming it (docs/cluster-runner.md)."""
    dags = [("root", pipeline.spec.root)] + [
        (name, c) for name, c in pipeline.spec.components.items() if c.HasField("dag")
    ]
    for dag_name, component in dags:
        outputs = component.dag.outputs
        if dag_name != "root" and (outputs.parameters or outputs.artifacts):
            raise NotReproduced(f"{dag_name}: DAG outputs (a sub-pipeline's return values)")
        for name, task in component.dag.tasks.items():
            what = []
            if task.HasField("parameter_iterator") or task.HasField("artifact_iterator"):
                what.append("dsl.ParallelFor")
            if task.trigger_policy.condition:
                what.append("dsl.If/dsl.Condition")
            if any(s.parameter_expression_selector for s in task.inputs.parameters.values()):
                what.append("parameter expression selectors")
            component_spec = pipeline.component(task)
            if component_spec.WhichOneof("implementation") == "executor_label":
                executor = pipeline.executors[component_spec.executor_label]
                if executor.WhichOneof("spec") != "container":
                    what.append(f"{executor.WhichOneof('spec')} executors")
            if what:
                raise NotReproduced(f"task {name!r} in {dag_name}: {', '.join(what)}")
