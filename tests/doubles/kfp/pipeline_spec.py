"""What KFP 2.5's API server reads from a stored pipeline: its spec as the API returns it, and
the run parameters it refuses on create (v2_template.go validatePipelineJobInputs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml


def spec_struct(text: str) -> Any:
    """The stored YAML as the API returns it (api_util.go yamlStringToPipelineSpecStruct):
    the pipeline spec, or {"pipeline_spec", "platform_spec"} when a platform spec follows."""
    docs = [yaml.safe_load(doc) for doc in text.split("\n---\n") if doc.strip()]
    platform = [d for d in docs if isinstance(d, dict) and "platforms" in d]
    spec = next(d for d in docs if isinstance(d, dict) and "platforms" not in d)
    return {"pipeline_spec": spec, "platform_spec": platform[0]} if platform else spec


def root_spec(text: str) -> Any:
    """The pipeline spec of a stored YAML, without its platform spec."""
    spec = spec_struct(text)
    return spec.get("pipeline_spec", spec)


# v2_template.go validatePipelineJobInputs: per parameter type, the JSON value (structpb.Value
# kind) it takes, and KFP's words when it gets another.
_PARAMETER_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "NUMBER_DOUBLE": (
        lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "requires type double or integer, but the parameter value is not of number value type",
    ),
    "STRING": (
        lambda v: isinstance(v, str),
        "requires type string, but the input parameter is not of string value type",
    ),
    "BOOLEAN": (
        lambda v: isinstance(v, bool),
        "requires type bool, but the input parameter is not of bool value type",
    ),
    "LIST": (
        lambda v: isinstance(v, list),
        "requires type list, but the input parameter is not of list value type",
    ),
    "STRUCT": (
        lambda v: isinstance(v, dict),
        "requires type struct, but the input parameter is not of struct value type",
    ),
}
_PARAMETER_KINDS["NUMBER_INTEGER"] = _PARAMETER_KINDS["NUMBER_DOUBLE"]


def invalid_inputs(spec: Any, runtime_config: Any) -> str:
    """What v2_template.go validatePipelineJobInputs refuses in a run's parameters, or "".

    Go ranges over maps in no set order, so which of several problems KFP names varies; here
    it is the first by name, and extra parameters are listed sorted."""
    declared = ((spec.get("root") or {}).get("inputDefinitions") or {}).get("parameters") or {}
    given = (runtime_config.parameters if runtime_config is not None else None) or {}
    for name, param in sorted(declared.items()):
        if name not in given:
            if not param.get("isOptional") and "defaultValue" not in param:
                return (
                    f"parameter {name} is not optional, yet has neither default value nor user "
                    "provided value"
                )
            continue
        ptype = param.get("parameterType", "PARAMETER_TYPE_ENUM_UNSPECIFIED")
        if ptype == "PARAMETER_TYPE_ENUM_UNSPECIFIED":
            return f"input parameter {name} has unspecified type"
        if ptype == "TASK_FINAL_STATUS":
            return (
                f"input parameter {name} requires type TASK_FINAL_STATUS, which is invalid for "
                "root component"
            )
        if ptype not in _PARAMETER_KINDS:
            return f"input parameter {name} requires type unknown"
        fits, refusal = _PARAMETER_KINDS[ptype]
        if not fits(given[name]):
            return f"input parameter {name} {refusal}"
    extra = sorted(set(given) - set(declared))
    if extra:
        return f"parameter(s) provided are not required by pipeline: {', '.join(extra)}"
    return ""
