"""Calling a server's REST API from tests: one request on its own connection, and waiting for
a version to be served, by watching the status endpoint."""

from __future__ import annotations

import http.client
import json
import time
from typing import Any
from urllib.parse import urlsplit

DEADLINE_S = 120.0  # the longest a version may take to be served on a loaded machine
LOOK_EVERY_S = 0.05  # the pause between two looks at the status (not a wait for the event)


def call(url: str, method: str = "GET", body: Any = None) -> tuple[int, bytes]:
    """(HTTP status, body) of one request; `body` a JSON value, or bytes sent as they are."""
    parts = urlsplit(url)
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    connection = http.client.HTTPConnection(parts.netloc, timeout=300)
    try:
        connection.request(method, parts.path, body=data)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def call_json(url: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
    """(HTTP status, parsed JSON body)."""
    status, data = call(url, method, body)
    return status, json.loads(data)


def available(model_url: str) -> list[int]:
    """The versions the status endpoint says are AVAILABLE."""
    status, doc = call_json(model_url)
    assert status == 200, doc
    return [int(v["version"]) for v in doc["model_version_status"] if v["state"] == "AVAILABLE"]


def wait_until_served(model_url: str, version: int, deadline_s: float = DEADLINE_S) -> None:
    """Return once `version` alone is AVAILABLE; fail the test after `deadline_s`."""
    until = time.monotonic() + deadline_s
    while (found := available(model_url)) != [version]:
        assert time.monotonic() < until, f"version {version} not served in {deadline_s} s: {found}"
        time.sleep(LOOK_EVERY_S)
