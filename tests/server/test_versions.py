"""Which version is served (server/versions.py): TF Serving's latest-version policy over a
serving folder, with a stand-in loader (no TensorFlow). The real models' pickup over HTTP is
tests/server/test_rest_versions.py."""

import logging
import shutil

import pytest

from components import serving
from server.servable import Servable
from server.status import ServingError
from server.versions import LOAD_ATTEMPTS, Versions


class Loader:
    """Loads a stand-in Servable per version; the versions in `broken` fail to load."""

    def __init__(self, broken=()):
        self.broken = set(broken)
        self.loaded: list[int] = []

    def __call__(self, name: str, version: int, uri: str) -> Servable:
        self.loaded.append(version)
        if version in self.broken:
            raise ValueError(f"{uri} is not a SavedModel that loads\n(a second line)")
        return Servable(name, version, {}, {}, None)


def publish(folder, version: int) -> None:
    """A complete version as serving_versions sees one: <N>/saved_model.pb."""
    (folder / str(version)).mkdir(parents=True)
    (folder / str(version) / serving.READY).write_bytes(b"")


@pytest.fixture
def folder(tmp_path):
    path = tmp_path / "serving" / "gpt"
    publish(path, 1)
    return path


def states(versions):
    return {v: s.state for v, s in versions.states().items()}


def test_the_newest_is_served_and_a_new_one_replaces_it_once_loaded(folder):
    loader = Loader()
    versions = Versions("gpt", str(folder), loader)
    versions.poll()
    assert versions.served_version == 1 and states(versions) == {1: "AVAILABLE"}
    (folder / "3").mkdir()  # a push still copying: no saved_model.pb yet
    versions.poll()
    assert versions.served_version == 1 and loader.loaded == [1]
    publish(folder, 2)
    versions.poll()
    assert versions.served_version == 2 and loader.loaded == [1, 2]
    assert list(states(versions).items()) == [(2, "AVAILABLE"), (1, "END")]  # newest first


def test_a_request_keeps_the_version_it_took_while_the_next_is_switched_to(folder):
    versions = Versions("gpt", str(folder), Loader())
    versions.poll()
    taken = versions.get("gpt", None)
    publish(folder, 2)
    versions.poll()
    assert taken.version == 1  # still whole: the request runs on it to its end
    assert versions.get("gpt", None).version == 2 and versions.get("gpt", 2).version == 2


@pytest.mark.parametrize(
    ("name", "version", "message"),
    [
        ("gpt", 1, "Servable not found for request: Specific(gpt, 1)"),  # unloaded
        ("gpt", 7, "Servable not found for request: Specific(gpt, 7)"),
        ("other", None, "Servable not found for request: Latest(other)"),
    ],
)
def test_what_is_not_loaded_is_not_found_in_tf_servings_words(folder, name, version, message):
    versions = Versions("gpt", str(folder), Loader())
    versions.poll()
    publish(folder, 2)
    versions.poll()
    with pytest.raises(ServingError) as caught:
        versions.get(name, version)
    assert caught.value.http_status == 404 and caught.value.message == message


def test_a_rollback_and_its_undoing_are_followed(folder):
    """`gptpipe rollback` republishes 1 as 3; deleting 3 falls back to 2, loaded again."""
    loader = Loader()
    versions = Versions("gpt", str(folder), loader)
    publish(folder, 2)
    versions.poll()
    serving.rollback(str(folder), 1)
    versions.poll()
    assert versions.served_version == 3
    shutil.rmtree(folder / "3")
    versions.poll()
    assert versions.served_version == 2 and loader.loaded == [2, 3, 2]
    assert states(versions) == {3: "END", 2: "AVAILABLE"}


def test_an_emptied_folder_unloads_the_served_version_as_tf_serving_does(folder):
    """Without servable_versions_always_present, TF Serving aspires no version once the
    folder lists none, and the policy unloads the loaded one; a new push is served again."""
    versions = Versions("gpt", str(folder), Loader())
    versions.poll()
    shutil.rmtree(folder / "1")
    versions.poll()
    assert versions.served_version is None and states(versions) == {1: "END"}
    with pytest.raises(Exception, match="Servable not found for request: Latest"):
        versions.get("gpt", None)
    publish(folder, 2)
    versions.poll()
    assert versions.served_version == 2


@pytest.mark.fault("a pushed version that fails to load")
def test_a_version_that_fails_to_load_is_logged_once_and_the_old_one_served(folder, caplog):
    loader = Loader(broken={2})
    versions = Versions("gpt", str(folder), loader)
    versions.poll()
    publish(folder, 2)
    with caplog.at_level(logging.WARNING, logger="server.versions"):
        for _ in range(LOAD_ATTEMPTS + 2):  # tried at each poll, then given up on
            versions.poll()
    assert versions.served_version == 1 and loader.loaded == [1] + [2] * LOAD_ATTEMPTS
    failed = versions.states()[2]
    assert (failed.state, failed.error_code.name) == ("END", "UNKNOWN")
    assert failed.error_message.startswith(f"{folder / '2'} is not a SavedModel that loads")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == LOAD_ATTEMPTS and all("\n" not in line for line in lines)
    assert "version 2 of gpt failed to load" in lines[0] and "still serving version 1" in lines[0]
    assert f"attempt {LOAD_ATTEMPTS} of {LOAD_ATTEMPTS}, given up" in lines[-1]
    publish(folder, 3)  # the next push is served
    versions.poll()
    assert versions.served_version == 3


@pytest.mark.fault("the serving folder cannot be listed")
def test_a_listing_that_fails_changes_nothing(folder, monkeypatch, caplog):
    versions = Versions("gpt", str(folder), Loader())
    versions.poll()

    def unreachable(_):
        raise OSError("the bucket is unreachable")

    monkeypatch.setattr(serving, "serving_versions", unreachable)
    with caplog.at_level(logging.WARNING, logger="server.versions"):
        versions.poll()
    assert versions.served_version == 1
    assert "cannot list the versions" in caplog.records[0].getMessage()


def test_polling_runs_in_the_background_until_stopped(folder):
    versions = Versions("gpt", str(folder), Loader())
    versions.start(poll_seconds=0.01)  # the first poll is done before start returns
    try:
        assert versions.served_version == 1
    finally:
        versions.stop()
    assert not versions._thread.is_alive()
