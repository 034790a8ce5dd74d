"""A local run's step ends with the run (components/runner_watch.py).

A stand-in run (a process that names itself as `gptpipe run --local` does, then waits) and a
stand-in step that watches it run as real processes; the run is SIGKILLed, and the test waits
for the step to end: on its SIGTERM, as the launchers do, or killed when deaf to it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components import runner_watch, storage
from contracts.errors import UserError
from tests.processes import REPO

pytestmark = pytest.mark.skipif(
    storage.this_process() is None, reason="a process is told by /proc (Linux)"
)

RUN = (
    "import json, sys\n"
    "from components import runner_watch\n"
    "print(json.dumps(runner_watch.announce()), flush=True)\n"
    "sys.stdin.read()\n"  # runs until killed
)

STEP = r"""
import os, signal, sys
from pathlib import Path
from components import runner_watch

mode, folder, stop_s = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])


def stop(signum, frame):
    (folder / "told").touch()
    sys.exit(7)


signal.signal(signal.SIGTERM, stop if mode == "stops" else signal.SIG_IGN)
runner = runner_watch.runner_of(os.environ)
runner_watch.end_with(runner, poll_s=0.05, stop_s=stop_s)
(folder / "watching").touch()
sys.stdin.read()  # runs until told to stop, or killed
"""

DEADLINE_S = 120.0  # generous: a loaded machine starts Python slowly; the wait ends at the event


def _start(argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", *argv],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        stdin=subprocess.PIPE,  # never written: each reads until it ends
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    until = time.monotonic() + DEADLINE_S
    while not path.exists():
        assert proc.poll() is None, f"exited {proc.returncode} before {path.name}"
        assert time.monotonic() < until, f"no {path.name} within {DEADLINE_S} s"
        time.sleep(0.05)


@pytest.mark.fault("SIGKILL to a local run while a step watches it")
# A step that stops on SIGTERM is never reached by the SIGKILL; a deaf one soon is.
@pytest.mark.parametrize(
    "mode, stop_s, ended",
    [("stops", 3600, 7), ("deaf", 0.5, -signal.SIGKILL)],
    ids=["stops-on-sigterm", "deaf-to-sigterm"],
)
def test_a_step_ends_once_its_run_is_killed_outright(tmp_path, mode, stop_s, ended):
    """A step ends on its SIGTERM once its run is gone, or is killed if it does not."""
    run = _start([RUN], {})
    step = None
    try:
        assert run.stdout is not None
        announced = json.loads(run.stdout.readline())
        step = _start([STEP, mode, str(tmp_path), str(stop_s)], announced)
        _wait_for(tmp_path / "watching", step)
        assert step.poll() is None  # its run lives: the step goes on
        run.kill()
        run.wait(timeout=DEADLINE_S)
        assert step.wait(timeout=DEADLINE_S) == ended
    finally:
        for proc in (run, step):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=DEADLINE_S)
    assert (tmp_path / "told").exists() == (mode == "stops")


def test_the_run_names_its_own_process_to_its_steps():
    env = runner_watch.announce()
    assert runner_watch.runner_of(env) == storage.this_process()
    assert not storage.process_gone(runner_watch.runner_of(env), storage.this_process())


def test_a_step_outside_a_local_run_watches_nothing():
    assert runner_watch.runner_of({}) is None
    assert runner_watch.end_with(None) is None


@pytest.mark.parametrize("value", ["not json", "[1, 2]", "42"])
def test_a_record_that_is_not_a_process_is_one_line_naming_the_variable(value):
    with pytest.raises(UserError, match=runner_watch.RUNNER_ENV):
        runner_watch.runner_of({runner_watch.RUNNER_ENV: value})
