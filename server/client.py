"""A client of TF Serving's REST API for one model: its signatures and predict.

It speaks the API as tensorflow_serving/g3doc/api_rest.md documents it, so the same client
works against `gptpipe serve` here and TF Serving on a cluster: the signatures come from the
metadata endpoint, a predict request is sent in the columnar form (`inputs`, which takes the
scalar inputs the generate signatures have), and the outputs come back as numpy arrays of the
dtypes the metadata gives, so a float32 output is the float32 the server computed (TF Serving
writes each float with the digits that read back as it). One `RestModel` keeps one HTTP/1.1
connection: use one per thread.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from contracts.errors import UserError

DEFAULT_NAME = "gpt"  # the model name when the URL has none (`gptpipe serve`'s default)
REQUEST_TIMEOUT_S = 600.0  # the longest a request may take: a long generate on a CPU
# http://HOST:PORT/v1/models/NAME[/versions/N], a trailing slash allowed
_MODEL_PATH = re.compile(r"/v1/models/([^/:]+)(?:/versions/(\d{1,18}))?/?")
# numpy's dtype for each DataType name a gptpipe signature has
_NUMPY = {
    "DT_FLOAT": np.float32,
    "DT_DOUBLE": np.float64,
    "DT_INT32": np.int32,
    "DT_INT64": np.int64,
    "DT_BOOL": np.bool_,
}


@dataclass(frozen=True)
class Endpoint:
    """Where a model is served: the server, the model's name and, if pinned, its version."""

    base: str  # scheme://host:port
    name: str
    version: int | None = None

    @property
    def model_url(self) -> str:
        """`BASE/v1/models/NAME[/versions/N]`: what predict and metadata are under."""
        pinned = f"/versions/{self.version}" if self.version is not None else ""
        return f"{self.base}/v1/models/{self.name}{pinned}"


def parse_endpoint(url: str, name: str | None = None, version: int | None = None) -> Endpoint:
    """The endpoint `url` names: `http://HOST:PORT` (the model `name`, else DEFAULT_NAME) or
    `http://HOST:PORT/v1/models/NAME[/versions/N]`; `version` pins one where the URL does not.
    A URL of another form, or one that disagrees with `name` or `version`, is a UserError."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UserError(
            f"--endpoint {url}: pass an http:// URL, such as http://127.0.0.1:8501 (where "
            "`gptpipe serve` listens) or http://HOST:8501/v1/models/gpt"
        )
    base = f"{parts.scheme}://{parts.netloc}"
    path = parts.path.rstrip("/")
    if not path:
        return Endpoint(base, name or DEFAULT_NAME, version)
    match = _MODEL_PATH.fullmatch(parts.path)
    if not match:
        raise UserError(
            f"--endpoint {url}: the path must be /v1/models/NAME or /v1/models/NAME/versions/N "
            "(TF Serving's REST paths), or nothing"
        )
    in_url = int(match.group(2)) if match.group(2) else None
    if name is not None and name != match.group(1):
        raise UserError(f"--name {name} and --endpoint {url} name different models: pass one")
    if version is not None and in_url is not None and version != in_url:
        raise UserError(f"--version {version} and --endpoint {url} differ: pass one")
    return Endpoint(base, match.group(1), in_url if in_url is not None else version)


@dataclass(frozen=True)
class SignatureInfo:
    """A signature's inputs and outputs: name -> DataType name ("DT_FLOAT", ...)."""

    inputs: dict[str, str]
    outputs: dict[str, str]


