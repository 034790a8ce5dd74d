"""The Dockerfile, the pinned bases and images/build.py's pure parts; nothing here runs docker."""

import fnmatch
import hashlib
import importlib.util
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("images_build", REPO / "images" / "build.py")
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)

KNOWN = {"ARG", "FROM", "LABEL", "ENV", "RUN", "WORKDIR", "COPY", "USER"}
OCI = (
    "org.opencontainers.image.title",
    "org.opencontainers.image.source",
    "org.opencontainers.image.revision",
    "org.opencontainers.image.version",
)


def test_one_dockerfile_takes_its_base_as_an_argument_and_is_non_root_and_labelled():
    steps = build.instructions(build.DOCKERFILE.read_text())
    assert {keyword for keyword, _ in steps} <= KNOWN
    # No default base: a build that forgets --build-arg BASE_IMAGE fails instead of guessing.
    assert steps[0] == ("ARG", "BASE_IMAGE") and steps[1] == ("FROM", "${BASE_IMAGE}")
    users = [rest for keyword, rest in steps if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    labels = " ".join(rest for keyword, rest in steps if keyword == "LABEL")
    for label in OCI:
        assert f"{label}=" in labels
    assert 'org.opencontainers.image.revision="${REVISION}"' in labels
    assert "GPTPIPE_CODE_VERSION=${REVISION}" in " ".join(r for k, r in steps if k == "ENV")
    copied = {rest.split()[0] for keyword, rest in steps if keyword == "COPY"}
    packages = {p.name for p in REPO.iterdir() if (p / "__init__.py").is_file()}
    packages -= {"bench", "tests"}
    assert packages <= copied, "every installed package must be copied into the image"


def test_each_image_has_a_base_pinned_by_digest():
    bases = build.read_bases()
    assert set(bases) == set(build.IMAGES)
    assert bases["pipeline"].startswith("python:3.11-slim@")
    assert bases["trainer"].startswith("tensorflow/tensorflow:2.19.0-gpu@")
    for base in bases.values():
        assert re.search(r"@sha256:[0-9a-f]{64}$", base), base


def test_the_serving_images_are_pinned_beside_the_bases():
    pins = build.read_pins()
    assert set(pins) == set(build.IMAGES + build.SERVING_IMAGES)
    assert pins["serving"].startswith("tensorflow/serving:")
    assert pins["serving-gpu"].startswith("tensorflow/serving:")
    for ref in pins.values():
        assert re.search(r"@sha256:[0-9a-f]{64}$", ref), ref
    # tests/deploy/test_serving.py checks their tags and that deploy/serving runs exactly these.


def test_pin_base_pins_every_image_and_the_manifests_that_run_them(tmp_path, capsys):
    placeholder = "@" + build.PLACEHOLDER_DIGEST
    refs = {
        "pipeline": "python:3.11-slim" + placeholder,
        "trainer": "tensorflow/tensorflow:2.19.0-gpu" + placeholder,
        "serving": "tensorflow/serving:2.19.1" + placeholder,
        "serving-gpu": "tensorflow/serving:2.19.1-gpu" + placeholder,
    }
    bases = tmp_path / "bases.json"
    bases.write_text(json.dumps(refs))
    deploy = tmp_path / "deploy"
    (deploy / "gpu").mkdir(parents=True)
    manifest = deploy / "deployment.yaml"
    manifest.write_text(f"# the server\nimage: {refs['serving']}  # pinned\n")
    patch = deploy / "gpu" / "patch.yaml"
    patch.write_text(f"image: {refs['serving-gpu']}\n")
    untouched = deploy / "rbac.yaml"
    untouched.write_text("kind: Role\n")

    def resolve(tag: str) -> str:
        return "sha256:" + hashlib.sha256(tag.encode()).hexdigest()

    build.pin_base(bases, deploy, resolve)
    pinned = json.loads(bases.read_text())
    assert pinned == {
        name: f"{ref.split('@')[0]}@{resolve(ref.split('@')[0])}" for name, ref in refs.items()
    }
    assert manifest.read_text() == f"# the server\nimage: {pinned['serving']}  # pinned\n"
    assert patch.read_text() == f"image: {pinned['serving-gpu']}\n"
    assert untouched.read_text() == "kind: Role\n"
    assert f"re-pinned {manifest}" in capsys.readouterr().out


def test_the_trainer_placeholder_digest_is_refused_before_any_build(capsys):
    bases = build.read_bases()
    if build.PLACEHOLDER_DIGEST not in bases["trainer"]:
        pytest.fail("the trainer base is pinned for real now: drop this test's premise")
    with pytest.raises(build.BuildError, match="placeholder digest"):
        build.check_base_pinned("trainer", bases["trainer"])
    assert build.main(["build", "--registry", "r", "--revision", "abc"]) == 2
    assert "make pin-base-images" in capsys.readouterr().err
    build.check_base_pinned("pipeline", bases["pipeline"])  # a real digest passes


def test_a_tag_only_base_or_a_missing_one_is_refused(tmp_path):
    with pytest.raises(build.BuildError, match="not pinned by digest"):
        build.check_base_pinned("pipeline", "python:3.11-slim")
    bases = tmp_path / "bases.json"
    bases.write_text(json.dumps({"pipeline": "python:3.11-slim@sha256:" + "a" * 64}))
    with pytest.raises(build.BuildError, match="no base image for trainer"):
        build.read_bases(bases)
    with pytest.raises(build.BuildError, match="no image for trainer, serving, serving-gpu"):
        build.read_pins(bases)


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


def test_the_image_sets_the_trainer_workers_environment():
    # What every train job's spec sets for its workers, the image sets too: a worker started
    # from the image by other means (`gptpipe gpu-bench`, a debugging shell) runs the same.
    from components.train.executor import WORKER_ENV

    env = " ".join(
        rest
        for keyword, rest in build.instructions(build.DOCKERFILE.read_text())
        if keyword == "ENV"
    )
    for name, value in WORKER_ENV.items():
        assert re.search(rf"(^|\s){name}={value}(\s|$)", env), f"{name}={value} not in ENV"


def test_dockerignore_keeps_the_build_context_small():
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", ".venv", "runs", "tests"} <= set(ignored)


def test_the_image_holds_bench_where_gpu_bench_looks_for_it():
    from pipelines.cli import gpu_bench as gpu_bench_cmd

    steps = build.instructions(build.DOCKERFILE.read_text())
    workdir = None
    for keyword, rest in steps:
        if keyword == "WORKDIR":
            workdir = rest
        if keyword == "COPY" and rest.split()[0] == "bench":
            target = Path(workdir or "/") / rest.split()[1]
            assert str(target) == f"{gpu_bench_cmd.BENCH_ROOT}/bench"
            break
    else:
        pytest.fail("images/Dockerfile does not copy bench/")
    lines = (REPO / ".dockerignore").read_text().splitlines()
    patterns = [line.strip().strip("/") for line in lines if line.strip()[:1] not in ("", "#")]

    def excluded(path: str) -> bool:  # a pattern that matches a folder excludes what it holds
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        return any(fnmatch.fnmatch(p, pattern) for p in prefixes for pattern in patterns)

    for path in ("bench/__init__.py", "bench/gpu_bench.py", "bench/results.py"):
        assert not excluded(path), path
    assert excluded("bench/.peer-venv/bin/python")
    assert excluded("bench/.torch-venv/bin/python")
