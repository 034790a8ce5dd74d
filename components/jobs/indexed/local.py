"""Run an `IndexedJobSpec` as processes on this machine, the way Kubernetes runs an Indexed Job.

Every index 0..completions-1 runs the command once, at most `parallelism` at a time, lowest
pending index first, with `JOB_COMPLETION_INDEX` set to it. As the Job's manifest says
(indexed/manifest.py): a part that exits `INPUT_ERROR_EXIT` fails the whole job at once (its
termination record's message, when it wrote one, is the error's first line) and the other
parts are stopped; any other failure (an exit code, a signal: 128 + N) runs that index again,
at once rather than after Kubernetes' backoff, up to `backoff_limit_per_index` times, after
which the index is failed and the job fails once every index has ended. Each run of index i
keeps its output in `<log_dir>/index-<i>/attempt-<n>.log` and its termination-message file
(`WORKER_MESSAGE_ENV`) beside it. SIGTERM (a cancelled run) and the deadline stop every part
and its children (components/jobs/local.py `stop_groups`); a launcher killed outright takes its
parts with it (their parent-death signal, components/jobs/lifeline.py).
"""

from __future__ import annotations

import bisect
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TextIO

from components.jobs.cancel import cancel_on_sigterm
from components.jobs.errors import LaunchError, LaunchTimeout, format_failure, told_error
from components.jobs.indexed.launcher import IndexedResult
from components.jobs.indexed.spec import INDEX_ENV, IndexedJobSpec
from components.jobs.indexed.status import format_indexes
from components.jobs.lifeline import die_with_parent
from components.jobs.local import (
    POLL_SECONDS,
    Echo,
    exit_code_of,
    exited,
    stop_groups,
    tail_lines,
)
from contracts.termination import INPUT_ERROR_EXIT, WORKER_MESSAGE_ENV, read


@dataclass
class _Run:
    """One run of one index: its process, log and termination-message file."""

    index: int
    attempt: int
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    log_path: Path
    message_path: Path


class LocalIndexedLauncher:
    """Runs an `IndexedJobSpec` as local processes with the Indexed Job's semantics."""

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None = None,
        out: TextIO | None = None,
        *,
        kill_grace_seconds: float = 10.0,
        log_tail_lines: int = 30,
    ) -> None:
        self.log_dir = Path(log_dir) if log_dir else None
        self.out = out if out is not None else sys.stdout
        self.echo = Echo(self.out)  # dropped once nobody reads it: the job goes on regardless
        self.kill_grace_seconds = kill_grace_seconds  # SIGTERM to SIGKILL
        self.log_tail_lines = log_tail_lines

    def run(self, spec: IndexedJobSpec, *, timeout_seconds: float | None = None) -> IndexedResult:
        """Run every index to success; raise `LaunchError` (or a subclass) if the job fails.

        The deadline is the smaller of `spec.active_deadline_seconds` and `timeout_seconds`.
        SIGTERM and KeyboardInterrupt stop every part before propagating.
        """
        log_dir = self.log_dir or Path(tempfile.mkdtemp(prefix=f"gptpipe-{spec.name}-"))
        started = time.monotonic()
        limits = [t for t in (spec.active_deadline_seconds, timeout_seconds) if t is not None]
        deadline = started + min(limits) if limits else None
        self._say(
            f"job {spec.name}: {spec.completions} parts, {spec.parallelism} at a time, "
            f"logs in {log_dir}"
        )
        parts = _Parts(spec, log_dir, self.out)
        with cancel_on_sigterm():
            try:
                self._until_done(parts, deadline)
            finally:
                parts.stop(self.kill_grace_seconds)
        if parts.failed:
            raise self._failed_indexes(parts)
        wall = time.monotonic() - started
        self._say(f"succeeded in {wall:.1f} s after {parts.retries} retries")
        if self.log_dir is None:  # our own temporary logs: kept only when the job fails
            shutil.rmtree(log_dir, ignore_errors=True)
        return IndexedResult("local", spec.name, spec.completions, wall, parts.retries)

    def _until_done(self, parts: _Parts, deadline: float | None) -> None:
        """Start and follow parts until every index succeeded or failed; raise on bad input
        or the deadline."""
        spec = parts.spec
        while not parts.done():
            parts.start_pending()
            for run, code in parts.ended():
                if code == 0:
                    parts.succeeded.add(run.index)
                elif code == INPUT_ERROR_EXIT:  # the manifest's FailJob rule
                    raise self._bad_input(parts, run, code)
                elif run.attempt > spec.backoff_limit_per_index:
                    parts.failed[run.index] = (run, code)
                    self._say(f"index {run.index} failed: exit code {code}, no retries left")
                else:
                    parts.retries += 1
                    bisect.insort(parts.pending, run.index)  # lowest pending index first
                    self._say(
                        f"index {run.index} exited with code {code}; running it again "
                        f"({run.attempt}/{spec.backoff_limit_per_index})"
                    )
            if deadline is not None and time.monotonic() >= deadline:
                raise self._deadline_error(spec)
            time.sleep(POLL_SECONDS)

    def _tail(self, run: _Run) -> list[str]:
        return tail_lines(run.log_path, self.log_tail_lines)

    def _bad_input(self, parts: _Parts, run: _Run, code: int) -> LaunchError:
        spec, tail = parts.spec, self._tail(run)
        replica = f"index-{run.index}"
        said = read(str(run.message_path))
        if told := told_error(spec, f"job {spec.name}", replica, code, said, tail):
            return told
        head = (
            f"job {spec.name} failed: index {run.index} exited with code {code} (bad input), "
            "and wrote no termination record saying which"
        )
        return LaunchError(
            format_failure(head, replica, code, tail),
            reason="PodFailurePolicy",
            job_name=spec.name,
            replica=replica,
            exit_code=code,
            log_tail=tail,
        )

    def _failed_indexes(self, parts: _Parts) -> LaunchError:
        spec = parts.spec
        first = min(parts.failed)
        run, code = parts.failed[first]
        tail = self._tail(run)
        head = (
            f"job {spec.name} failed: indexes {format_indexes(parts.failed)} failed after "
            f"{spec.backoff_limit_per_index} retries each (backoff_limit_per_index); "
            f"{len(parts.succeeded)} of {spec.completions} succeeded"
        )
        return LaunchError(
            format_failure(head, f"index-{first}", code, tail),
            reason="FailedIndexes",
            job_name=spec.name,
            replica=f"index-{first}",
            exit_code=code,
            log_tail=tail,
        )

    @staticmethod
    def _deadline_error(spec: IndexedJobSpec) -> LaunchTimeout:
        return LaunchTimeout(
            f"job {spec.name} ran past its deadline; stopped all parts",
            reason="DeadlineExceeded",
            job_name=spec.name,
        )

    def _say(self, message: str) -> None:
        self.echo.line(f"[local] {message}")


