"""contracts.records: strict JSON round trips of frozen dataclasses."""

from dataclasses import dataclass, field

import pytest

from contracts import records
from contracts.errors import UserError


@dataclass(frozen=True)
class Inner:
    name: str  # no default: required
    size: int = 1


@dataclass(frozen=True)
class Outer:
    count: int = 2
    ratio: float = 0.5
    flag: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    items: tuple[dict, ...] = ()
    maybe: int | None = None
    inner: Inner = field(default_factory=lambda: Inner("a"))


def test_a_record_round_trips_and_tuples_come_back_as_tuples():
    made = Outer(3, 0.25, True, {"pool": "gpu"}, ({"key": "k"},), 7, Inner("b", 4))
    text = records.to_json(made)
    assert records.from_json(Outer, text, "outer") == made
    assert records.to_dict(made)["items"] == [{"key": "k"}]


def test_a_missing_field_takes_its_default_and_a_required_one_is_named():
    assert records.from_dict(Outer, {}, "outer") == Outer()
    with pytest.raises(UserError, match=r"outer.inner: missing name"):
        records.from_dict(Outer, {"inner": {"size": 2}}, "outer")


def test_an_integral_float_is_an_int_as_a_protobuf_struct_carries_it():
    assert records.from_dict(Outer, {"count": 8.0}, "outer").count == 8
    with pytest.raises(UserError, match=r"^outer.count=8.5: takes a whole number$"):
        records.from_dict(Outer, {"count": 8.5}, "outer")


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"cuont": 1}, r"outer has no field 'cuont' \(did you mean outer.count\?\)"),
        ({"flag": 1}, r"outer.flag=1: takes true or false"),
        ({"count": True}, r"outer.count=true: takes a whole number"),
        ({"ratio": "0.1"}, r"outer.ratio=\"0.1\": takes a number"),
        ({"labels": {"pool": 1}}, r"outer.labels.pool=1: takes a string"),
        ({"items": {"key": "k"}}, r"outer.items=.*: takes a list"),
        ({"maybe": "x"}, r"outer.maybe=\"x\": takes int or null"),
        ([], r"outer: expected a JSON object, got list"),
    ],
)
def test_a_wrong_key_or_type_is_one_line_naming_the_field(data, said):
    with pytest.raises(UserError, match=said):
        records.from_dict(Outer, data, "outer")


def test_malformed_json_names_what_it_was():
    with pytest.raises(UserError, match="^outer is not valid JSON"):
        records.from_json(Outer, "{", "outer")


@dataclass(frozen=True)
class Loss:
    value: records.AnyFloat = 0.0
    maybe: records.AnyFloat | None = None


def test_an_any_float_field_carries_nan_and_infinity_which_a_float_field_refuses():
    made = Loss(float("inf"), float("nan"))
    back = records.from_json(Loss, records.to_json(made), "loss")
    assert back.value == float("inf") and back.maybe != back.maybe  # NaN
    with pytest.raises(UserError, match=r"^loss.value=\"nan\": takes a number$"):
        records.from_dict(Loss, {"value": "nan"}, "loss")
    with pytest.raises(UserError, match=r"^outer.ratio=nan: takes a finite number$"):
        records.from_dict(Outer, {"ratio": float("nan")}, "outer")


@dataclass(frozen=True)
class Holder:
    inner: Inner | None = None


def test_an_optional_record_names_the_field_inside_it_that_is_wrong():
    assert records.from_dict(Holder, {"inner": None}, "h") == Holder()
    with pytest.raises(UserError, match=r"^h.inner.size=\"2\": takes a whole number$"):
        records.from_dict(Holder, {"inner": {"name": "n", "size": "2"}}, "h")
