"""Helpers for tests that start real processes: is a pid still running, signalling a process
group only while it is surely ours, racing processes released at one moment, free ports."""

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from components.jobs.local import exited
from contracts.process import running

REPO = Path(__file__).resolve().parent.parent  # children import the project from here


alive = running  # contracts/process.py: a zombie is not alive


def _unreaped(proc: subprocess.Popen[bytes]) -> Any:
    """Hold off Popen's reaping of `proc` (CPython's subprocess.py takes `_waitpid_lock`
    around waitpid and setting returncode, in poll() and wait()) while the block runs.

    Only one thread reaps each process here, and only once it has exited (`wait_unreaped`
    first), so the lock is never held for long."""
    return getattr(proc, "_waitpid_lock", None) or contextlib.nullcontext()


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal the process group `proc` leads, unless Popen has reaped `proc`.

    A reaped leader's PID, and so its group's ID once its members are gone, is free for the
    kernel to give to any new process (pid_max is 32768 in many containers), and the signal
    would reach a stranger: another test run started with `setsid` gets SIGTERM. While `proc`
    is running or an unreaped zombie, its PID is its own.
    """
    with _unreaped(proc):
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)


def signal_leader(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal `proc` alone (a container runtime signals its PID 1), unless reaped; unlike
    Popen.send_signal, without reaping it first (its poll())."""
    with _unreaped(proc):
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)


def wait_unreaped(proc: subprocess.Popen[bytes], timeout: float | None = None) -> bool:
    """Wait until `proc` exits (True) or `timeout` passes (False), leaving it unreaped: a
    zombie keeps its PID, and so its group's ID, so `signal_group` still reaches the group's
    other processes; the one thread that reaps calls `proc.wait()` after."""
    if timeout is None:
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        return True
    until = time.monotonic() + timeout
    while exited(proc) is None:
        if time.monotonic() >= until:
            return False
        time.sleep(0.05)
    return True


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


def free_ports(n: int) -> list[int]:
    """`n` local ports free now (bound and released at once), for worker processes."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports
