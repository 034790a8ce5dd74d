"""The REST client's endpoint URLs (server/client.py); it talks to a server in
tests/pipelines/cli/test_serve.py."""

import socket

import pytest

from contracts.errors import UserError
from server.client import Endpoint, RestModel, parse_endpoint


@pytest.mark.parametrize(
    ("url", "name", "version", "endpoint"),
    [
        ("http://h:8501", None, None, Endpoint("http://h:8501", "gpt")),
        ("http://h:8501/", "lm", 3, Endpoint("http://h:8501", "lm", 3)),
        ("http://h:8501/v1/models/lm", None, None, Endpoint("http://h:8501", "lm")),
        ("http://h:8501/v1/models/lm/versions/2/", None, None, Endpoint("http://h:8501", "lm", 2)),
        ("http://h:8501/v1/models/lm", "lm", 4, Endpoint("http://h:8501", "lm", 4)),
    ],
)
def test_endpoint_forms(url, name, version, endpoint):
    assert parse_endpoint(url, name, version) == endpoint


def test_the_model_url_is_tf_servings():
    assert Endpoint("http://h:1", "gpt").model_url == "http://h:1/v1/models/gpt"
    assert Endpoint("http://h:1", "gpt", 2).model_url == "http://h:1/v1/models/gpt/versions/2"


@pytest.mark.parametrize(
    ("url", "name", "version", "says"),
    [
        ("h:8501", None, None, "pass an http:// URL"),
        ("ftp://h/v1/models/gpt", None, None, "pass an http:// URL"),
        ("http://h:8501/models/gpt", None, None, "the path must be /v1/models/NAME"),
        ("http://h:8501/v1/models/gpt:predict", None, None, "the path must be"),
        ("http://h:8501/v1/models/gpt", "other", None, "name different models"),
        ("http://h:8501/v1/models/gpt/versions/2", None, 3, "differ: pass one"),
    ],
    ids=["no scheme", "ftp", "not /v1/models", "a method", "two names", "two versions"],
)
@pytest.mark.bad_input("an --endpoint URL of another form")
def test_other_urls_are_user_errors(url, name, version, says):
    with pytest.raises(UserError, match=says):
        parse_endpoint(url, name, version)


@pytest.mark.bad_input("an --endpoint nothing listens on")
def test_a_server_that_is_not_there_is_a_user_error_naming_it():
    with socket.socket() as held:  # bound, never listening: connecting to it is refused
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        client = RestModel(Endpoint(f"http://127.0.0.1:{port}", "gpt"), timeout_s=30)
        with pytest.raises(UserError, match=rf"cannot reach http://127.0.0.1:{port} \("):
            client.signatures()
