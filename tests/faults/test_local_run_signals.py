"""A whole local run stopped by SIGTERM while it trains: `kill`, a cancelled CI job or a closed
terminal (SIGHUP) end it as Ctrl-C does, leaving no worker running and no step RUNNING in
lineage (pipelines/runner.py, `_stopped_as_by_ctrl_c`)."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from components import lineage
from tests.processes import REPO, alive
from tests.tiny import PIPELINE_SMALL

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RUN = """
import sys
from pipelines.runners.local import runner
from trainer.config import resolve_config
config = resolve_config("tiny", {small!r})
run = runner.LocalRun(root={root!r}, corpus={corpus!r}, config=config)
try:
    runner.run_local(run, run_id={run_id!r})
except KeyboardInterrupt as err:
    print(f"interrupted by {{err}}", flush=True)
    sys.exit(130)
"""


def _workers(run_id: str) -> list[int]:
    """The trainer processes of `run_id` (their --work-dir names it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"trainer.task" in argv and any(run_id.encode() in a for a in argv):
            found.append(int(entry.name))
    return found


@pytest.mark.fault("SIGTERM to a local run while its workers train")
def test_sigterm_ends_a_local_run_as_ctrl_c_does_and_leaves_nothing_running(tmp_path):
    run_id = f"sigterm-{uuid.uuid4().hex[:8]}"  # what the workers' --work-dir names
    corpus = tmp_path / "corpus.txt"
    corpus.write_text((REPO / "data" / "tinyshakespeare.txt").read_text()[:60_000])
    root = tmp_path / "runs"
    small = (*PIPELINE_SMALL, "train.train_steps=100000")  # still training when stopped
    script = RUN.format(small=small, root=str(root), corpus=str(corpus), run_id=run_id)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore::FutureWarning"}
    run = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # as `kill <pid>` reaches it: no terminal's Ctrl-C to the steps
    )
    try:
        deadline = time.monotonic() + 300
        while len(_workers(run_id)) < 2:
            assert run.poll() is None, run.communicate()[1][-4000:]
            assert time.monotonic() < deadline, "the workers never started"
            time.sleep(0.5)
        workers = _workers(run_id)
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=120)
    finally:  # nothing of a failed test left running
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        leftover = _workers(run_id)  # at the run's end: the step must have stopped them before
        for pid in leftover:
            os.kill(pid, signal.SIGKILL)
    assert run.returncode == 130, err[-4000:]
    assert "interrupted by SIGTERM" in out
    assert not leftover and not any(alive(p) for p in workers), "a worker outlived the run"
    summary = lineage.run_summary(str(root / "metadata.sqlite"), run_id)
    states = {e["step"]: e["state"] for e in summary["executions"]}
    assert states["train"] == "FAILED" and "RUNNING" not in states.values(), states
    # the train step recorded its own end (the run waited for it), not the run's INTERRUPTED
    step, error = lineage.failure_of(str(root / "metadata.sqlite"), run_id) or ("", "")
    assert step == "train" and "SIGTERM" in error, error
