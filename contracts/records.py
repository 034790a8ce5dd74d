"""Frozen dataclasses that cross a boundary as JSON: a step's parameters, an artifact's record.

`to_dict` and `from_dict` round-trip one strictly, as `trainer.config` does the config: an
unknown key or a value of the wrong type is one `UserError` naming `<what>.<field>` (with a
"did you mean"); a missing field takes its default, so a record written before a field was added
still reads. Field types are the JSON ones: str, int, float, bool, None, `dict[str, X]`,
`list[X]` / `tuple[X, ...]`, `X | None`, `Any`, `AnyFloat`, and nested record classes. A union
of record classes takes the first that reads the object without error.

A KFP parameter of type dict travels as a protobuf Struct, whose numbers are all doubles, so an
integral float (8.0) is taken for an int field; 8.5 is still refused.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, TypeVar

from contracts.errors import UserError

R = TypeVar("R")

# A float that may be NaN or infinite (a diverged loss): written as Python's json writes it
# (NaN, Infinity) and read back so. A plain float field refuses those.
NON_FINITE = "non-finite allowed"
AnyFloat = Annotated[float, NON_FINITE]


def to_dict(record: Any) -> dict[str, Any]:
    """`record` as a JSON-ready dict: every field, nested records as dicts, tuples as lists."""
    return {f.name: _plain(getattr(record, f.name)) for f in dataclasses.fields(record)}


def to_json(record: Any) -> str:
    """`record` as canonical JSON (sorted keys, no spaces): stable for hashing and comparing."""
    return json.dumps(to_dict(record), sort_keys=True, separators=(",", ":"))


def from_dict(cls: type[R], data: object, what: str) -> R:
    """Rebuild a `cls` from `to_dict` output; `what` names it in errors (`train_job`).

    The class's own `__post_init__` checks then run, so a record read back is as valid as one
    made in code.
    """
    if not isinstance(data, Mapping):
        raise UserError(f"{what}: expected a JSON object, got {_kind(data)}")
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise unknown_key(what, str(unknown[0]), fields)
    missing = [
        name
        for name, f in fields.items()
        if name not in data
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise UserError(f"{what}: missing {', '.join(missing)}")
    values = {name: _typed(f"{what}.{name}", hints[name], data[name]) for name in data}
    return cls(**values)


def from_json(cls: type[R], text: str, what: str) -> R:
    """`from_dict` of a JSON text; malformed JSON is one line naming `what`."""
    try:
        data = json.loads(text)
    except ValueError as err:
        raise UserError(f"{what} is not valid JSON: {err}") from None
    return from_dict(cls, data, what)


def from_value(hint: Any, value: object, what: str) -> Any:
    """`value` read as a field of type `hint` is (a list of records, a union); `what` names it."""
    return _typed(what, hint, value)


def unknown_key(what: str, key: str, known: typing.Iterable[str]) -> UserError:
    """The error for a key `what` does not have, with the nearest known one."""
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f" (did you mean {what}.{close[0]}?)" if close else ""
    return UserError(f"{what} has no field {key!r}{hint}; its fields are {', '.join(known)}")


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_dict(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _typed(name: str, hint: Any, value: Any) -> Any:  # noqa: PLR0911 -- one branch per type
    """`value` checked against `hint` (and converted where JSON cannot say: tuples, records)."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if origin is Annotated:
        base, *extras = typing.get_args(hint)
        if base is float and NON_FINITE in extras:
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
            raise _wrong(name, value, "a number")
        return _typed(name, base, value)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        given = [o for o in options if o is not type(None)]
        if len(given) == 1 and dataclasses.is_dataclass(given[0]):
            # one record or null: the record's own error names the field inside it
            return from_dict(given[0], value, name)  # type: ignore[arg-type]
        for option in options:
            if option is type(None):
                continue
            try:
                return _typed(name, option, value)
            except UserError:
                continue
        raise _wrong(name, value, " or ".join(_hint_name(o) for o in options))
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, name)  # type: ignore[arg-type]
    if origin in (dict, Mapping) or hint is dict:
        if not isinstance(value, Mapping):
            raise _wrong(name, value, "an object")
        args = typing.get_args(hint)
        inner = args[1] if len(args) == 2 else Any
        return {str(k): _typed(f"{name}.{k}", inner, v) for k, v in value.items()}
    if origin in (list, tuple, Sequence) or hint in (list, tuple):
        if not isinstance(value, list | tuple):
            raise _wrong(name, value, "a list")
        kinds = [a for a in typing.get_args(hint) if a is not Ellipsis]
        inner = kinds[0] if kinds else Any
        items = [_typed(f"{name}[{i}]", inner, v) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple or hint is tuple else items
    return _scalar(name, hint, value)


def _scalar(name: str, hint: Any, value: Any) -> Any:
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise _wrong(name, value, "true or false")
    if hint is int:
        if isinstance(value, float) and value.is_integer():
            return int(value)  # a protobuf Struct's number
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _wrong(name, value, "a whole number")
    if hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise _wrong(name, value, "a finite number")
            return float(value)
        raise _wrong(name, value, "a number")
    if hint is str:
        if isinstance(value, str):
            return value
        raise _wrong(name, value, "a string")
    if hint is type(None):
        if value is None:
            return None
        raise _wrong(name, value, "null")
    raise TypeError(f"{name}: records cannot hold a {hint!r}")  # a mistake in the class


def _hint_name(hint: Any) -> str:
    if typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    return "null" if hint is type(None) else getattr(hint, "__name__", str(hint))


def _wrong(name: str, value: Any, wanted: str) -> UserError:
    shown = str(value) if isinstance(value, float) else json.dumps(value, default=str)
    return UserError(f"{name}={shown}: takes {wanted}")