class RestModel:
    """One model behind a REST endpoint (TF Serving's API)."""

    def __init__(
        self, endpoint: Endpoint, timeout_s: float = REQUEST_TIMEOUT_S, pin: bool = False
    ) -> None:
        """With `pin`, predict goes to the version whose metadata was read (`signatures`),
        never to one loaded later: requests that must be one model's (the chunks of one
        score) are, or fail with TF Serving's 404 once that version is unloaded."""
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.pin = pin
        self._connection: http.client.HTTPConnection | None = None
        self._signatures: dict[str, SignatureInfo] | None = None
        self._served: Endpoint | None = None  # the version the metadata came from

    @property
    def model_url(self) -> str:
        """Where predict goes: the endpoint's model, or with `pin` the version it served."""
        return (self._served if self.pin and self._served else self.endpoint).model_url

    def signatures(self) -> dict[str, SignatureInfo]:
        """The served version's signatures, from its metadata (read once)."""
        if self._signatures is None:
            doc = self._request("GET", f"{self.endpoint.model_url}/metadata")
            version = int(doc["model_spec"]["version"])
            self._served = Endpoint(self.endpoint.base, self.endpoint.name, version)
            defs = doc["metadata"]["signature_def"]["signature_def"]
            self._signatures = {
                name: SignatureInfo(_dtypes(sig.get("inputs", {})), _dtypes(sig.get("outputs", {})))
                for name, sig in defs.items()
            }
        return self._signatures

    def predict(self, signature: str, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Run `signature` on `inputs` (JSON values: lists, numbers, strings); its outputs by
        name, each a numpy array of its dtype (strings as an object array of str)."""
        info = self.signatures().get(signature)
        if info is None:
            raise UserError(
                f"{self.model_url} has no {signature} signature; it has "
                f"{', '.join(sorted(self.signatures()))}"
            )
        body = {"signature_name": signature, "inputs": dict(inputs)}
        outputs = self._request("POST", f"{self.model_url}:predict", body)["outputs"]
        if len(info.outputs) == 1:  # one output comes bare (MakeColumnarFormatJsonFromTensors)
            outputs = {next(iter(info.outputs)): outputs}
        return {name: _array(outputs[name], info.outputs.get(name, "")) for name in outputs}

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _request(self, method: str, url: str, doc: Any = None) -> Any:
        """Send one request; its JSON answer. An HTTP error is a UserError naming the URL and
        the server's `error`; so is a server that cannot be reached."""
        body = None if doc is None else json.dumps(doc, allow_nan=True).encode("utf-8")
        try:
            status, data = self._send(method, url, body)
        except (OSError, http.client.HTTPException) as err:
            reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
            raise UserError(
                f"cannot reach {self.endpoint.base} ({reason}): is `gptpipe serve` (or TF "
                "Serving) listening there?"
            ) from None
        # A server may write bytes that are not UTF-8 in a string (TF Serving does): U+FFFD.
        text = data.decode("utf-8", errors="replace")
        try:
            answer = json.loads(text)
        except json.JSONDecodeError:
            answer = None
        if status != 200:
            error = answer.get("error") if isinstance(answer, dict) else None
            said = error if error is not None else (text.strip().splitlines() or [""])[0][:200]
            raise UserError(f"{url} answered HTTP {status}: {said}")
        if not isinstance(answer, dict):
            raise UserError(f"{url} answered with something that is not a JSON object")
        return answer

    def _send(self, method: str, url: str, body: bytes | None) -> tuple[int, bytes]:
        """One round trip on the kept connection; a connection the server closed while idle
        is opened again once."""
        path = urlsplit(url).path
        headers = {"Content-Type": "application/json"} if body is not None else {}
        for attempt in range(2):
            reused = self._connection is not None
            connection = self._connection or self._connect()
            try:
                connection.request(method, path, body=body, headers=headers)
                response = connection.getresponse()
                data = response.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.close()
                if reused and attempt == 0:
                    continue
                raise
            except (OSError, http.client.HTTPException):
                self.close()
                raise
            if response.will_close:
                self.close()
            return response.status, data
        raise AssertionError("unreachable")

    def _connect(self) -> http.client.HTTPConnection:
        parts = urlsplit(self.endpoint.base)
        kind = (
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        )
        connection = kind(parts.netloc, timeout=self.timeout_s)
        connection.connect()
        # http.client sends a request's headers and body apart: no Nagle wait between them
        # (the server's delayed ACK would add up to 40 ms to every request).
        connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._connection = connection
        return connection


def _dtypes(tensors: Mapping[str, Any]) -> dict[str, str]:
    return {name: str(info.get("dtype", "")) for name, info in tensors.items()}


def _array(value: Any, dtype: str) -> Any:
    """An output's JSON value as a numpy array of its dtype."""
    if dtype in _NUMPY:
        return np.asarray(value, dtype=_NUMPY[dtype])
    return np.asarray(_strings(value), dtype=object)


def _strings(value: Any) -> Any:
    """Nested lists of JSON strings as they are; `{"b64": ...}` values as their bytes."""
    if isinstance(value, list):
        return [_strings(v) for v in value]
    if isinstance(value, dict) and "b64" in value:
        return base64.b64decode(value["b64"])
    return value
