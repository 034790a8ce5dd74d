"""TF Serving's JSON for tensors (server/json_tensor.py): the row and columnar request forms,
each check's InvalidArgument message as json_tensor.cc words it, and the response's shapes and
numbers. Pure: no model, no TensorFlow."""

import json
import math

import numpy as np
import pytest

from server.json_tensor import Format, Tensor, fill_predict_request, make_json, write_decimal
from server.status import Code, ServingError

GENERATE = {
    "prompt": "DT_STRING",
    "max_new_tokens": "DT_INT32",
    "temperature": "DT_FLOAT",
    "stop_at_eos": "DT_BOOL",
}
SCORE = {"text": "DT_STRING"}


def fill(doc, infos=GENERATE):
    """fill_predict_request on `doc` (JSON text or a value), the inputs of one signature."""
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return fill_predict_request(body, lambda signature: infos)


def error_of(doc, infos=GENERATE) -> ServingError:
    with pytest.raises(ServingError) as caught:
        fill(doc, infos)
    return caught.value


# ---- the request forms ----------------------------------------------------------------------


def test_columnar_inputs_keep_their_own_shapes_scalars_included():
    doc = {
        "inputs": {
            "prompt": ["a", "b"],
            "max_new_tokens": 5,
            "temperature": 0.5,
            "stop_at_eos": True,
        }
    }
    signature, fmt, inputs = fill(doc)
    assert signature == "" and fmt is Format.COLUMNAR
    assert inputs["prompt"] == Tensor("DT_STRING", (2,), [b"a", b"b"])
    assert inputs["max_new_tokens"] == Tensor("DT_INT32", (), [5])
    assert inputs["temperature"] == Tensor("DT_FLOAT", (), [0.5])
    assert inputs["stop_at_eos"] == Tensor("DT_BOOL", (), [True])


def test_one_input_may_be_given_bare_in_either_form():
    _, fmt, inputs = fill({"signature_name": "score", "inputs": ["x", "y"]}, SCORE)
    assert fmt is Format.COLUMNAR and inputs["text"].shape == (2,)
    signature, fmt, inputs = fill({"signature_name": "score", "instances": ["x", "y"]}, SCORE)
    assert (signature, fmt) == ("score", Format.ROW)
    assert inputs["text"] == Tensor("DT_STRING", (2,), [b"x", b"y"])


def test_row_format_batches_each_input_over_the_instances():
    instances = [{"text": [["a", "b"]]}, {"text": [["c", "d"]]}]
    _, fmt, inputs = fill({"instances": instances}, SCORE)
    assert fmt is Format.ROW
    assert inputs["text"] == Tensor("DT_STRING", (2, 1, 2), [b"a", b"b", b"c", b"d"])


def test_row_format_gives_scalar_inputs_a_batch_dimension():
    """Why `generate` needs the columnar form: in rows, its scalars become shape [1] (the
    graph then refuses them: tests/server/test_rest.py)."""
    row = {"prompt": "a", "max_new_tokens": 5, "temperature": 0.5, "stop_at_eos": True}
    _, _, inputs = fill({"instances": [row]})
    assert inputs["max_new_tokens"].shape == (1,) and inputs["prompt"].shape == (1,)


def test_b64_objects_are_bytes_and_text_after_the_document_is_ignored():
    _, _, inputs = fill(b'{"inputs": [{"b64": "/wA"}, "x"]} trailing words', SCORE)
    assert inputs["text"].values == [b"\xff\x00", b"x"]


# ---- what is refused, in TF Serving's words -------------------------------------------------

ROW = {"prompt": "a", "max_new_tokens": 5, "temperature": 0.5, "stop_at_eos": True}
BAD_IDS = [
    "missing input",
    "string for int32",
    "float for int32",
    "number for string",
    "plain inputs for several",
    "plain instances for several",
    "instance missing a key",
    "instance with an extra key",
    "instances of two sizes",
    "ragged list",
    "value at the wrong level",
    "bad base64",
    "b64 object with another key",
    "empty instances",
    "instances not a list",
    "both instances and inputs",
    "neither",
    "signature_name not a string",
    "not an object",
    "empty body",
    "blank body",
    "cut short",
    "missing comma in a list",
    "missing comma in an object",
    "not UTF-8",
    "lone surrogate",
]


