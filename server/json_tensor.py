"""TF Serving's JSON for tensors: a predict request's inputs, and the outputs as JSON.

A port of tensorflow_serving/util/json_tensor.cc (TF Serving 2.19): `fill_predict_request` is
its FillPredictRequestFromJson, `make_json` its MakeJsonFromTensors, and each check raises the
InvalidArgument message it does (every rule below names the C++ function it follows). What
the port cannot match byte for byte, and why:

- parse errors: rapidjson's message for the JSON error Python's parser reports (`_PARSE_ERRORS`);
  the offset is Python's, in bytes. Like rapidjson with kParseStopWhenDoneFlag, text after the
  document is ignored, and NaN and Infinity are numbers (kParseNanAndInfFlag). Unlike
  TF Serving, whose rapidjson does not validate UTF-8, a body that is not UTF-8 is refused.
- a JSON value quoted in a message (JsonValueToDebugString) is written on one line, where
  rapidjson's PrettyWriter breaks objects over lines; both cut it at 256 bytes.
- the response is written on one line; TF Serving's PrettyWriter indents it. Numbers are
  written as WriteDecimal does: six significant digits when they round-trip, else all
  (max_digits10), ".0" after a whole number, NaN and Infinity as bare words.
- a DT_STRING output that is not UTF-8 is written with U+FFFD for each bad byte, where
  rapidjson writes the bytes as they are (JSON no client can read); outputs named `*_bytes`
  are base64 as TF Serving writes them.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from server.status import Code, ServingError, invalid_argument

SIGNATURE_KEY = "signature_name"  # kPredictRequestSignatureKey
INSTANCES_KEY = "instances"  # kPredictRequestInstancesKey
INPUTS_KEY = "inputs"  # kPredictRequestInputsKey
PREDICTIONS_KEY = "predictions"  # kPredictResponsePredictionsKey
OUTPUTS_KEY = "outputs"  # kPredictResponseOutputsKey
BASE64_KEY = "b64"  # kBase64Key
BYTES_SUFFIX = "_bytes"  # kBytesTensorNameSuffix: a DT_STRING output of binary values
MAX_DEBUG_BYTES = 256  # kMaxJsonDebugStringBytes

_INT_RANGES = {  # AddValueToTensor: the rapidjson Is*() check each dtype makes
    "DT_INT32": (-(2**31), 2**31),  # IsInt, for DT_INT32, DT_INT16, DT_INT8 and DT_UINT8
    "DT_INT16": (-(2**31), 2**31),
    "DT_INT8": (-(2**31), 2**31),
    "DT_UINT8": (-(2**31), 2**31),
    "DT_INT64": (-(2**63), 2**63),  # IsInt64
    "DT_UINT32": (0, 2**32),  # IsUint
    "DT_UINT64": (0, 2**64),  # IsUint64
}
_FLOATS = ("DT_FLOAT", "DT_DOUBLE")


class Format(enum.Enum):
    """JsonPredictRequestFormat: which form the request took, so the response takes it too."""

    ROW = "row"  # "instances" in, "predictions" out
    COLUMNAR = "columnar"  # "inputs" in, "outputs" out


@dataclass(frozen=True)
class Tensor:
    """One input as the request gave it (a TensorProto's part that matters here)."""

    dtype: str  # the signature's DataType name: "DT_STRING", "DT_INT32", ...
    shape: tuple[int, ...]
    values: list[Any]  # flat, row-major: bytes, int, float or bool


# A signature's inputs by name -> each one's DataType name; raises ServingError when the model
# or the signature is not there (HttpRestApiHandler::GetInfoMap).
InputsOf = Callable[[str], Mapping[str, str]]


# ---- the request ----------------------------------------------------------------------------


def fill_predict_request(body: bytes, inputs_of: InputsOf) -> tuple[str, Format, dict]:
    """FillPredictRequestFromJson: (signature name as given, "" when absent; the format; the
    inputs by name as `Tensor`s)."""
    doc = parse_json(body)
    signature = doc.get(SIGNATURE_KEY, "")
    if not isinstance(signature, str):  # FillSignature
        raise invalid_argument(
            "JSON Value: ",
            debug_string(doc),
            " not formatted correctly. 'signature_name' key must be a string value.",
        )
    infos = inputs_of(signature)
    if not infos:
        raise invalid_argument("Failed to get input map for signature: ", signature or "DEFAULT")
    if INSTANCES_KEY in doc and INPUTS_KEY in doc:
        raise invalid_argument(
            "JSON Value: ",
            debug_string(doc),
            " Not formatted correctly expecting only one of 'inputs' or 'instances' keys to exist ",
        )
    if INSTANCES_KEY in doc:
        instances = doc[INSTANCES_KEY]
        if not isinstance(instances, list):
            raise invalid_argument(
                "JSON Value: ", debug_string(doc), " Expecting 'instances' to be an list/array"
            )
        if not instances:
            raise invalid_argument(
                "JSON Value: ", debug_string(doc), " No values in 'instances' array"
            )
        return signature, Format.ROW, _from_instances(instances, infos)
    if INPUTS_KEY in doc:
        return signature, Format.COLUMNAR, _from_inputs(doc[INPUTS_KEY], infos)
    raise invalid_argument("Missing 'inputs' or 'instances' key")


def parse_json(body: bytes) -> dict:
    """ParseJson: the request's top-level object."""
    if not body:
        raise invalid_argument("JSON Parse error: The document is empty")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise invalid_argument(
            "JSON Parse error: Invalid encoding in string. at offset: ", err.start
        ) from None
    start = len(text) - len(text.lstrip(" \t\n\r"))
    if start == len(text):
        raise invalid_argument("JSON Parse error: The document is empty. at offset: ", len(body))
    try:
        doc, _ = json.JSONDecoder().raw_decode(text, start)  # stops when done, as rapidjson
    except json.JSONDecodeError as err:
        offset = len(text[: err.pos].encode("utf-8"))
        raise invalid_argument(
            "JSON Parse error: ", _parse_message(err, text), " at offset: ", offset
        ) from None
    except RecursionError:
        raise invalid_argument("JSON Parse error: the document nests too deep") from None
    if not isinstance(doc, dict):
        raise invalid_argument("JSON Value: ", debug_string(doc), " Is not object")
    return doc


# Python's JSON error -> rapidjson's (GetParseError_En) for the same mistake.
_PARSE_ERRORS = {
    "Expecting value": "Invalid value.",
    "Expecting property name enclosed in double quotes": "Missing a name for object member.",
    "Expecting ':' delimiter": "Missing a colon after a name of object member.",
    "Unterminated string starting at": "Missing a closing quotation mark in string.",
    "Invalid \\escape": "Invalid escape character in string.",
    "Invalid \\uXXXX escape": "Incorrect hex digit after \\u escape in string.",
    "Invalid control character at": "Invalid encoding in string.",
}


def _parse_message(err: json.JSONDecodeError, text: str) -> str:
    if err.msg == "Expecting ',' delimiter":
        if _innermost_bracket(text[: err.pos]) == "{":
            return "Missing a comma or '}' after an object member."
        return "Missing a comma or ']' after an array element."
    return _PARSE_ERRORS.get(err.msg, err.msg)


def _innermost_bracket(text: str) -> str:
    """The innermost `{` or `[` still open at the end of `text` (JSON strings skipped)."""
    stack: list[str] = []
    for token in re.finditer(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]', text):
        c = token.group()
        if c in "[{":
            stack.append(c)
        elif c in "]}" and stack:
            stack.pop()
    return stack[-1] if stack else ""


def _from_instances(instances: list, infos: Mapping[str, str]) -> dict[str, Tensor]:
    """FillTensorMapFromInstancesList: the row format, one item of `instances` per batch row."""
    names = sorted(infos)
    if not isinstance(instances[0], dict) and len(infos) > 1:
        raise invalid_argument(
            "instances is a plain list, but expecting list of objects as multiple input "
            "tensors required as per tensorinfo_map"
        )
    objects = _is_object(instances[0])
    rows = _Rows(infos)
    for count, elem in enumerate(instances):
        if objects:
            if not _is_object(elem):
                raise invalid_argument(
                    "Expecting object but got list at item ", count, " of input list"
                )
            for key, item in elem.items():
                try:
                    rows.add(item, key)
                except ServingError as err:
                    raise invalid_argument(
                        f"Failed to process element: {count} key: {key} of 'instances' list. "
                        f"Error: {err}"
                    ) from None
            if set(elem) != set(names):
                raise invalid_argument(
                    f"Failed to process element: {count} of 'instances' list. JSON object: "
                    f"{debug_string(elem)} keys must be equal to: {','.join(names)}"
                )
        else:
            if _is_object(elem):
                raise invalid_argument(
                    "Expecting value/list but got object at item ", count, " of input list"
                )
            try:
                rows.add(elem, names[0])
            except ServingError as err:
                raise invalid_argument(
                    "Failed to process element: ", count, " of 'instances' list. Error: ", err
                ) from None
    return rows.tensors(len(instances))


class _Rows:
    """The tensors the row format builds, an item at a time (AddInstanceItem): every item of
    one input must have the same size and shape."""

    def __init__(self, infos: Mapping[str, str]) -> None:
        self.infos = infos
        self.shapes: dict[str, list[int]] = {}
        self.values: dict[str, list[Any]] = {}

    def add(self, item: Any, name: str) -> None:
        if name not in self.infos:
            raise invalid_argument("JSON object: does not have named input: ", name)
        shape = _dense_shape(item)
        flat: list[Any] = []
        _fill(item, 0, self.infos[name], shape, flat)
        if name not in self.shapes:
            self.shapes[name], self.values[name] = shape, flat
            return
        size = math.prod(self.shapes[name])
        if size != len(flat):
            raise invalid_argument("Expecting tensor size: ", size, " but got: ", len(flat))
        if self.shapes[name] != shape:
            raise invalid_argument(
                f"Expecting shape {_shape_string(self.shapes[name])} but got: "
                f"{_shape_string(shape)}"
            )
        self.values[name].extend(flat)

    def tensors(self, count: int) -> dict[str, Tensor]:
        """Each input batched: the number of items, then one item's shape."""
        return {
            name: Tensor(self.infos[name], (count, *self.shapes[name]), values)
            for name, values in self.values.items()
        }


def _from_inputs(value: Any, infos: Mapping[str, str]) -> dict[str, Tensor]:
    """FillTensorMapFromInputsMap: the columnar format, each input whole."""
    names = sorted(infos)
    if not isinstance(value, dict) or _is_b64(value):
        if len(infos) > 1:
            raise invalid_argument(
                "inputs is a plain value/list, but expecting an object as multiple input "
                "tensors required as per tensorinfo_map"
            )
        return {names[0]: _tensor(value, infos[names[0]])}
    tensors = {}
    for name in names:
        if name not in value:
            raise invalid_argument("Missing named input: ", name, " in 'inputs' object.")
        tensors[name] = _tensor(value[name], infos[name])
    return tensors


def _tensor(value: Any, dtype: str) -> Tensor:
    shape = _dense_shape(value)
    flat: list[Any] = []
    _fill(value, 0, dtype, shape, flat)
    return Tensor(dtype, tuple(shape), flat)


def _dense_shape(value: Any) -> list[int]:
    """GetDenseTensorShape: the shape the first element at each level implies."""
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return shape


def _fill(value: Any, level: int, dtype: str, shape: list[int], out: list[Any]) -> None:
    """FillTensorProto: append the leaves of `value` to `out`, checking it is dense."""
    rank = len(shape)
    if not isinstance(value, list):
        if level != rank:
            raise invalid_argument(
                f"JSON Value: {debug_string(value)} found at incorrect level: {level + 1} in "
                f"the JSON DOM. Expected at level: {rank}"
            )
        if isinstance(value, dict):
            if dtype != "DT_STRING":
                raise _type_error(value, dtype)
            out.append(_decode_base64(value))
        else:
            out.append(_value(value, dtype))
        return
    if level >= rank:
        raise invalid_argument(
            "Encountered list at unexpected level: ", level, " expected < ", rank
        )
    if len(value) != shape[level]:
        raise invalid_argument(
            f"Encountered list at unexpected size: {len(value)} at level: {level} expected "
            f"size: {shape[level]}"
        )
    for item in value:
        _fill(item, level + 1, dtype, shape, out)


def _value(value: Any, dtype: str) -> Any:
    """AddValueToTensor: a JSON scalar as `dtype`, if rapidjson's type check allows it."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if dtype in _FLOATS:
        if not number:
            raise _type_error(value, dtype)
        return float(value)
    if dtype in _INT_RANGES:
        low, high = _INT_RANGES[dtype]
        if not (number and isinstance(value, int) and low <= value < high):
            raise _type_error(value, dtype)
        return value
    if dtype == "DT_STRING":
        if not isinstance(value, str):
            raise _type_error(value, dtype)
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate, "\ud800": rapidjson refuses it parsing
            raise invalid_argument(
                "JSON Parse error: The surrogate pair in string is invalid."
            ) from None
    if dtype == "DT_BOOL":
        if not isinstance(value, bool):
            raise _type_error(value, dtype)
        return value
    raise ServingError(
        Code.UNIMPLEMENTED,
        f"Conversion of JSON Value: {debug_string(value)} to type: {_type_name(dtype)}",
    )


def _decode_base64(value: dict) -> bytes:
    """JsonDecodeBase64Object: `{"b64": "..."}` as its bytes."""
    if not _is_b64(value):
        raise invalid_argument(
            "JSON Value: ", debug_string(value), " not formatted correctly for base64 data"
        )
    text = value[BASE64_KEY]
    try:  # absl::Base64Unescape takes the padding as optional
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise invalid_argument("Unable to base64 decode") from None


def _is_b64(value: Any) -> bool:
    """IsValBase64Object: an object whose one key is "b64", a string."""
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get(BASE64_KEY), str)


def _is_object(value: Any) -> bool:
    return isinstance(value, dict) and not _is_b64(value)


def _type_error(value: Any, dtype: str) -> ServingError:
    return invalid_argument(
        f"JSON Value: {debug_string(value)} Type: {_json_type(value)} is not of expected type: "
        f"{_type_name(dtype)}"
    )


def _json_type(value: Any) -> str:
    """JsonTypeString."""
    if value is None:
        return "Null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, dict):
        return "Object"
    if isinstance(value, list):
        return "Array"
    return "String" if isinstance(value, str) else "Number"


def _type_name(dtype: str) -> str:
    """DataTypeString: DT_FLOAT -> "float", DT_INT32 -> "int32"."""
    return dtype.removeprefix("DT_").lower()


def _shape_string(shape: list[int]) -> str:
    """ShapeToString: "[2,3]"."""
    return "[" + ",".join(str(d) for d in shape) + "]"


def debug_string(value: Any) -> str:
    """JsonValueToDebugString: a JSON value for a message, cut at MAX_DEBUG_BYTES (on one line)."""
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    cut = text.encode("utf-8")[:MAX_DEBUG_BYTES]
    return cut.decode("utf-8", errors="ignore")


# ---- the response ---------------------------------------------------------------------------


def make_json(outputs: Mapping[str, np.ndarray], fmt: Format) -> bytes:
    """MakeJsonFromTensors: the outputs as a predict response in the request's format. One
    output is written bare; several as an object (a list of them, one a row, in row format)."""
    if not outputs:
        raise invalid_argument("Cannot convert empty tensor map to JSON")
    names = sorted(outputs)
    if fmt is Format.ROW:
        batch = _batch_size(outputs)
        rows = []
        for item in range(batch):
            values = {name: _write(outputs[name][item], name) for name in names}
            rows.append(_object(values) if len(names) > 1 else values[names[0]])
        text = f'{{"{PREDICTIONS_KEY}": [{", ".join(rows)}]}}'
    else:
        values = {name: _write(outputs[name], name) for name in names}
        body = _object(values) if len(names) > 1 else values[names[0]]
        text = f'{{"{OUTPUTS_KEY}": {body}}}'
    return text.encode("utf-8")


def _batch_size(outputs: Mapping[str, np.ndarray]) -> int:
    """MakeRowFormatJsonFromTensors: every output's 0-th dimension, which must agree."""
    batch = -1
    for name in sorted(outputs):
        array = outputs[name]
        if array.ndim == 0:
            raise invalid_argument("Tensor name: ", name, " has no shape information ")
        if batch >= 0 and array.shape[0] != batch:
            raise invalid_argument(
                f"Tensor name: {name} has inconsistent batch size: {array.shape[0]} expecting: "
                f"{batch}"
            )
        batch = array.shape[0]
    return batch


def _object(values: Mapping[str, str]) -> str:
    return "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in values.items()) + "}"


