"""Helpers for tests that start real processes: is a pid still running, signalling a process
group only while it is surely ours, and racing processes released at one moment."""

import contextlib
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent  # children import the project from here


def alive(pid: int) -> bool:
    """True if `pid` runs (a zombie, which only waits for its parent to reap it, is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal the process group `proc` leads, unless Popen has reaped `proc`.

    A reaped leader's PID, and so its group's ID, is free for the kernel to give to any new
    process (pid_max is 32768 in many containers), and the signal would reach a stranger:
    another test run started with `setsid` gets SIGTERM. While `proc` is running or an
    unreaped zombie, its PID is its own.
    """
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)


def wait_unreaped(proc: subprocess.Popen[bytes]) -> None:
    """Block until `proc` exits, and leave it unreaped (a zombie keeps its PID, and so its
    group's ID, from other processes), so that `signal_group` can still reach the group's
    other processes; `proc.wait()` reaps it after."""
    with contextlib.suppress(ChildProcessError):
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)


_BARRIER = """
import os as _os, time as _time
def WAIT():
    open(_os.path.join({folder!r}, f"ready-{{_os.getpid()}}"), "w").close()
    while not _os.path.exists(_os.path.join({folder!r}, "go")):
        _time.sleep(0.0005)
"""


def run_together(
    scripts: list[str], env: dict[str, str] | None = None, timeout: float = 300.0
) -> list[subprocess.CompletedProcess[str]]:
    """Run Python `scripts` as parallel processes and release them at one moment.

    Each script calls `WAIT()` once its imports are done; when every process is waiting, all
    are let go together, so their racing parts really overlap. Returns each one's result.
    """
    with tempfile.TemporaryDirectory(prefix="together-") as folder:
        prelude = _BARRIER.format(folder=folder)
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", prelude + textwrap.dedent(script)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=REPO,
            )
            for script in scripts
        ]
        deadline = time.monotonic() + timeout
        while len(list(Path(folder).glob("ready-*"))) < len(procs):
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        Path(folder, "go").touch()
        results = []
        for proc, script in zip(procs, scripts, strict=True):
            out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1.0))
            results.append(subprocess.CompletedProcess(script, proc.returncode, out, err))
        return results