@pytest.mark.parametrize(
    ("doc", "infos", "message"),
    [
        (
            {"inputs": {"prompt": ["a"], "temperature": 0.5, "stop_at_eos": True}},
            GENERATE,
            "Missing named input: max_new_tokens in 'inputs' object.",
        ),
        (
            {
                "inputs": {
                    "prompt": ["a"],
                    "max_new_tokens": "5",
                    "temperature": 0.5,
                    "stop_at_eos": True,
                }
            },
            GENERATE,
            'JSON Value: "5" Type: String is not of expected type: int32',
        ),
        (
            {
                "inputs": {
                    "prompt": ["a"],
                    "max_new_tokens": 5.0,
                    "temperature": 0.5,
                    "stop_at_eos": 1,
                }
            },
            GENERATE,
            "JSON Value: 5.0 Type: Number is not of expected type: int32",
        ),
        (
            {
                "inputs": {
                    "prompt": [7],
                    "max_new_tokens": 5,
                    "temperature": 0.5,
                    "stop_at_eos": True,
                }
            },
            GENERATE,
            "JSON Value: 7 Type: Number is not of expected type: string",
        ),
        (
            {"inputs": ["a"]},
            GENERATE,
            "inputs is a plain value/list, but expecting an object as multiple input tensors "
            "required as per tensorinfo_map",
        ),
        (
            {"instances": ["a"]},
            GENERATE,
            "instances is a plain list, but expecting list of objects as multiple input "
            "tensors required as per tensorinfo_map",
        ),
        (
            {"instances": [{k: v for k, v in ROW.items() if k != "temperature"}]},
            GENERATE,
            'Failed to process element: 0 of \'instances\' list. JSON object: {"prompt": "a", '
            '"max_new_tokens": 5, "stop_at_eos": true} keys must be equal to: '
            "max_new_tokens,prompt,stop_at_eos,temperature",
        ),
        (
            {"instances": [{**ROW, "seed": 1}]},
            GENERATE,
            "Failed to process element: 0 key: seed of 'instances' list. Error: "
            "INVALID_ARGUMENT: JSON object: does not have named input: seed",
        ),
        (
            {"instances": [["a", "b"], ["c"]]},
            SCORE,
            "Failed to process element: 1 of 'instances' list. Error: INVALID_ARGUMENT: "
            "Expecting tensor size: 2 but got: 1",
        ),
        (
            {"inputs": [["a", "b"], ["c"]]},
            SCORE,
            "Encountered list at unexpected size: 1 at level: 1 expected size: 2",
        ),
        (
            {"inputs": [["a"], "b"]},
            SCORE,
            'JSON Value: "b" found at incorrect level: 2 in the JSON DOM. Expected at level: 2',
        ),
        ({"inputs": [{"b64": "!!"}]}, SCORE, "Unable to base64 decode"),
        (
            {"inputs": [{"b64": "QQ==", "x": 1}]},
            SCORE,
            'JSON Value: {"b64": "QQ==", "x": 1} not formatted correctly for base64 data',
        ),
        (
            {"instances": []},
            SCORE,
            "JSON Value: {\"instances\": []} No values in 'instances' array",
        ),
        (
            {"instances": "a"},
            SCORE,
            'JSON Value: {"instances": "a"} Expecting \'instances\' to be an list/array',
        ),
        (
            {"instances": ["a"], "inputs": ["a"]},
            SCORE,
            'JSON Value: {"instances": ["a"], "inputs": ["a"]} Not formatted correctly expecting '
            "only one of 'inputs' or 'instances' keys to exist ",
        ),
        ({"signature_name": "score"}, SCORE, "Missing 'inputs' or 'instances' key"),
        (
            {"signature_name": 3, "inputs": ["a"]},
            SCORE,
            'JSON Value: {"signature_name": 3, "inputs": ["a"]} not formatted correctly. '
            "'signature_name' key must be a string value.",
        ),
        (["a"], SCORE, 'JSON Value: ["a"] Is not object'),
        (b"", SCORE, "JSON Parse error: The document is empty"),
        (b"  \n", SCORE, "JSON Parse error: The document is empty. at offset: 3"),
        (b'{"inputs": ', SCORE, "JSON Parse error: Invalid value. at offset: 11"),
        (
            b'{"inputs": ["a" "b"]}',
            SCORE,
            "JSON Parse error: Missing a comma or ']' after an array element. at offset: 16",
        ),
        (
            b'{"inputs": ["a"] "x": 1}',
            SCORE,
            "JSON Parse error: Missing a comma or '}' after an object member. at offset: 17",
        ),
        (
            b'{"inputs": ["\xff"]}',
            SCORE,
            "JSON Parse error: Invalid encoding in string. at offset: 13",
        ),
        (
            b'{"inputs": ["\\ud800"]}',
            SCORE,
            "JSON Parse error: The surrogate pair in string is invalid.",
        ),
    ],
    ids=BAD_IDS,
)
@pytest.mark.bad_input("a predict request TF Serving refuses (json_tensor.cc)")
def test_bad_requests_are_invalid_arguments_in_tf_servings_words(doc, infos, message):
    err = error_of(doc, infos)
    assert err.code is Code.INVALID_ARGUMENT and err.http_status == 400
    assert err.message == message


