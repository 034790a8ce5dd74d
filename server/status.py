"""TensorFlow's error codes, the HTTP status TF Serving answers each with, and the error type
that carries one through the server.

TF Serving answers every failed request with the HTTP status its `ToHTTPStatusCode` maps the
request's `absl::Status` code to (tensorflow_serving/model_servers/http_server.cc) and the body
`{"error": <message>}` (`MakeJsonFromStatus`, tensorflow_serving/util/json_tensor.cc). The
codes are tensorflow/core/protobuf/error_codes.proto's, whose names the status endpoint prints.
"""

from __future__ import annotations

import enum
import json


class Code(enum.IntEnum):
    """tensorflow.error.Code (= absl::StatusCode)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


# http_server.cc, ToHTTPStatusCode; any other code is 500 there too.
HTTP_STATUS = {
    Code.OK: 200,
    Code.CANCELLED: 499,  # CLIENT_CLOSED_REQUEST
    Code.UNKNOWN: 500,
    Code.INVALID_ARGUMENT: 400,
    Code.DEADLINE_EXCEEDED: 504,
    Code.NOT_FOUND: 404,
    Code.ALREADY_EXISTS: 409,
    Code.PERMISSION_DENIED: 403,
    Code.RESOURCE_EXHAUSTED: 429,
    Code.FAILED_PRECONDITION: 400,
    Code.ABORTED: 409,
    Code.OUT_OF_RANGE: 400,
    Code.UNIMPLEMENTED: 501,
    Code.INTERNAL: 500,
    Code.UNAVAILABLE: 503,
    Code.DATA_LOSS: 500,
    Code.UNAUTHENTICATED: 401,
}


class ServingError(Exception):
    """A request that failed with a TensorFlow status: its code and message."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)

    def __str__(self) -> str:
        """As absl::Status::ToString prints it (`INVALID_ARGUMENT: message`), which TF Serving
        nests inside some messages."""
        return f"{self.code.name}: {self.message}"


def invalid_argument(*parts: object) -> ServingError:
    """errors::InvalidArgument(parts...): the parts concatenated, as absl::StrCat does."""
    return ServingError(Code.INVALID_ARGUMENT, "".join(str(p) for p in parts))


def not_found(*parts: object) -> ServingError:
    return ServingError(Code.NOT_FOUND, "".join(str(p) for p in parts))


def error_body(message: str) -> bytes:
    """`{"error": message}` on one line (MakeJsonFromStatus)."""
    return json.dumps({"error": message}, ensure_ascii=False).encode("utf-8")
