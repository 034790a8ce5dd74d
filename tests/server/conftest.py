"""Serving the session's tiny model (tests/conftest.py's `tiny_model`) for the server's tests.

- `serving_folder` (function): `<tmp_path>/serving/gpt` with the tiny model published as
  version 1, as push publishes.
- `served` (module): `gptpipe serve`'s server, in-process on a free port, over such a folder;
  a `Running` (its `url`, its `versions`). Tests that change its folder use `serve_folder`.
- `serve_folder` (function): start a server on a folder a test changes; a context manager.
- `other_model` (session): a second SavedModel of the tiny model's config and tokenizer, its
  weights freshly initialised: another model, whose scores differ from the tiny model's.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from components import serving
from contracts.artifacts import MODEL_CONFIG, SERVING_DIR, TOKENIZER_FILE

CAP = 32  # --max-new-tokens-cap of the test servers
MAX_BODY = 64 << 10  # --max-body-bytes of the test servers
POLL_S = 0.1  # --poll-seconds of the test servers


def publish(saved_model: Path, folder: Path | str) -> int:
    """Publish a SavedModel into a serving folder (local or gs://) as its next version, as
    push does."""
    return serving.publish_next(str(saved_model), str(folder))


def make_serving_folder(root: Path, tiny_model: Path) -> Path:
    folder = root / "serving" / "gpt"
    folder.mkdir(parents=True)
    assert publish(tiny_model / SERVING_DIR, folder) == 1
    return folder


@contextlib.contextmanager
def _serving(folder: Path | str):
    from server import app
    from server.guards import Limits

    settings = app.Settings(
        source=str(folder),
        name="gpt",
        port=0,
        poll_seconds=POLL_S,
        limits=Limits(max_new_tokens=CAP),
        max_body_bytes=MAX_BODY,
    )
    with app.running(settings) as running:
        yield running


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model):
    folder = make_serving_folder(tmp_path_factory.mktemp("served"), tiny_model)
    with _serving(folder) as running:
        yield running


@pytest.fixture
def serving_folder(tmp_path, tiny_model) -> Path:
    return make_serving_folder(tmp_path, tiny_model)


@pytest.fixture
def serve_folder():
    return _serving


@pytest.fixture(scope="session")
def other_model(tmp_path_factory, tiny_model, examples) -> Path:
    import tf_keras as keras

    from trainer import config as config_lib
    from trainer import export, model

    cfg = config_lib.config_from_dict(json.loads((tiny_model / MODEL_CONFIG).read_text()))
    keras.mixed_precision.set_global_policy("float32")
    out = tmp_path_factory.mktemp("other-model") / "saved_model"
    export.export_model(model.build_gpt(cfg.model), cfg, str(examples / TOKENIZER_FILE), str(out))
    return out
