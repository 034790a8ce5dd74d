"""The release workflow, run as GitHub runs it, through the Makefile, against the KFP API double.

Each `run:` step of .github/workflows/release.yml runs verbatim under bash, with the job's
environment (its `vars.*` and `secrets.*` filled in with test values), GITHUB_ENV carried from
step to step, and `make` reading its variables from that environment. Only three things differ:
the `uses:` steps and `make install` are skipped (this checkout is installed), `make images` is
replaced by a fixed digest lock (LOCK), and the compiled YAML goes to a temporary folder
(PIPELINE_YAML) and submit polls without waiting (POLL=0). `make images` itself is tested on a
copy of the Makefile and images/build.py, with a stand-in `docker`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.doubles.kfp.api_server import KfpApiDouble, RunScript
from trainer.config import config_to_dict, resolve_config

REPO = Path(__file__).resolve().parents[2]
RELEASE = REPO / ".github" / "workflows" / "release.yml"
LOCK = REPO / "tests" / "data" / "digests.json"
SHA = "0123456789abcdef0123456789abcdef01234567"
VERSION = "git-0123456789ab"
TOKEN = "ci-token"
VARS = {
    "REGISTRY": "europe-docker.pkg.dev/project/gptpipe",
    "GCP_WORKLOAD_IDENTITY_PROVIDER": (
        "projects/1/locations/global/workloadIdentityPools/github/providers/github"
    ),
    "GCP_SERVICE_ACCOUNT": "release@project.iam.gserviceaccount.com",
    "PIPELINE_ROOT": "gs://bucket/gptpipe",
    "TRAIN_CONFIG": "gpt2-small",
    "KFP_NAMESPACE": "team-a",
    "SMOKE_CORPUS": "gs://bucket/smoke/corpus.txt",
    "SMOKE_SERVING_DIR": "gs://bucket/smoke/serving",
    "CORPUS": "gs://bucket/corpus/",
    "SERVING_DIR": "gs://bucket/serving/gpt",
}
SKIPPED = {"install", "images"}  # installed already; the fixed lock stands for the build
# The environment without the variables an outer `make test` passes its sub-makes.
MAKE_FREE_ENV = {
    k: v
    for k, v in os.environ.items()
    if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")
}


def release_job() -> dict[str, Any]:
    (job,) = yaml.safe_load(RELEASE.read_text())["jobs"].values()
    return job


def make_target(step: dict[str, Any]) -> str | None:
    found = re.match(r"make (\S+)", step.get("run", ""))
    return found[1] if found else None


def resolve(env: dict[str, Any], values: dict[str, str]) -> dict[str, str]:
    """`${{ vars.X }}` and `${{ secrets.X }}` filled in; any other expression is an error here."""

    def fill(match: re.Match[str]) -> str:
        return values[f"{match[1]}.{match[2]}"]

    resolved = {}
    for name, value in env.items():
        text = re.sub(r"\$\{\{\s*(vars|secrets)\.(\w+)\s*\}\}", fill, str(value))
        assert "${{" not in text, f"{name}: the test does not know {text}"
        resolved[name] = text
    return resolved


def github_env(path: Path) -> dict[str, str]:
    lines = path.read_text().splitlines() if path.exists() else []
    return dict(line.split("=", 1) for line in lines if "=" in line)


def run_release(double: KfpApiDouble, tmp_path: Path) -> list[tuple[str, Any]]:
    """Run the release's steps in order, as the runner would; stop at the first that fails.

    Returns (step name, CompletedProcess) for each step run.
    """
    values = {f"vars.{k}": v for k, v in VARS.items()} | {
        "vars.KFP_HOST": double.host,
        "secrets.KFP_TOKEN": TOKEN,
    }
    runner = tmp_path / "runner"
    (runner / "home").mkdir(parents=True, exist_ok=True)
    base = {
        "PATH": os.environ["PATH"],
        "HOME": str(runner / "home"),  # no ~/.config/kfp/context.json
        "LANG": "C.UTF-8",
        "CI": "true",
        "GITHUB_SHA": SHA,
        "GITHUB_ENV": str(runner / "github_env"),
        "GITHUB_OUTPUT": str(runner / "github_output"),
        "RUNNER_TEMP": str(runner),
        # what differs from GitHub: see the module docstring
        "LOCK": str(LOCK),
        "PIPELINE_YAML": str(runner / "gptpipe.yaml"),
        "POLL": "0",
    }
    job = release_job()
    env = base | resolve(job["env"], values)
    done = []
    for step in job["steps"]:
        if "uses" in step or make_target(step) in SKIPPED:
            continue
        step_env = env | github_env(runner / "github_env") | resolve(step.get("env", {}), values)
        result = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
            cwd=REPO,
            env=step_env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        done.append((step.get("name", step["run"]), result))
        if result.returncode != 0:
            break
    return done


@pytest.fixture(scope="module")
def installed() -> None:
    """The targets install first when pyproject.toml is newer; a test must not, so it stops."""
    stale = subprocess.run(["make", "-q", ".venv/.installed"], cwd=REPO, env=MAKE_FREE_ENV)
    if stale.returncode != 0:
        pytest.fail("pyproject.toml is newer than the install: run `make install`, then the tests")


@pytest.fixture
def double(installed):
    with KfpApiDouble(token=TOKEN, multi_user=True) as served:
        yield served


def test_the_release_calls_these_make_targets_in_this_order():
    targets = [make_target(step) for step in release_job()["steps"] if make_target(step)]
    assert targets == ["install", "images", "upload", "submit", "schedule"]
    names = [step.get("name") for step in release_job()["steps"]]
    assert names.index("KFP token file") < names.index("Upload version git-<sha>")


@pytest.mark.slow
def test_the_release_uploads_smoke_runs_and_schedules_and_a_rerun_changes_nothing(double, tmp_path):
    first = run_release(double, tmp_path)
    rerun = run_release(double, tmp_path)  # the job re-run for the same commit
    for name, result in first + rerun:
        assert result.returncode == 0, f"{name}:\n{result.stdout}\n{result.stderr}"
    outputs = {name: result.stdout for name, result in first}
    assert "created pipeline gptpipe" in outputs["Upload version git-<sha>"]
    assert (
        f"version {VERSION} of gptpipe already exists"
        in dict(rerun)["Upload version git-<sha>"].stdout
    )
    assert os.stat(tmp_path / "runner" / "kfp-token").st_mode & 0o777 == 0o600

    # upload: the pipeline and version git-<sha>, compiled with the lock and the train config
    (pipeline,) = double.pipelines.values()
    (version,) = double.versions.values()
    assert pipeline.display_name == "gptpipe" and version.display_name == VERSION
    assert double.statuses("POST", "/apis/v2beta1/pipelines/upload_version") == [200, 409]
    spec = version.pipeline_spec["pipeline_spec"]
    assert spec["defaultPipelineRoot"] == VARS["PIPELINE_ROOT"]
    default_config = spec["root"]["inputDefinitions"]["parameters"]["config"]["defaultValue"]
    assert default_config == config_to_dict(resolve_config("gpt2-small"))
    pinned = json.loads(LOCK.read_text())
    images = {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()}
    assert images == {pinned["pipeline"]} and pinned["trainer"] in json.dumps(spec)

    # submit: the uploaded version, tiny, 1 worker, no GPU, waited for until it succeeded
    assert ": SUCCEEDED" in outputs["Smoke run (tiny, 1 worker, no GPU)"]
    runs = list(double.runs.values())
    assert len(runs) == 2 and {run.state for run in runs} == {"SUCCEEDED"}
    for run in runs:
        assert run.display_name == f"smoke {VERSION}"
        assert run.pipeline_version_reference.pipeline_version_id == version.pipeline_version_id
        assert double.experiments[run.experiment_id].display_name == "gptpipe-smoke"
        assert run.runtime_config.parameters == {
            "config": config_to_dict(resolve_config("tiny")),
            "corpus": VARS["SMOKE_CORPUS"],
            "serving_dir": VARS["SMOKE_SERVING_DIR"],
            "train_job": {"workers": 1, "gpus_per_worker": 0},  # the step fills in the rest
        }

    # schedule: one recurring run on the pipeline (each firing takes the newest version)
    (job,) = double.recurring_runs.values()
    assert job.display_name == "gptpipe-weekly"
    assert job.pipeline_version_reference.pipeline_id == pipeline.pipeline_id
    assert not job.pipeline_version_reference.pipeline_version_id
    assert job.trigger.cron_schedule.cron == "0 0 2 * * 0"  # six fields: Sundays at 02:00
    assert job.runtime_config.parameters == {
        "corpus": VARS["CORPUS"],
        "serving_dir": VARS["SERVING_DIR"],
    }


@pytest.mark.slow
def test_a_failed_smoke_run_fails_the_release_before_the_schedule(double, tmp_path):
    double.run_scripts.append(RunScript("FAILED", failed_task="train"))
    done = run_release(double, tmp_path)
    name, result = done[-1]
    assert name == "Smoke run (tiny, 1 worker, no GPU)" and result.returncode != 0
    assert "FAILED: task train failed: no error message in KFP's API" in result.stderr
    assert double.recurring_runs == {}


def test_make_help_lists_the_release_targets():
    out = subprocess.run(
        ["make", "help"], cwd=REPO, env=MAKE_FREE_ENV, capture_output=True, text=True, check=True
    )
    for target in ("make upload", "make submit", "make schedule", "make images"):
        assert target in out.stdout


# ---- make images, with a stand-in docker ---------------------------------------------------

FAKE_DOCKER = """\
import hashlib, json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_DOCKER_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
if args[:2] == ["buildx", "build"]:
    tag = args[args.index("--tag") + 1]
    digest = "sha256:" + hashlib.sha256(tag.encode()).hexdigest()
    with open(args[args.index("--metadata-file") + 1], "w") as out:
        json.dump({"containerimage.digest": digest, "image.name": tag}, out)
