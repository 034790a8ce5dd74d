"""The store's vocabulary: the names gptpipe records under, and plain values in MLMD's protos.

Types use TFX's names (`Examples`, `Model`, `ModelEvaluation`, `ModelBlessing`, `PushedModel`)
and contexts TFX's and KFP's (`pipeline`, `pipeline_run`), so TFX and Vertex tools can read the
same store. Property values are plain Python (str, int, float; lists and dicts as JSON), and an
event's path names the step's input or output key and index, as TFX writes it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format

from components.lineage.store import mlmd

Scalar = str | int | float

# The artifact types, with TFX's names: the one place they are spelled.
EXAMPLES_TYPE = "Examples"  # tokenize's output (contracts.examples)
MODEL_TYPE = "Model"  # train's output
MODEL_EVALUATION_TYPE = "ModelEvaluation"  # evaluate's metrics and report
MODEL_BLESSING_TYPE = "ModelBlessing"  # evaluate's decision (contracts.blessing)
PUSHED_MODEL_TYPE = "PushedModel"  # push's outcome, and a rollback's input and output
# Each type's typed properties, as TFX declares them; everything else is a custom property.
ARTIFACT_TYPES: dict[str, dict[str, int]] = {
    EXAMPLES_TYPE: {"span": mlmd.INT, "split_names": mlmd.STRING, "version": mlmd.INT},
    MODEL_TYPE: {},
    MODEL_EVALUATION_TYPE: {},
    MODEL_BLESSING_TYPE: {},
    PUSHED_MODEL_TYPE: {},
}
PIPELINE_CONTEXT = "pipeline"
RUN_CONTEXT = "pipeline_run"
DATASET_CONTEXT = "dataset_version"
EXECUTION_TYPE_PREFIX = "gptpipe."


@dataclass(frozen=True)
class ArtifactRecord:
    """One artifact a step read or wrote, as the step knows it."""

    type_name: str  # one of ARTIFACT_TYPES, e.g. "Examples"
    uri: str  # where the bytes are (local path or gs://)
    properties: dict[str, Any] = field(default_factory=dict)  # str/int/float; lists, dicts as JSON


# ---- property values ------------------------------------------------------------------------


def set_values(target: Any, values: Mapping[str, Any]) -> None:
    """Write plain values into an MLMD property map; None is left out."""
    for key, raw in values.items():
        value = to_scalar(raw)
        if value is None:
            continue
        if isinstance(value, int):
            target[key].int_value = value
        elif isinstance(value, float):
            target[key].double_value = value
        else:
            target[key].string_value = value


def to_scalar(value: Any) -> Scalar | None:
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


def plain_values(values: Any) -> dict[str, Any]:
    """An MLMD property map as plain Python; structs (from other writers) as dicts."""
    plain: dict[str, Any] = {}
    for key, value in values.items():
        kind = value.WhichOneof("value")
        if kind == "struct_value":
            plain[key] = json_format.MessageToDict(value.struct_value)
        elif kind in ("int_value", "double_value", "string_value", "bool_value"):
            plain[key] = getattr(value, kind)
    return plain


# ---- event paths ----------------------------------------------------------------------------


def new_event(kind: int, key: str, index: int) -> Any:
    """An event whose path names the step's input or output key, as TFX writes it."""
    event = mlmd.Event(type=kind)
    event.path.steps.add().key = key
    event.path.steps.add().index = index
    return event


def event_key(event: Any) -> str:
    """The input or output key an event's path names ("" if none)."""
    return next((s.key for s in event.path.steps if s.HasField("key")), "")


def event_index(event: Any) -> int:
    """The index under its key an event's path names (0 if none)."""
    return next((s.index for s in event.path.steps if s.HasField("index")), 0)
