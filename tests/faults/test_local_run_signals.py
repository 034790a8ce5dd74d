"""A whole local run stopped while it trains. SIGTERM (`kill`, a cancelled CI job) or a closed
terminal (SIGHUP) end it as Ctrl-C does, leaving no worker running and no step RUNNING in
lineage (pipelines/runners/local/runner.py, `_stopped_as_by_ctrl_c`). SIGKILL (`kill -9`, the
OOM killer) leaves the run no say: its steps see it gone and end themselves, workers first
(components/runner_watch.py)."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from components import lineage
from contracts import progress
from contracts.process import running_processes
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
CLI = "import sys; from pipelines.cli.main import main; sys.exit(main(sys.argv[1:]))"


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


def _of_run(folder: Path) -> list[int]:
    """The running processes whose command line names `folder`, the run's root: its steps
    (kfp.local's `sh` and the step's Python, whose arguments hold their artifacts' paths) and
    their workers (their --work-dir). A PID reused by another process does not name it."""
    found = []
    for pid in running_processes():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # ended while listed
        if str(folder).encode() in argv:
            found.append(pid)
    return found


def _is_worker(pid: int) -> bool:
    """True if `pid` runs the trainer."""
    try:
        return b"trainer.task" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False


def _training(root: Path) -> bool:
    """True once the run's workers have reported a training step (contracts/progress.py)."""
    found = []
    for events in root.glob("logs/*/progress.jsonl"):
        found += progress.read_events(str(events))[0]
    return any(e["step"] == "train" and e.get("unit") == "steps" for e in found)


@pytest.mark.heavy
@pytest.mark.fault("SIGKILL to a whole `gptpipe run --local` as its workers start, or train")
@pytest.mark.parametrize("when", ["starting", "training"])
def test_no_worker_and_no_step_outlives_a_local_run_killed_outright(tmp_path, when):
    """No worker and no step process outlives the run, and the train step records its end."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text((REPO / "data" / "tinyshakespeare.txt").read_text()[:60_000])
    root = tmp_path / "runs"
    small = (*PIPELINE_SMALL, "train.train_steps=100000")  # still training when killed
    sets = [arg for item in small for arg in ("--set", item)]
    argv = ["run", "--local", "--root", str(root), "--corpus", str(corpus), "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore::FutureWarning"}
    with open(tmp_path / "cli.log", "wb") as log:
        run = subprocess.Popen(
            [sys.executable, "-c", CLI, *argv, "--config", "tiny", *sets],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the kill reaches the run's process alone, as `kill -9`
        )
    try:
        deadline = time.monotonic() + 600
        # starting: in the rendezvous, or still importing TensorFlow
        while len([p for p in _of_run(root) if _is_worker(p)]) < 2 or (
            when == "training" and not _training(root)
        ):
            assert run.poll() is None, (tmp_path / "cli.log").read_text()[-4000:]
            assert time.monotonic() < deadline, f"the workers never got to {when}"
            time.sleep(0.2)
        before = [p for p in _of_run(root) if p != run.pid]  # the run's own names it too
        os.kill(run.pid, signal.SIGKILL)
        assert run.wait(timeout=60) == -signal.SIGKILL
        deadline = time.monotonic() + 300  # a worker's grace, the step's record: generous
        while _of_run(root) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _of_run(root)
    finally:  # nothing of a failed test left running
        if run.poll() is None:
            os.kill(run.pid, signal.SIGKILL)
        for pid in _of_run(root):
            os.kill(pid, signal.SIGKILL)
    assert any(not _is_worker(p) for p in before), "no step process was seen"
    assert not left, f"outlived the run: {left}"
    (run_id,) = [folder.name for folder in (root / "logs").iterdir()]
    summary = lineage.run_summary(str(root / "metadata.sqlite"), run_id)
    states = {e["step"]: e["state"] for e in summary["executions"]}
    # Nobody is left to close the step's record: it closed it itself, as it stopped.
    assert states["train"] == "FAILED", states
