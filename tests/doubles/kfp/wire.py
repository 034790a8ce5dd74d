"""KFP 2.5's v2beta1 REST API on the wire: models as grpc-gateway v1.16 marshals them, errors
in its shapes, and the list options (filter, sort_by, page_size) the double serves."""

from __future__ import annotations

import json
import types
from collections.abc import Iterable
from typing import Any

import kfp_server_api

_MODELS = kfp_server_api.ApiClient()  # the client's own (de)serializer of the models


def parse(body: bytes, model: str) -> Any:
    """A request body as a kfp_server_api model, the way the client reads an answer."""
    return _MODELS.deserialize(types.SimpleNamespace(data=body), model)


def dump(model: Any) -> Any:
    """A model as JSON values; None fields are left out, as grpc-gateway leaves out defaults."""
    return _MODELS.sanitize_for_serialization(model)


class ApiError(Exception):
    """An error answer: HTTP status, grpc code and message."""

    def __init__(self, status: int, code: int, message: str, upload: bool = False) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.upload = status, code, message, upload


def listed(items: Iterable[Any], query: dict[str, str]) -> list[Any]:
    """filter (filter.go: EQUALS on display_name), sort_by, page_size."""
    found = list(items)
    for predicate in json.loads(query.get("filter") or "{}").get("predicates", []):
        if predicate.get("operation") not in (1, "EQUALS") or predicate.get("key") not in (
            "display_name",
            "name",
        ):
            raise ApiError(400, 3, f"the double serves only EQUALS on display_name: {predicate}")
        value = predicate.get("stringValue", predicate.get("string_value"))
        found = [i for i in found if i.display_name == value]
    sort_by = query.get("sort_by", "")
    found.sort(key=lambda i: i.created_at, reverse=sort_by.endswith(" desc"))
    size = int(query.get("page_size") or 0)
    return found[:size] if size > 0 else found


def page(key: str, items: list[Any]) -> dict[str, Any]:
    # grpc-gateway leaves out an empty list and a zero total_size (EmitDefaults false).
    return {key: [dump(i) for i in items], "total_size": len(items)} if items else {}


def error_body(err: ApiError) -> dict[str, Any]:
    """An error in KFP's shapes: the upload handler's (pipeline_upload_server.go
    writeErrorToResponse: error_message, error_details) or grpc-gateway v1.16's
    (DefaultHTTPError: error, code, message, details)."""
    if err.upload:
        return {"error_message": err.message, "error_details": err.message}
    return {"error": err.message, "code": err.code, "message": err.message, "details": []}
