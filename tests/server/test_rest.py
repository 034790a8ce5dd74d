"""gptpipe serve's REST API over the session's tiny model: every path, both request forms and
their responses, and each bad request answered with TF Serving's status and a one-line JSON
error while the server goes on serving (server/rest.py over json_tensor.py and guards.py)."""

import base64
import json

import pytest

from server.servable import Servable
from tests.server.conftest import CAP, MAX_BODY
from tests.server.rest_calls import call, call_json

pytestmark = pytest.mark.slow

GENERATE = {"prompt": ["ROMEO:"], "max_new_tokens": 4, "temperature": 0.8, "stop_at_eos": False}
TEXTS = ["ROMEO:\nBut soft, what light through yonder window breaks?\n", "ALL:\nSpeak, speak.\n"]
SCORE_OUTPUTS = {"chars", "nats", "nats_per_char", "nats_per_token", "tokens"}


def base(served) -> str:
    return served.url.removesuffix("/v1/models/gpt")


def still_serving(served) -> None:
    status, doc = call_json(
        f"{served.url}:predict", "POST", {"signature_name": "score", "inputs": TEXTS}
    )
    assert status == 200 and set(doc["outputs"]) == SCORE_OUTPUTS


# ---- status and metadata --------------------------------------------------------------------


def test_status_lists_the_served_version_as_tf_serving_prints_it(served):
    expected = {
        "model_version_status": [
            {
                "version": "1",
                "state": "AVAILABLE",
                "status": {"error_code": "OK", "error_message": ""},
            }
        ]
    }
    assert call_json(served.url) == (200, expected)
    assert call_json(f"{served.url}/versions/1") == (200, expected)


def test_metadata_is_the_savedmodels_signature_defs(served):
    for path in ("/metadata", "/versions/1/metadata"):
        status, doc = call_json(served.url + path)
        assert status == 200
        assert doc["model_spec"] == {"name": "gpt", "signature_name": "", "version": "1"}
        defs = doc["metadata"]["signature_def"]["signature_def"]
        assert set(defs) == {
            "__saved_model_init_op",
            "serving_default",
            "generate",
            "generate_seeded",
            "score",
        }
        inputs = defs["generate_seeded"]["inputs"]
        dtypes = {name: info["dtype"] for name, info in inputs.items()}
        assert dtypes == {
            "prompt": "DT_STRING",
            "max_new_tokens": "DT_INT32",
            "temperature": "DT_FLOAT",
            "seed": "DT_INT64",
            "stop_at_eos": "DT_BOOL",
        }
        assert inputs["prompt"]["tensor_shape"] == {
            "dim": [{"size": "-1", "name": ""}],
            "unknown_rank": False,
        }
        assert defs["score"]["method_name"] == "tensorflow/serving/predict"
        assert set(defs["score"]["outputs"]) == SCORE_OUTPUTS


# ---- predict --------------------------------------------------------------------------------


def test_score_in_columnar_and_row_form_gives_one_answer_in_two_shapes(served):
    status, columnar = call_json(
        f"{served.url}:predict", "POST", {"signature_name": "score", "inputs": {"text": TEXTS}}
    )
    assert status == 200 and set(columnar["outputs"]) == SCORE_OUTPUTS
    status, rows = call_json(
        f"{served.url}:predict", "POST", {"signature_name": "score", "instances": TEXTS}
    )
    assert status == 200 and len(rows["predictions"]) == 2
    for i, row in enumerate(rows["predictions"]):
        assert row == {name: values[i] for name, values in columnar["outputs"].items()}
    assert columnar["outputs"]["chars"] == [len(t) for t in TEXTS]
    assert all(n > 0 for n in columnar["outputs"]["nats"])


def test_generate_is_the_default_signature_and_one_output_comes_bare(served):
    status, doc = call_json(f"{served.url}:predict", "POST", {"inputs": GENERATE})
    assert status == 200 and list(doc) == ["outputs"]
    (completion,) = doc["outputs"]
    assert isinstance(completion, str)


def test_seeded_generate_repeats_itself_and_any_case_of_the_path_works(served):
    body = {"signature_name": "generate_seeded", "inputs": {**GENERATE, "seed": 7}}
    first = call_json(f"{served.url}:predict", "POST", body)
    again = call_json(f"{base(served)}/V1/Models/gpt/VERSIONS/1:Predict", "POST", body)
    assert first[0] == 200 and first == again


def test_b64_text_is_text(served):
    encoded = base64.b64encode(TEXTS[0].encode()).decode()
    plain = call_json(
        f"{served.url}:predict", "POST", {"signature_name": "score", "inputs": [TEXTS[0]]}
    )
    b64 = call_json(
        f"{served.url}:predict", "POST", {"signature_name": "score", "inputs": [{"b64": encoded}]}
    )
    assert plain[0] == 200 and plain == b64


def test_generate_in_row_form_gets_the_graphs_own_error(served):
    """Row form batches every input, the scalars too, and TF Serving checks no shapes: the
    graph refuses a [1] where it takes a scalar, naming the input, as under TF Serving."""
    row = {k: v[0] if k == "prompt" else v for k, v in GENERATE.items()}
    status, data = call(f"{served.url}:predict", "POST", {"instances": [row]})
    error = json.loads(data)["error"]
    assert status == 400 and "[1] is not compatible with expected shape []" in error
    assert "_must_be_a_scalar/EnsureShape" in error
    assert b"\n" not in data.strip()
    still_serving(served)