def test_a_signature_without_inputs_is_refused_by_name():
    err = error_of({"signature_name": "__saved_model_init_op", "inputs": []}, {})
    assert err.message == "Failed to get input map for signature: __saved_model_init_op"
    assert error_of({"inputs": []}, {}).message == "Failed to get input map for signature: DEFAULT"


def test_a_quoted_value_is_cut_to_256_bytes():
    err = error_of({"inputs": [["x" * 1000]]}, {"text": "DT_INT32"})
    assert err.message.startswith('JSON Value: "xxx') and len(err.message) < 256 + 60


# ---- the response -----------------------------------------------------------------------------

SCORES = {
    "nats": np.array([1.5, 2.25], np.float32),
    "tokens": np.array([3, 4], np.int32),
}


def test_columnar_response_is_an_object_of_outputs_and_one_output_comes_bare():
    assert json.loads(make_json(SCORES, Format.COLUMNAR)) == {
        "outputs": {"nats": [1.5, 2.25], "tokens": [3, 4]}
    }
    one = {"completion": np.array([b"hi"], object)}
    assert json.loads(make_json(one, Format.COLUMNAR)) == {"outputs": ["hi"]}


def test_row_response_is_a_list_of_rows_and_one_output_comes_bare():
    assert json.loads(make_json(SCORES, Format.ROW)) == {
        "predictions": [{"nats": 1.5, "tokens": 3}, {"nats": 2.25, "tokens": 4}]
    }
    one = {"completion": np.array([b"hi", b"yo"], object)}
    assert json.loads(make_json(one, Format.ROW)) == {"predictions": ["hi", "yo"]}


def test_row_response_needs_one_batch_size_and_a_batch_dimension():
    uneven = {"a": np.zeros(2, np.float32), "b": np.zeros(3, np.float32)}
    with pytest.raises(
        ServingError, match="Tensor name: b has inconsistent batch size: 3 expecting: 2"
    ):
        make_json(uneven, Format.ROW)
    with pytest.raises(ServingError, match="Tensor name: a has no shape information"):
        make_json({"a": np.float32(1.0)}, Format.ROW)
    assert json.loads(make_json({"a": np.float32(1.0)}, Format.COLUMNAR)) == {"outputs": 1.0}


def test_strings_named_bytes_are_base64_and_bad_utf8_is_replaced():
    outputs = {"image_bytes": np.array([b"\xff\x00"], object), "text": np.array([b"a\xff"], object)}
    doc = json.loads(make_json(outputs, Format.COLUMNAR))
    assert doc == {"outputs": {"image_bytes": [{"b64": "/wA="}], "text": ["a\ufffd"]}}


@pytest.mark.parametrize(
    ("value", "bits", "text"),
    [
        (0.2, 32, "0.2"),  # six digits read back as the float: not 0.200000003
        (1 / 3, 32, "0.333333343"),  # they do not: all nine
        (1 / 3, 64, "0.33333333333333331"),  # a double: seventeen
        (3.0, 32, "3.0"),  # a whole number gets ".0"
        (1e6, 32, "1e+06"),  # ... unless in exponent form
        (-0.0, 32, "-0.0"),
        (float("nan"), 32, "NaN"),
        (float("-inf"), 32, "-Infinity"),
    ],
)
def test_numbers_are_written_as_write_decimal_writes_them(value, bits, text):
    assert write_decimal(float(np.float32(value)) if bits == 32 else value, bits) == text


def test_every_float32_reads_back_exactly():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.standard_normal(500), rng.uniform(0, 1e9, 500)]).astype(np.float32)
    doc = json.loads(make_json({"x": values}, Format.COLUMNAR))
    assert np.array_equal(np.asarray(doc["outputs"], np.float32), values)
    assert math.isnan(
        json.loads(make_json({"x": np.array([np.nan], np.float32)}, Format.COLUMNAR))["outputs"][0]
    )
