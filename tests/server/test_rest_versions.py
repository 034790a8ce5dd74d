"""gptpipe serve follows its serving folder over HTTP as TF Serving does: a push is served
once loaded, a rollback (`components.serving.rollback`) too, deleting the newest version falls
back to the one before, and a version that fails to load leaves the old one served. Each
change is waited for by watching the status endpoint, with a generous deadline."""

import shutil
import time

import pytest

from components import serving
from contracts.artifacts import SERVING_DIR
from tests.server.conftest import publish
from tests.server.rest_calls import (
    DEADLINE_S,
    LOOK_EVERY_S,
    available,
    call_json,
    wait_until_served,
)

pytestmark = pytest.mark.slow

TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\n"


def nats(running) -> float:
    status, doc = call_json(
        f"{running.url}:predict", "POST", {"signature_name": "score", "inputs": [TEXT]}
    )
    assert status == 200, doc
    return doc["outputs"]["nats"][0]


def states(running) -> dict[int, str]:
    status, doc = call_json(running.url)
    assert status == 200
    return {int(v["version"]): v["state"] for v in doc["model_version_status"]}


def test_a_push_a_rollback_and_its_undoing_are_each_served(
    serving_folder, serve_folder, other_model, tiny_model
):
    with serve_folder(serving_folder) as running:
        first = nats(running)
        assert available(running.url) == [1]
        assert publish(other_model, serving_folder) == 2  # a push of another model
        wait_until_served(running.url, 2)
        assert states(running) == {2: "AVAILABLE", 1: "END"}
        second = nats(running)
        assert second != first
        assert serving.rollback(str(serving_folder), 1) == 3  # version 1's model, as version 3
        wait_until_served(running.url, 3)
        assert nats(running) == first
        shutil.rmtree(serving_folder / "3")  # the newest gone: back to 2
        wait_until_served(running.url, 2)
        assert nats(running) == second
        assert states(running) == {3: "END", 2: "AVAILABLE", 1: "END"}
        status, doc = call_json(f"{running.url}/versions/1:predict", "POST", {"inputs": ["x"]})
        assert status == 404 and doc == {
            "error": "Servable not found for request: Specific(gpt, 1)"
        }
    assert (tiny_model / SERVING_DIR).is_dir()  # the session's model untouched


@pytest.mark.fault("a pushed version whose SavedModel does not load")
def test_a_version_that_does_not_load_leaves_the_old_one_served(serving_folder, serve_folder):
    with serve_folder(serving_folder) as running:
        before = nats(running)
        broken = serving_folder / "2"
        broken.mkdir()
        (broken / "saved_model.pb").write_bytes(b"not a SavedModel")
        until = time.monotonic() + DEADLINE_S
        while states(running).get(2) != "END":  # tried, and failed
            assert time.monotonic() < until, states(running)
            time.sleep(LOOK_EVERY_S)
        status, doc = call_json(f"{running.url}/versions/2")
        (version,) = doc["model_version_status"]
        assert version["status"]["error_code"] != "OK" and version["status"]["error_message"]
        assert available(running.url) == [1] and nats(running) == before


def test_a_gs_destination_is_listed_and_downloaded_through_the_storage_layer(
    gcs, tiny_model, serve_folder
):
    """gs:// through `components.storage` (the GCS emulator here), each version downloaded to
    a temporary folder to load: TensorFlow's own GCS file system would need credentials."""
    destination = gcs.uri("serving", "gpt")
    assert publish(tiny_model / SERVING_DIR, destination) == 1
    with serve_folder(destination) as running:
        assert available(running.url) == [1]
        first = nats(running)
        assert publish(tiny_model / SERVING_DIR, destination) == 2
        wait_until_served(running.url, 2)
        assert nats(running) == first
