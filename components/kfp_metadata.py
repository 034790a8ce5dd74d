"""Artifact metadata that KFP's launcher can record: no nulls, no NaN or infinity.

A component's artifact metadata travels in its executor output (JSON) to the launcher, which
parses it strictly and records it in ML Metadata (KFP 2.5.0 backend/src/v2/component/
launcher_v2.go getExecutorOutputFile; backend/src/v2/metadata/converter.go). A null value has
no MLMD type and fails the finished task there; NaN or infinity makes the whole file
unparseable JSON. Numbers that are not finite are kept as their strings ("nan", "inf"), as the
lineage layer stores them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def recordable(properties: Mapping[str, Any]) -> dict[str, Any]:
    """`properties` without None values, and with non-finite floats as strings."""
    out: dict[str, Any] = {}
    for key, value in properties.items():
        if value is None:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            value = str(value)
        out[key] = value
    return out
