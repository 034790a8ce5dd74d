"""What a pipeline step prints when its pod is set up wrong: one line naming the fix, exit 2.

A step's edge reads the run id (the pod label KFP sets) and the ML Metadata address (KFP's
METADATA_GRPC_SERVICE_HOST/_PORT, or the `metadata` parameter) before any work.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from components.push import component as push_component

REPO = Path(__file__).resolve().parents[2]


def call_push(tmp_path, metadata: str) -> None:
    push_component.push(
        model=None,  # never reached: the edge fails first
        blessing=None,
        serving_dir=str(tmp_path / "serving"),
        metadata=metadata,
        pipeline_name="gptpipe",
        image="local-python-environment",
        pushed_model=None,
    )


@pytest.mark.parametrize(
    "env, metadata, message",
    [
        ({}, "store.sqlite", "KFP_RUN_ID is not set"),
        ({"KFP_RUN_ID": "run-1"}, "", "METADATA_GRPC_SERVICE_HOST"),
        ({"KFP_RUN_ID": "run-1"}, "ftp://store:8080", "ftp://store:8080"),
        (
            {"KFP_RUN_ID": "run-1", "GPTPIPE_RUNNER_PROCESS": "pid 42"},
            "store.sqlite",
            "GPTPIPE_RUNNER_PROCESS is not a process record",
        ),
    ],
    ids=["no-run-id", "no-store-address", "bad-store-address", "bad-run-process"],
)
def test_a_misconfigured_step_fails_in_one_line(
    tmp_path, monkeypatch, capsys, env, metadata, message
):
    unset = ("KFP_RUN_ID", "METADATA_GRPC_SERVICE_HOST", "METADATA_GRPC_SERVICE_PORT")
    for name in (*unset, "GPTPIPE_RUNNER_PROCESS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exited:
        call_push(tmp_path, metadata)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("gptpipe push: error:") and message in err
    assert err.count("\n") == 1  # one line, no traceback


def test_a_step_process_exits_with_its_status_and_skips_the_final_collection():
    # An atexit handler registered before step_edge's runs after it (atexit is LIFO), so it
    # sees whether the objects were frozen; the exit status is the process's own.
    script = (
        "import atexit, gc\n"
        "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))\n"
        "from contracts.process import exit_without_final_gc\n"
        "exit_without_final_gc()\n"
        "exit_without_final_gc()\n"  # once per process: one handler
        "raise SystemExit(3)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout.split()) == (3, ["frozen", "True"]), done.stderr
