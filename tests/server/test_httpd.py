"""The HTTP server under the REST API (server/httpd.py), over a stand-in API that echoes what
it was given: body limits, chunked and gzip bodies, keep-alive, and errors as one-line JSON.
No model, no TensorFlow."""

import gzip
import http.client
import json
import logging
import socket
import threading

import pytest

from server.httpd import RestServer
from server.rest import Reply

LIMIT = 4096


def echo(method: str, path: str, body: bytes, origin: str) -> Reply:
    if path == "/boom":
        raise RuntimeError("a bug\nover two lines")
    doc = {"method": method, "path": path, "body": body.decode("latin-1")}
    return Reply(200, json.dumps(doc).encode())


@pytest.fixture
def server():
    srv = RestServer(("127.0.0.1", 0), echo, LIMIT)
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def connect(server) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)


def request(server, method, path, body=None, headers=None):
    """(status, parsed JSON body, the response's headers) on a fresh connection."""
    connection = connect(server)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, json.loads(response.read()), response.headers
    finally:
        connection.close()


def raw(server, data: bytes) -> bytes:
    """Send `data` as it is; everything the server answers until it closes."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)  # all sent: the server's drain of a refused body ends
        chunks = []
        while piece := sock.recv(65536):
            chunks.append(piece)
    return b"".join(chunks)


def one_line_error(payload: bytes) -> str:
    text = payload.decode()
    assert "\n" not in text.strip(), text
    return json.loads(text)["error"]


def test_a_body_is_read_whole_and_a_connection_is_kept_for_the_next_request(server):
    connection = connect(server)
    try:
        for body in (b'{"a": 1}', b"x" * LIMIT):
            connection.request("POST", "/v1/models/gpt:predict?q=1", body=body)
            response = connection.getresponse()
            doc = json.loads(response.read())
            assert response.status == 200 and response.headers["Content-Type"] == "application/json"
            assert doc == {
                "method": "POST",
                "path": "/v1/models/gpt:predict",
                "body": body.decode(),
            }
    finally:
        connection.close()


@pytest.mark.bad_input("a request body over --max-body-bytes")
def test_a_body_over_the_limit_is_refused_before_it_is_read_and_the_server_goes_on(server):
    head = f"POST /v1/models/gpt:predict HTTP/1.1\r\nHost: x\r\nContent-Length: {LIMIT + 1}\r\n\r\n"
    answer = raw(server, head.encode() + b"x" * (LIMIT + 1))
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 400 Bad Request"
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert b"Connection: close" in headers
    assert one_line_error(body).startswith(f"the request body is {LIMIT + 1} bytes, over this")
    assert request(server, "GET", "/v1/models/gpt")[0] == 200


@pytest.mark.bad_input("Expect: 100-continue for a body over the limit")
def test_a_client_that_asks_first_is_told_no_before_it_sends(server):
    head = (
        f"POST /v1/models/gpt:predict HTTP/1.1\r\nHost: x\r\nContent-Length: {10 * LIMIT}\r\n"
        "Expect: 100-continue\r\n\r\n"
    )
    answer = raw(server, head.encode())  # no body follows: the server must not wait for one
    assert answer.startswith(b"HTTP/1.1 400 ") and b"100 Continue" not in answer
    assert "over this server's limit" in one_line_error(answer.partition(b"\r\n\r\n")[2])


def test_chunked_bodies_are_joined_and_refused_past_the_limit(server):
    chunked = b"3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\n\r\n"
    head = (
        b"POST /v1/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    answer = raw(server, head + chunked)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["body"] == "abcde"
    big = f"{LIMIT:x}\r\n".encode() + b"x" * LIMIT + b"\r\n1\r\nx\r\n0\r\n\r\n"
    answer = raw(server, head + big)
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert "at least 4097 bytes" in one_line_error(answer.partition(b"\r\n\r\n")[2])
    # A negative size would lower the running total and read to the stream's end.
    for size in (b"-1", b"+10", b"1_0"):
        answer = raw(server, head + size + b"\r\nabc\r\n0\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400 "), size
        assert "is not a hexadecimal number" in one_line_error(answer.partition(b"\r\n\r\n")[2])


def test_gzip_bodies_are_inflated_within_the_limit(server):
    headers = {"Content-Encoding": "gzip"}
    status, doc, _ = request(server, "POST", "/v1/x", gzip.compress(b"hello"), headers)
    assert status == 200 and doc["body"] == "hello"
    status, doc, _ = request(server, "POST", "/v1/x", gzip.compress(b"x" * (LIMIT + 1)), headers)
    assert status == 400 and "over this server's limit" in doc["error"]
    status, doc, _ = request(server, "POST", "/v1/x", b"not gzip", headers)
    assert status == 200 and doc["body"] == ""  # as TF Serving: a body that does not inflate


def test_an_internal_error_is_a_one_line_500_and_its_traceback_only_in_the_log(server, caplog):
    with caplog.at_level(logging.ERROR, logger="server.httpd"):
        connection = connect(server)
        try:
            connection.request("GET", "/boom")
            response = connection.getresponse()
            error = one_line_error(response.read())
        finally:
            connection.close()
    assert response.status == 500
    assert error == "Internal error (RuntimeError); the server's log has the details"
    assert "a bug" not in error
    assert any("a bug" in (r.exc_text or "") for r in caplog.records)
    assert request(server, "GET", "/v1/models/gpt")[0] == 200


@pytest.mark.bad_input("a malformed HTTP request line")
def test_http_level_errors_are_json_too(server):
    answer = raw(server, b"NOT A REQUEST\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert one_line_error(answer.partition(b"\r\n\r\n")[2])
    status, doc, _ = request(server, "POST", "/v1/x", b"{}", {"Content-Length": "x1"})
    assert status == 400 and "Content-Length" in doc["error"]