# ---- what is refused --------------------------------------------------------------------------

BAD = [
    (
        "missing input",
        {"inputs": {k: v for k, v in GENERATE.items() if k != "temperature"}},
        "Missing named input: temperature in 'inputs' object.",
    ),
    (
        "wrong type",
        {"inputs": {**GENERATE, "max_new_tokens": "4"}},
        'JSON Value: "4" Type: String is not of expected type: int32',
    ),
    (
        "negative max_new_tokens",
        {"inputs": {**GENERATE, "max_new_tokens": -1}},
        f"max_new_tokens is -1: this server generates 0 to {CAP} tokens",
    ),
    (
        "max_new_tokens over the cap",
        {"inputs": {**GENERATE, "max_new_tokens": CAP + 1}},
        f"max_new_tokens is {CAP + 1}: this server generates 0 to {CAP}",
    ),
    (
        "b64 prompt that is not UTF-8",
        {"inputs": {**GENERATE, "prompt": [{"b64": "/w=="}]}},
        "input prompt: element 0 is not UTF-8 text",
    ),
    (
        "body that is not UTF-8",
        b'{"signature_name": "score", "inputs": ["\xff"]}',
        "JSON Parse error: Invalid encoding in string.",
    ),
    ("malformed JSON", b'{"inputs": [', "JSON Parse error: Invalid value. at offset: 12"),
    ("empty body", b"", "JSON Parse error: The document is empty"),
    (
        "unknown signature",
        {"signature_name": "nope", "inputs": ["x"]},
        'Serving signature name: "nope" not found in signature def',
    ),
    (
        "both forms",
        {"inputs": ["x"], "instances": ["x"]},
        "Not formatted correctly expecting only one of",
    ),
    (
        "body over the limit",
        {"signature_name": "score", "inputs": ["x" * MAX_BODY]},
        f"over this server's limit of {MAX_BODY}",
    ),
    ("version label", None, "Unrecognized servable version label: stable"),
]


@pytest.mark.parametrize(("what", "body", "says"), BAD, ids=[b[0] for b in BAD])
@pytest.mark.bad_input("a bad predict request to gptpipe serve")
def test_a_bad_request_is_a_400_with_a_one_line_json_error_and_serving_goes_on(
    served, what, body, says
):
    url = f"{served.url}:predict"
    if what == "version label":
        url, body = f"{served.url}/labels/stable:predict", {"inputs": GENERATE}
    status, data = call(url, "POST", body)
    assert status == 400, data
    assert b"\n" not in data.strip()
    assert says in json.loads(data)["error"]
    still_serving(served)


NOT_FOUND = [
    ("GET", "/v1/models/gpt/versions/2", "Could not find version 2 of model gpt"),
    ("GET", "/v1/models/other", "Could not find any versions of model other"),
    (
        "GET",
        "/v1/models/gpt/versions/2/metadata",
        "Servable not found for request: Specific(gpt, 2)",
    ),
    ("GET", "/v1/models/other/metadata", "Servable not found for request: Latest(other)"),
    (
        "POST",
        "/v1/models/gpt/versions/2:predict",
        "Servable not found for request: Specific(gpt, 2)",
    ),
    ("POST", "/v1/models/other:predict", "Servable not found for request: Latest(other)"),
    ("GET", "/v2/models/gpt", "Not Found: /v2/models/gpt (the REST API is under /v1/)"),
]


@pytest.mark.parametrize(("method", "path", "says"), NOT_FOUND, ids=[p for _, p, _ in NOT_FOUND])
@pytest.mark.bad_input("an unknown model, version or path")
def test_what_is_not_served_is_a_404(served, method, path, says):
    body = {"inputs": GENERATE} if method == "POST" else None
    status, doc = call_json(base(served) + path, method, body)
    assert status == 404 and doc == {"error": says}


@pytest.mark.parametrize(
    ("method", "path", "status", "says"),
    [
        ("POST", "/v1/models/gpt", 400, "Malformed request: POST /v1/models/gpt"),
        ("GET", "/v1/models/gpt:predict", 400, "Malformed request: GET /v1/models/gpt:predict"),
        ("GET", "/v1/models", 400, "Missing model name in request."),
        ("DELETE", "/v1/models/gpt", 400, "Malformed request: DELETE /v1/models/gpt"),
        ("POST", "/v1/models/gpt:classify", 501, "classify needs a tf.Example signature"),
    ],
    ids=["POST status", "GET predict", "no model name", "DELETE", "classify"],
)
@pytest.mark.bad_input("a method or path the API does not have")
def test_other_methods_and_paths_get_tf_servings_answer(served, method, path, status, says):
    got, doc = call_json(base(served) + path, method, {} if method == "POST" else None)
    assert got == status and doc["error"].startswith(says)


@pytest.mark.fault("an unexpected exception while answering a predict request")
def test_an_internal_error_is_a_one_line_500_and_serving_goes_on(served, monkeypatch):
    def broken(self, signature, inputs):
        raise KeyError("a bug")

    monkeypatch.setattr(Servable, "predict", broken)
    status, data = call(f"{served.url}:predict", "POST", {"inputs": GENERATE})
    assert status == 500 and b"\n" not in data.strip()
    assert json.loads(data) == {
        "error": "Internal error (KeyError); the server's log has the details"
    }
    monkeypatch.undo()
    still_serving(served)