class _Parts:
    """The indexes of one job: pending, running, succeeded and failed, and their processes."""

    def __init__(self, spec: IndexedJobSpec, log_dir: Path, out: TextIO) -> None:
        self.spec, self.log_dir, self.out = spec, log_dir, out
        self.pending = list(range(spec.completions))  # lowest first, as the Job controller
        self.running: list[_Run] = []
        self.succeeded: set[int] = set()
        self.failed: dict[int, tuple[_Run, int]] = {}  # index -> its last run and exit code
        self.attempts: dict[int, int] = {}
        self.retries = 0
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1", **spec.env}

    def done(self) -> bool:
        return len(self.succeeded) + len(self.failed) == self.spec.completions

    def start_pending(self) -> None:
        while self.pending and len(self.running) < self.spec.parallelism:
            self._start(self.pending.pop(0))

    def _start(self, index: int) -> None:
        attempt = self.attempts[index] = self.attempts.get(index, 0) + 1
        folder = self.log_dir / f"index-{index}"
        folder.mkdir(parents=True, exist_ok=True)
        log_path = folder / f"attempt-{attempt}.log"
        message_path = folder / f"attempt-{attempt}.termination-log"
        env = {**self._env, INDEX_ENV: str(index), WORKER_MESSAGE_ENV: str(message_path)}
        log = log_path.open("wb")
        try:
            proc = subprocess.Popen(
                list(self.spec.command),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, so children die with it
                preexec_fn=die_with_parent(os.getpid()),  # and it dies with this launcher
            )
        except BaseException:
            log.close()
            raise
        self.running.append(_Run(index, attempt, proc, log, log_path, message_path))

    def ended(self) -> list[tuple[_Run, int]]:
        """The runs that exited since the last call, with their exit codes (Kubernetes': a
        signal N is 128 + N). Each one's process group goes with it, as a container's
        processes go with its PID 1, and the process is reaped."""
        ended = []
        for run in list(self.running):
            code = exited(run.proc)
            if code is None:
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(run.proc.pid, signal.SIGKILL)  # a zombie still holds the group's id
            run.proc.wait()
            run.log.close()
            self.running.remove(run)
            ended.append((run, exit_code_of(code)))
        return ended

    def stop(self, grace: float) -> None:
        """Stop every running part and its children; close their logs."""
        try:
            stop_groups([run.proc for run in self.running], grace)
        finally:
            for run in self.running:
                run.log.close()
            self.running.clear()
