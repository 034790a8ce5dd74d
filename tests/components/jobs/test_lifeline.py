"""No local worker outlives the launcher that started it (components/jobs/lifeline.py).

The launcher runs in a child process with workers that stand in for MultiWorkerMirrored ones
in the collective rendezvous: each listens on its TF_CONFIG port for a peer that never comes,
blocked in a C call, with SIGTERM and SIGINT ignored (a Python handler would not run there).
The launcher is then stopped by SIGKILL, SIGTERM or SIGINT, while its workers wait or while it
is still starting them, and the test waits, by polling /proc, until none of them runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.jobs.lifeline import Lifeline, die_with_parent
from contracts.process import running_processes
from tests.processes import REPO, alive

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's"
)

LAUNCHER = r"""
import signal, sys
from components.jobs.local import LocalLauncher
from components.jobs.spec import JobSpec

signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C, as at a terminal
worker, folder, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
spec = JobSpec(
    name="lifeline", command=[sys.executable, worker, folder], workers=workers, backoff_limit=0
)
LocalLauncher(log_dir=f"{folder}/logs", out=sys.stdout, kill_grace_seconds=1).run(spec)
"""

WORKER = r"""
import json, os, signal, socket, sys
from pathlib import Path

signal.signal(signal.SIGTERM, signal.SIG_IGN)  # deaf, as a worker blocked in C++ is
signal.signal(signal.SIGINT, signal.SIG_IGN)
folder = Path(sys.argv[1])
config = json.loads(os.environ["TF_CONFIG"])
index = config["task"]["index"]
host, port = config["cluster"]["worker"][index].rsplit(":", 1)
server = socket.create_server((host, int(port)))
(folder / f"waiting-{index}-{os.getpid()}").touch()
server.accept()  # the rendezvous: no peer ever connects
"""

DEADLINE_S = 120.0  # generous: a loaded machine starts Python slowly; the wait ends at the event


def _ours(script: Path, launcher: int) -> list[int]:
    """Running processes that run `script` or were forked to (the launcher's argv names it
    too), other than the launcher itself."""
    found = []
    for pid in running_processes():
        if pid == launcher:
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(script).encode() in argv:
            found.append(pid)
    return found


def _wait_for(condition, what: str, launcher: subprocess.Popen[str]) -> None:
    until = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < until, f"{what} within {DEADLINE_S} s"
        time.sleep(0.05)


def _start(tmp_path: Path, workers: int) -> tuple[subprocess.Popen[str], Path]:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    return (
        subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, str(worker), str(tmp_path), str(workers)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # no signal meant for the test run reaches it
        ),
        worker,
    )


def _waiting(tmp_path: Path) -> list[int]:
    return [int(p.name.rsplit("-", 1)[1]) for p in tmp_path.glob("waiting-*")]


@pytest.mark.fault(
    "the local launcher stopped by a signal while its workers wait in the rendezvous"
)
@pytest.mark.parametrize(
    "sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name
)
def test_no_worker_outlives_a_launcher_stopped_at_the_rendezvous(tmp_path, sig):
    """Every worker is gone soon after, though deaf to SIGTERM in the rendezvous."""
    launcher, worker = _start(tmp_path, workers=2)
    try:
        _wait_for(
            lambda: len(_waiting(tmp_path)) == 2 or launcher.poll() is not None,
            "both workers waiting in the rendezvous",
            launcher,
        )
        assert launcher.poll() is None, launcher.communicate()[0][-3000:]
        workers = _waiting(tmp_path)
        os.kill(launcher.pid, sig)
        _wait_for(lambda: not _ours(worker, launcher.pid), "every worker gone", launcher)
        out = launcher.communicate(timeout=DEADLINE_S)[0]  # it ends by itself
    finally:
        for pid in _ours(worker, launcher.pid):  # nothing of a failed test left running
            os.kill(pid, signal.SIGKILL)
        launcher.kill()
        launcher.communicate(timeout=60)
    assert not any(alive(pid) for pid in workers)
    if sig == signal.SIGKILL:
        assert launcher.returncode == -signal.SIGKILL
    else:  # it stopped them itself, as a cancelled run: SIGTERM, then SIGKILL after the grace
        assert launcher.returncode != 0
        name = "LaunchCancelled: received SIGTERM" if sig == signal.SIGTERM else "KeyboardInterrupt"
        assert name in out, out[-3000:]


@pytest.mark.fault("the local launcher SIGKILLed as its first worker runs, others starting")
def test_no_worker_outlives_a_launcher_killed_while_it_starts_them(tmp_path):
    """Nothing it started is left, wherever the start had got to.

    The kill falls before a fork, between a fork and the exec, or after: a child not yet armed
    finds itself re-parented and kills itself."""
    launcher, worker = _start(tmp_path, workers=6)
    try:
        _wait_for(
            lambda: _waiting(tmp_path) or launcher.poll() is not None,
            "a first worker running",
            launcher,
        )
        os.kill(launcher.pid, signal.SIGKILL)
        started = _waiting(tmp_path)
        _wait_for(lambda: not _ours(worker, launcher.pid), "every worker gone", launcher)
    finally:
        for pid in _ours(worker, launcher.pid):
            os.kill(pid, signal.SIGKILL)
        launcher.kill()
        out = launcher.communicate(timeout=60)[0]
    assert launcher.returncode == -signal.SIGKILL, out[-3000:]
    assert started and not any(alive(pid) for pid in started)


def test_what_a_lifeline_started_dies_when_it_is_released(tmp_path):
    """The signal follows the thread that forked, not the process: released, the lifeline's
    thread ends and takes its child with it, while this process lives on."""
    lifeline = Lifeline("test")
    child = lifeline.submit(
        lambda: subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"],
            preexec_fn=die_with_parent(os.getpid()),
        )
    ).result()
    try:
        assert alive(child.pid)
        lifeline.release()
        assert child.wait(timeout=DEADLINE_S) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()