"""
PIPELINE_BASE = "python:3.11-slim@sha256:" + "9" * 64
PLACEHOLDER = "tensorflow/tensorflow:2.19.0-gpu@sha256:" + "0" * 64


def make_images(tmp_path: Path, bases: dict[str, str]) -> tuple[Any, list[list[str]], Path]:
    """`make images` in a copy of the Makefile and images/, with `docker` a stand-in that logs."""
    copy = tmp_path / "repo"
    (copy / "images").mkdir(parents=True)
    shutil.copy(REPO / "Makefile", copy)
    for name in ("build.py", "Dockerfile"):
        shutil.copy(REPO / "images" / name, copy / "images")
    (copy / "images" / "bases.json").write_text(json.dumps(bases))
    tools = tmp_path / "bin"
    tools.mkdir()
    docker = tools / "docker"
    docker.write_text(f"#!{sys.executable}\n{FAKE_DOCKER}")
    docker.chmod(0o755)
    log = tmp_path / "docker.log"
    env = {
        "PATH": f"{tools}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "FAKE_DOCKER_LOG": str(log),
    }
    result = subprocess.run(
        ["make", "images", "REGISTRY=registry.example/team", f"REVISION={SHA}"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, calls, copy / "images" / "digests.json"


def test_make_images_refuses_a_placeholder_base_and_never_calls_docker(tmp_path):
    result, calls, lock = make_images(tmp_path, {"pipeline": PIPELINE_BASE, "trainer": PLACEHOLDER})
    assert result.returncode != 0
    assert (
        f"images/build.py: error: bases.json: the trainer base {PLACEHOLDER!r} still has the "
        "placeholder digest; run `make pin-base-images`" in result.stderr
    )
    assert calls == [] and not lock.exists()


def test_make_images_pins_what_buildx_pushed_and_never_builds_latest(tmp_path):
    trainer = PLACEHOLDER.replace("0" * 64, "8" * 64)
    result, calls, lock = make_images(tmp_path, {"pipeline": PIPELINE_BASE, "trainer": trainer})
    assert result.returncode == 0, result.stderr
    tags = [call[call.index("--tag") + 1] for call in calls]
    assert tags == [
        f"registry.example/team/gptpipe-{name}:{SHA[:12]}" for name in ("pipeline", "trainer")
    ]
    assert all("--push" in call for call in calls)
    assert not any("latest" in arg for call in calls for arg in call)
    assert f"BASE_IMAGE={trainer}" in calls[1]
    pinned = json.loads(lock.read_text())
    assert set(pinned) == {"pipeline", "trainer"}
    for name, ref in pinned.items():
        assert re.fullmatch(rf"registry\.example/team/gptpipe-{name}@sha256:[0-9a-f]{{64}}", ref)


# ---- the README's table of variables and secrets -------------------------------------------


@pytest.mark.parametrize(
    "doc, heading",
    [("README.md", "## Continuous delivery"), ("docs/operations.md", "## Secrets and variables")],
)
def test_every_variable_and_secret_the_release_reads_is_in_the_docs_tables(doc, heading):
    used = set(re.findall(r"\$\{\{\s*(vars|secrets)\.(\w+)", RELEASE.read_text()))
    text = (REPO / doc).read_text()
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (variable|secret) \|", section, re.MULTILINE)
    kinds = {"variable": "vars", "secret": "secrets"}
    assert {(kinds[kind], name) for name, kind in rows} == used
