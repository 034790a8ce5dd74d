"""TF Serving's REST API: its paths, and the status, metadata and predict handlers.

A port of tensorflow_serving/model_servers/http_rest_api_handler.cc (ProcessRequest and the
handlers) and http_rest_api_util.cc (the path patterns, ParseModelInfo, the JSON printing of
the status and metadata responses), TF Serving 2.19; the API is documented in
tensorflow_serving/g3doc/api_rest.md:

    GET  /v1/models/NAME[/versions/N]            the versions and their states
    GET  /v1/models/NAME[/versions/N]/metadata   the signature defs of the version
    POST /v1/models/NAME[/versions/N]:predict    run a signature (json_tensor.py)

Every error is `{"error": message}` with the HTTP status of its TensorFlow code (status.py).
Where TF Serving's predict resolves the version twice (GetInfoMap, then Predict), a request
here takes it once, so a version switch never splits one request between two versions.
Version labels are not configured, as on a TF Serving without a model config file; classify
and regress need tf.Example signatures, which gptpipe's models do not have.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote

from server import guards, json_tensor
from server.servable import Servable
from server.status import Code, ServingError, error_body, invalid_argument, not_found
from server.versions import Versions

# http_rest_api_util.cc: kPredictionApiGegex [sic], kModelStatusApiRegex; and the dispatcher's
# kHTTPRestApiHandlerPathRegex (http_rest_api_util.h): what is not under /v1/ is not the API's.
PREDICTION_PATH = re.compile(
    r"/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:(classify|regress|predict)",
    re.IGNORECASE,
)
STATUS_PATH = re.compile(
    r"/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?",
    re.IGNORECASE,
)
API_PATH = re.compile(r"/v1/.*", re.IGNORECASE)
ORIGIN = re.compile(r"https?://")  # a CORS preflight's Origin (http_server.cc)
INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Reply:
    """An HTTP answer: its status and JSON body."""

    status: int
    body: bytes


@dataclass(frozen=True)
class ModelSpec:
    """What a path names (tensorflow.serving.ModelSpec without the signature)."""

    name: str
    version: int | None = None
    label: str | None = None


class RestApi:
    """The REST API over one model's versions."""

    def __init__(self, versions: Versions, limits: guards.Limits) -> None:
        self.versions = versions
        self.limits = limits

    def handle(self, method: str, path: str, body: bytes, origin: str = "") -> Reply:
        """Answer one request (RestApiRequestDispatcher::ProcessRequest, http_server.cc)."""
        if not API_PATH.fullmatch(path):
            return Reply(404, error_body(f"Not Found: {path} (the REST API is under /v1/)"))
        try:
            if method == "OPTIONS":  # a CORS preflight
                if not ORIGIN.search(origin):
                    raise ServingError(
                        Code.FAILED_PRECONDITION, "Origin header is missing in CORS preflight"
                    )
                return Reply(200, b"")
            return Reply(200, self._process(method, path, body))
        except ServingError as err:
            return Reply(err.http_status, error_body(err.message))

    def _process(self, method: str, path: str, body: bytes) -> bytes:
        """HttpRestApiHandler::ProcessRequest."""
        if method == "POST" and (match := PREDICTION_PATH.fullmatch(path)):
            spec = _model_spec(match.group(1), match.group(2), match.group(3))
            if match.group(4).lower() == "predict":
                return self.predict(spec, body)
            raise ServingError(
                Code.UNIMPLEMENTED,
                f"{match.group(4)} needs a tf.Example signature; this server serves predict",
            )
        if method == "GET" and (match := STATUS_PATH.fullmatch(path)):
            spec = _model_spec(match.group(1), match.group(2), match.group(3))
            if match.group(4):
                return self.metadata(spec)
            return self.status(spec)
        raise invalid_argument(f"Malformed request: {method} {path}")

    def status(self, spec: ModelSpec) -> bytes:
        """ProcessModelStatusRequest over GetModelStatusImpl (get_model_status_impl.cc)."""
        if not spec.name:
            raise invalid_argument("Missing model name in request.")
        states = self.versions.states() if spec.name == self.versions.name else {}
        if spec.version is not None:
            if spec.version not in states:
                raise not_found(f"Could not find version {spec.version} of model {spec.name}")
            states = {spec.version: states[spec.version]}
        elif not states:
            raise not_found(f"Could not find any versions of model {spec.name}")
        doc = {
            "model_version_status": [
                {
                    "version": str(version),  # an int64: a string in proto3's JSON
                    "state": state.state,
                    "status": {
                        "error_code": state.error_code.name,
                        "error_message": state.error_message,
                    },
                }
                for version, state in states.items()
            ]
        }
        return _proto_json(doc)

    def metadata(self, spec: ModelSpec) -> bytes:
        """ProcessModelMetadataRequest over GetModelMetadataImpl (get_model_metadata_impl.cc)."""
        if not spec.name:
            raise invalid_argument("Missing model name in request.")
        servable = self._servable(spec)
        model_spec = {"name": servable.name, "signature_name": "", "version": str(servable.version)}
        doc = {
            "model_spec": model_spec,
            "metadata": {"signature_def": servable.signature_def_map()},
        }
        return _proto_json(doc)

    def predict(self, spec: ModelSpec, body: bytes) -> bytes:
        """ProcessPredictRequest: the request's tensors (json_tensor.py), this server's own
        checks (guards.py), the signature run on the one version the request took."""
        taken: list[Servable] = []

        def inputs_of(signature: str) -> Mapping[str, str]:
            taken.append(self._servable(spec))
            return taken[0].inputs_of(signature)

        signature, fmt, inputs = json_tensor.fill_predict_request(body, inputs_of)
        guards.check(inputs, self.limits)
        outputs = taken[0].predict(signature, inputs)
        return json_tensor.make_json(outputs, fmt)

    def _servable(self, spec: ModelSpec) -> Servable:
        """ServerCore::GetServableHandle: no labels are configured here (server_core.cc)."""
        if spec.label is not None:
            raise invalid_argument(f"Unrecognized servable version label: {spec.label}")
        return self.versions.get(spec.name, spec.version)


def _model_spec(name: str | None, version: str | None, label: str | None) -> ModelSpec:
    """ParseModelInfo: the name and label percent-decoded, the version an int64."""
    number = None
    if version:
        # More digits than an int64 has can only overflow (and past 4300, int() refuses them).
        if len(version.lstrip("0")) > len(str(INT64_MAX)) or int(version) > INT64_MAX:
            raise invalid_argument(f"Failed to convert version: {version} to numeric.")
        number = int(version)
    return ModelSpec(unquote(name or ""), number, unquote(label) if label else None)


def _proto_json(doc: dict) -> bytes:
    """As protobuf's JSON printer with add_whitespace writes a response (one-space indent)."""
    return json.dumps(doc, indent=1, ensure_ascii=False).encode("utf-8") + b"\n"
