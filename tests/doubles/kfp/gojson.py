"""JSON as KFP's Go binaries write it, for the harness in tests/doubles/kfp/backend.py.

The v2 driver and launcher are Go: numbers and escaping follow Go, not Python's `json`. This
matters where bytes are hashed (the cache fingerprint) and where a Python executor parses the
text back (`3` is an int to it, `3.0` a float).

- `go_float`: a float64 as `encoding/json` and `protojson` print it (both use the same rule:
  shortest digits, `f` form for 1e-6 <= |x| < 1e21, else `e` form with `e-7`, not `e-07`).
- `protojson_dumps`: compact `protojson.Marshal` output (the driver's `{{$}}` executor input).
  protojson escapes no HTML characters; its random whitespace is left out.
- `encoding_json_dumps`: `json.Marshal` of an `interface{}` value: keys sorted, `<`, `>`, `&`,
  U+2028 and U+2029 escaped (cacheutils.GenerateFingerPrint re-marshals with it).
- `value_from_py`, `value_to_py`, `message_to_py`: protobuf `Value`s and messages as plain data.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

from google.protobuf import json_format, struct_pb2
from google.protobuf.message import Message

_HTML_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


def format_float_f(x: float) -> str:
    """strconv.FormatFloat(x, 'f', -1, 64): shortest digits, never an exponent."""
    if x == 0:
        return "-0" if math.copysign(1.0, x) < 0 else "0"
    text = format(Decimal(repr(float(x))), "f")  # repr: the shortest round-tripping digits
    return text.rstrip("0").rstrip(".") if "." in text else text


def go_float(x: float) -> str:
    """strconv.AppendFloat(x, 'f' or 'e', -1, 64) as encoding/json's floatEncoder uses it."""
    if math.isnan(x) or math.isinf(x):
        raise ValueError(f"Go's JSON encoders reject {x}")
    if x == 0 or 1e-6 <= abs(x) < 1e21:
        return format_float_f(x)
    shortest = repr(float(x))
    mantissa, _, exponent = format(Decimal(shortest), "e").partition("e")
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    sign, digits = exponent[0], exponent[1:].lstrip("0") or "0"
    return f"{mantissa}e{sign}{digits.zfill(2) if sign == '+' else digits}"


def _encode(value: Any, sort_keys: bool) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (int, float)):
        return go_float(float(value))
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        keys = sorted(value) if sort_keys else list(value)
        items = (f"{_encode(str(k), sort_keys)}:{_encode(value[k], sort_keys)}" for k in keys)
        return "{" + ",".join(items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_encode(v, sort_keys) for v in value) + "]"
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def protojson_dumps(data: Any) -> str:
    """Compact protojson-style text for plain data made by `message_to_py`."""
    return _encode(data, sort_keys=True)


def encoding_json_dumps(data: Any) -> str:
    """Go's json.Marshal of decoded JSON: sorted keys, HTML-safe escaping."""
    text = _encode(data, sort_keys=True)
    for char, escape in _HTML_ESCAPES.items():
        text = text.replace(char, escape)
    return text


def message_to_py(message: Message) -> Any:
    """A protobuf message as protojson's field names and values (json_name, defaults omitted)."""
    return json_format.MessageToDict(message, preserving_proto_field_name=False)


def value_from_py(data: Any) -> struct_pb2.Value:
    """A google.protobuf.Value holding `data` (structpb.NewValue)."""
    value = struct_pb2.Value()
    json_format.ParseDict(data, value)
    return value


def value_to_py(value: struct_pb2.Value) -> Any:
    """The plain data in a google.protobuf.Value."""
    return json_format.MessageToDict(value)


def value_to_text(value: struct_pb2.Value) -> str:
    """metadata.PbValueToText (backend/src/v2/metadata/converter.go): a Value as a string."""
    kind = value.WhichOneof("kind")
    if kind in (None, "null_value"):
        return ""
    if kind == "string_value":
        return value.string_value
    if kind == "number_value":
        return format_float_f(value.number_value)
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    # json.Marshal of a ListValue/Struct: protojson output compacted by encoding/json.
    return encoding_json_dumps(value_to_py(value))
