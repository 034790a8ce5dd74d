"""How a gptpipe process starts and ends: without a notice it cannot act on, quickly, with its
own status.

The `pipelines` and `components` packages call `hide_python_eol_notice` as they are imported,
before anything imports google-cloud-storage. Every pipeline step's process
(components/step_edge.py) and every trainer worker (trainer/task.py) registers
`exit_without_final_gc` as it starts.

Processes and signals, from /proc and in one place: `running`, `running_processes` and
`descendants` (the local launcher's worker groups, a local run's steps), and `signal_handlers`
(a local run's, the train launcher's).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import os
import signal
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import Any


def stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat's fields from the third (the state) on: those after the process's name,
    which may hold spaces and ")". OSError if there is no such process (or no /proc)."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
        return f.read().rsplit(")", 1)[1].split()


def running(pid: int) -> bool:
    """True if `pid` runs (a zombie, which only waits for its parent to reap it, does not)."""
    try:
        return stat_fields(pid)[0] != "Z"
    except (OSError, IndexError):
        return False


def running_processes() -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, process group)} of every running (not zombie) process, from /proc;
    {} where there is no /proc."""
    found: dict[int, tuple[int, int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                state, parent, pgrp = stat_fields(int(entry.name))[:3]
            except (OSError, ValueError):
                continue  # ended while listed
            if state != "Z":
                found[int(entry.name)] = (int(parent), int(pgrp))
    return found


def descendants(pid: int, group: int | None = None) -> list[int]:
    """The running processes below `pid` (children, theirs, ...), only those in process group
    `group` if given; [] where there is no /proc."""
    parents = running_processes()
    found, below = [], {pid}
    while below:
        below = {p for p, (parent, _) in parents.items() if parent in below}
        found += [p for p in below if group is None or parents[p][1] == group]
    return sorted(found)


def ignored(sig: signal.Signals) -> bool:
    """True if this process ignores `sig` (`nohup`'s SIGHUP, a background job's SIGINT) or a
    handler outside Python has it: either way, not Python's to take."""
    return signal.getsignal(sig) in (signal.SIG_IGN, None)


@contextlib.contextmanager
def signal_handlers(handlers: Mapping[signal.Signals, Any]) -> Iterator[None]:
    """Install `handlers` while the block runs and give each signal its handler back after;
    only in the main thread, where Python takes signals (elsewhere this installs nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in handlers}
    try:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def raise_on_stop(error: Callable[[str], BaseException]) -> Iterator[None]:
    """Turn the first SIGTERM (or SIGHUP) into `error(message)` in the main thread while the
    block runs, so that what is under way ends as by an exception: cleaned up and recorded.

    Kubernetes stops a cancelled run's pod with SIGTERM, then SIGKILL after the grace period; a
    closed terminal sends a local run's process group SIGHUP. Later signals are ignored, so
    that the cleanup is not cut short; a SIGHUP already ignored (`nohup`) stays ignored.
    Outside the main thread (where Python cannot install handlers) this does nothing.
    """
    fired = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal fired
        if fired:
            return
        fired = True
        stop = error(f"received {signal.Signals(signum).name}: the run was cancelled")
        _PENDING.append(stop)
        raise stop

    signals = [signal.SIGTERM] + ([] if ignored(signal.SIGHUP) else [signal.SIGHUP])
    depth = len(_PENDING)
    try:
        with signal_handlers(dict.fromkeys(signals, handler)):
            yield
    finally:
        del _PENDING[depth:]


# The stops `raise_on_stop` raised whose blocks are still running, innermost last.
_PENDING: list[BaseException] = []


def pending_stop() -> BaseException | None:
    """The stop `raise_on_stop` raised, if its block still runs: for code whose callee swallows
    exceptions (a C++ library calling back into Python, such as SentencePiece's trainer reading
    its sentences) to raise it again rather than report the callee's own error."""
    return _PENDING[-1] if _PENDING else None


def hide_python_eol_notice() -> None:
    """Hide google-api-core's FutureWarning that Python 3.11 reaches its end of life in 2027-10.

    google-cloud-storage imports google-api-core, which warns at import: on every `gptpipe`
    command and at the top of every step's log. The stack pins Python 3.11 (TensorFlow 2.19
    with ml-metadata 1.17.1, README "Stack"), so it asks nothing a gptpipe user can do. Only
    that module's FutureWarning is hidden; every other warning still shows.
    """
    warnings.filterwarnings(
        "ignore", category=FutureWarning, module=r"google\.api_core\._python_version_support"
    )


@functools.cache  # once per process
def exit_without_final_gc() -> None:
    """Freeze the garbage collector's objects at exit, so that the interpreter's shutdown skips
    collecting them: with TensorFlow loaded, those collections are a measurable part of each
    step's wall time (docs/benchmarks.md, orchestration overhead). The exit status, atexit
    handlers and flushes are unchanged; the memory goes back to the system with the process."""
    atexit.register(gc.freeze)
