"""Local workers that die with what started them: a parent-death signal, armed before exec.

A local worker runs in a session of its own (the launcher stops its whole group), so no
terminal signal and no death of the launcher reaches it by itself. A launcher killed with
SIGKILL, or one that lost track of a worker (a signal between the fork and the bookkeeping),
would leave it running, re-parented to init; a MultiWorkerMirroredStrategy worker waiting in
the collective rendezvous for a peer that never comes then waits forever, and deaf to SIGTERM,
whose Python handler only runs when the blocked C++ call returns.

So each worker is started with Linux's parent-death signal: `prctl(PR_SET_PDEATHSIG, SIGKILL)`
in the child, between fork and exec (Popen's `preexec_fn`), kept across the exec. prctl(2)
fires it when the *thread* that forked the child ends, not the process: a `Lifeline` is that
thread, kept for exactly as long as its workers should live. When it is released, or when the
whole launcher dies (SIGKILL ends every thread), the kernel SIGKILLs whatever it started and
nobody stopped. SIGKILL, not SIGTERM: the worker may be in the rendezvous. A child whose parent
died before the signal was armed finds itself re-parented and kills itself.

The launcher itself, in a local run's step, ends with the run that started the step
(components/runner_watch.py): a `gptpipe run --local` killed outright takes the workers too.

Only the worker process itself is covered: its own children die with it when the launcher
stops its group (components/jobs/local.py `stop_groups`); the trainer starts none. Outside Linux
there is no parent-death signal, and only that stop applies.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _prctl() -> Any:
    """libc's prctl, looked up once, before any fork (the child only calls it)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()
_KILL = int(signal.SIGKILL)


def die_with_parent(parent: int) -> Callable[[], None] | None:
    """A `preexec_fn` that arms SIGKILL on the death of the thread that forks the child; None
    where the kernel has none. `parent` is the forking process's PID (`os.getpid()`).

    The child runs it between fork and exec, where only async-signal-safe work is safe: it
    calls a function looked up before the fork, compares two integers and may kill itself.
    """
    prctl = _PRCTL
    if prctl is None:
        return None

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, _KILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), _KILL)

    return arm


class Lifeline:
    """One thread that starts processes, and lives until `release`: what it started and left
    running dies with it (the parent-death signal of `die_with_parent`).

    The calls run in that thread, so a signal the main thread takes (Ctrl-C, the launcher's
    SIGTERM) never falls between a fork and the caller's note of the new process.
    """

    def __init__(self, name: str) -> None:
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name)

    def submit(self, start: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run `start` in the lifeline's thread."""
        return self._thread.submit(start)

    def drain(self) -> None:
        """Wait until everything submitted so far has run."""
        self._thread.submit(lambda: None).result()

    def release(self) -> None:
        """Let the thread end once what was submitted has run: anything it started that still
        runs is killed now."""
        self._thread.shutdown(wait=True, cancel_futures=True)
