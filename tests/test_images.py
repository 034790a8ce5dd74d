"""The Dockerfiles and images/build.py's pure parts; nothing here runs docker."""

import importlib.util
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("images_build", REPO / "images" / "build.py")
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)

KNOWN = {"ARG", "FROM", "LABEL", "ENV", "RUN", "WORKDIR", "COPY", "USER"}
OCI = (
    "org.opencontainers.image.source",
    "org.opencontainers.image.revision",
    "org.opencontainers.image.version",
)


@pytest.mark.parametrize("name", sorted(build.IMAGES))
def test_dockerfile_parses_and_is_pinned_non_root_and_labelled(name):
    text = build.IMAGES[name].read_text()
    steps = build.instructions(text)
    assert {keyword for keyword, _ in steps} <= KNOWN
    (base,) = build.base_images(text)
    assert re.search(r"@sha256:[0-9a-f]{64}$", base), base
    expected = {"pipeline": "python:3.11-slim@", "trainer": "tensorflow/tensorflow:2.19.0-gpu@"}
    assert base.startswith(expected[name])
    users = [rest for keyword, rest in steps if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    labels = " ".join(rest for keyword, rest in steps if keyword == "LABEL")
    for label in OCI:
        assert f"{label}=" in labels
    assert 'org.opencontainers.image.revision="${REVISION}"' in labels
    assert "GPTPIPE_CODE_VERSION=${REVISION}" in " ".join(r for k, r in steps if k == "ENV")


def test_the_trainer_placeholder_digest_is_refused_before_any_build(capsys):
    trainer = build.IMAGES["trainer"]
    if build.PLACEHOLDER_DIGEST not in trainer.read_text():
        pytest.fail("the trainer base is pinned for real now: drop this test's premise")
    with pytest.raises(build.BuildError, match="placeholder digest"):
        build.check_base_pinned(trainer)
    assert build.main(["build", "--registry", "r", "--revision", "abc"]) == 2
    assert "make pin-base-images" in capsys.readouterr().err
    build.check_base_pinned(build.IMAGES["pipeline"])  # a real digest passes


def test_a_tag_only_base_is_refused(tmp_path):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("ARG BASE_IMAGE=python:3.11-slim\nFROM ${BASE_IMAGE}\n")
    with pytest.raises(build.BuildError, match="not pinned by digest"):
        build.check_base_pinned(dockerfile)


def test_lock_from_buildx_metadata(tmp_path):
    digest = "sha256:" + "c" * 64
    index = "application/vnd.oci.image.index.v1+json"
    metadata = {
        "containerimage.digest": digest,
        "image.name": "ghcr.io/me/gptpipe-pipeline:abc123,ghcr.io/me/gptpipe-pipeline:x",
        "containerimage.descriptor": {"mediaType": index, "digest": digest},
    }
    ref = build.pinned_reference(metadata)
    assert ref == f"ghcr.io/me/gptpipe-pipeline@{digest}"
    assert build.pinned_reference({**metadata, "image.name": "localhost:5000/p:1"}) == (
        f"localhost:5000/p@{digest}"
    )
    with pytest.raises(build.BuildError, match="--push"):
        build.pinned_reference({"image.name": "r/p:1"})
    lock = tmp_path / "digests.json"
    build.write_lock({"trainer": "r/t@" + digest, "pipeline": ref}, lock)
    assert json.loads(lock.read_text()) == {"pipeline": ref, "trainer": "r/t@" + digest}
    from pipelines import compiler

    assert compiler.load_images(lock).pipeline == ref


def test_dockerignore_keeps_the_build_context_small():
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", ".venv", "runs", "tests"} <= set(ignored)