def _write(array: np.ndarray, name: str) -> str:
    """AddTensorValues: a tensor as nested lists (a scalar bare)."""
    array = np.asarray(array)
    leaf = _leaf_writer(array.dtype, name)

    def nested(value: Any) -> str:
        if isinstance(value, list):
            return "[" + ", ".join(nested(v) for v in value) + "]"
        return leaf(value)

    return nested(array.tolist())


def _leaf_writer(dtype: np.dtype, name: str) -> Callable[[Any], str]:
    """AddSingleValueAndAdvance for one dtype."""
    if dtype == np.float32:
        return lambda v: write_decimal(v, 32)
    if dtype == np.float64:
        return lambda v: write_decimal(v, 64)
    if dtype == np.bool_:
        return lambda v: "true" if v else "false"
    if dtype.kind in "iu":
        return str
    if dtype.kind in "OSU":
        if name.endswith(BYTES_SUFFIX):  # IsNamedTensorBytes
            return lambda v: _object({BASE64_KEY: json.dumps(base64.b64encode(_bytes(v)).decode())})
        return lambda v: json.dumps(_bytes(v).decode("utf-8", "replace"), ensure_ascii=False)
    raise invalid_argument("Failed to write JSON value for tensor type: ", dtype)


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


def write_decimal(value: float, bits: int) -> str:
    """WriteDecimal: absl::StrCat's six significant digits ("%.6g") if they read back as the
    same float (or double), else max_digits10 of them; ".0" after a whole number not written
    in exponent form; NaN, Infinity and -Infinity as words."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "-Infinity" if value < 0 else "Infinity"
    text = f"{value:.6g}"
    if not _reads_back(text, value, bits):
        text = f"{value:.{9 if bits == 32 else 17}g}"
    if "." not in text and "e" not in text:
        text += ".0"
    return text


def _reads_back(text: str, value: float, bits: int) -> bool:
    if bits == 32:
        return bool(np.float32(float(text)) == np.float32(value))
    return float(text) == value
