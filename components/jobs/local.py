"""Run a `JobSpec` as worker processes on this machine, the way the TFJob operator would.

Each worker gets TF_CONFIG exactly as the operator writes it for Worker replicas, with the
cluster on free localhost ports (fresh ones for every attempt, since a killed worker's port can
linger in TIME_WAIT). As with the operator, a one-worker job gets no TF_CONFIG.

Restarts follow `restart_policy` (ExitCode: codes >= 128, or death by a signal, which Kubernetes
reports as 128 + signal number, are retryable; 1-127 are permanent). Unlike the operator, which
recreates only the failed pod, a retryable exit restarts ALL workers: the collective ops of
MultiWorkerMirroredStrategy cannot take back one worker, and the survivors would hang or fail.
The whole group is restarted at most `backoff_limit` times; `active_deadline_seconds` bounds the
whole job. Worker 0's output goes to our stdout with a prefix, while someone reads it (`Echo`);
every worker's output is kept in `<log_dir>/attempt-<n>/worker-<i>.log`. Each worker's
termination-message file is `worker-<i>.termination-log` beside it (contracts/termination.py):
a worker that exits 2 having written there that it stopped on a mistake in its input (a bad
config, damaged Examples), or 3 on a failure no restart can mend (a full disk), fails the job
with that message as its first line, so the train step's error names the input or the path,
and the fix. No worker outlives its attempt: each attempt's workers are started from a thread
of their own, and die with it (components/jobs/lifeline.py), even when the launcher is
SIGKILLed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TextIO

from components.jobs.cancel import cancel_on_sigterm
from components.jobs.errors import (
    LaunchError,
    LaunchTimeout,
    format_failure,
    told,
    told_error,
)
from components.jobs.launcher import LaunchResult
from components.jobs.lifeline import Lifeline, die_with_parent
from components.jobs.spec import JobSpec, is_retryable_exit_code
from contracts.process import running_processes
from contracts.termination import WORKER_MESSAGE_ENV, read

POLL_SECONDS = 0.05  # how often the workers' exit status is checked


def tf_config(ports: Sequence[int], index: int) -> str:
    """TF_CONFIG for worker `index` of a Worker-only cluster, as the TFJob operator writes it."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    return json.dumps(
        {"cluster": cluster, "task": {"type": "worker", "index": index}, "environment": "cloud"}
    )


def exit_code_of(returncode: int) -> int:
    """A Popen return code in Kubernetes terms: death by signal N is exit code 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def free_ports(count: int, exclude: set[int]) -> list[int]:
    """`count` distinct localhost ports that are free now and not in `exclude`."""
    ports: list[int] = []
    with contextlib.ExitStack() as stack:
        while len(ports) < count:
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            if port not in exclude and port not in ports:
                ports.append(port)
    return ports


def tail_lines(path: Path, count: int) -> list[str]:
    """The last `count` lines of a text file (reads at most its last 64 KiB)."""
    if not path.exists():
        return []
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - 65536))
        text = f.read().decode("utf-8", errors="replace")
    return text.splitlines()[-count:]


_WAITID = hasattr(os, "waitid")  # not on macOS (CPython's posixmodule.c leaves it out there)


def exited(proc: subprocess.Popen[bytes]) -> int | None:
    """`proc`'s return code once it has exited (Popen's: -N for signal N), None while it runs,
    without reaping it.

    While an exited worker stays an unreaped zombie, its PID, and so its process group's ID,
    cannot be given to another process: `stop` can signal the group and reach only this
    worker's children. Reaped, the number is free, and `os.killpg` on it could reach a
    stranger's group (pid_max is 32768 in many containers). `stop` reaps the workers last.
    Python has no `os.waitid` on macOS: there this reaps (Popen.poll).
    """
    if proc.returncode is not None or not _WAITID:
        return proc.poll()
    try:
        found = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped already
        return proc.poll()
    if found is None:
        return None
    killed = found.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
    return -found.si_status if killed else found.si_status


def group_alive(pgid: int) -> bool:
    """True while a process of group `pgid` runs (zombies, already dead, do not count)."""
    proc = Path("/proc")
    if not proc.is_dir():  # no procfs (macOS): ask the kernel, zombies included
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    return any(pgrp == pgid for _parent, pgrp in running_processes().values())


class Echo:
    """Where the launcher shows its own lines and worker 0's: its output, until that is gone.

    A local run reads the train step's output through a pipe (components/runner_watch.py); a
    run killed outright closes it, and writes fail from then on. They are dropped: the logs
    keep every line, and neither the job nor worker 0 waits on a reader that left (the pump
    goes on reading worker 0's pipe, which would otherwise fill and block it).
    """

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.gone = False  # the output failed once: nothing more is written to it

    def line(self, text: str) -> None:
        if self.gone:
            return
        try:
            self.out.write(f"{text}\n")
            self.out.flush()
        except (OSError, ValueError):  # a pipe with no reader (EPIPE), a closed file
            self.gone = True


@dataclass(frozen=True)
class _Exit:
    """How an attempt ended: worker 0 succeeded, a worker failed, or the deadline passed."""

    kind: str  # "succeeded", "failed" or "deadline"
    index: int = -1  # the failing worker
    code: int = 0  # its exit code, in Kubernetes terms


class _WorkerGroup:
    """One attempt: N worker processes, each in its own process group, started from a
    `Lifeline` thread, so that none outlives the attempt, whatever ends it."""

    def __init__(self, spec: JobSpec, attempt_dir: Path, ports: Sequence[int], echo: Echo):
        self.spec, self.dir, self.echo = spec, attempt_dir, echo
        self.procs: list[subprocess.Popen[bytes]] = []
        self.files: list[IO[bytes]] = []
        self.pump: threading.Thread | None = None
        self.lifeline = Lifeline(f"{spec.name}-workers")
        self._stopping = threading.Event()
        attempt_dir.mkdir(parents=True, exist_ok=True)
        base = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        envs = []
        for index in range(spec.workers):
            env = {**base, "PYTHONUNBUFFERED": "1", **spec.env}
            if spec.workers > 1:
                env["TF_CONFIG"] = tf_config(ports, index)
            env[WORKER_MESSAGE_ENV] = str(self.message_path(index))
            envs.append(env)
        try:
            self.lifeline.submit(lambda: self._start_all(envs)).result()
        except BaseException:
            self.stop(grace=0)  # a worker that could not start must not strand the others
            raise

    def log_path(self, index: int) -> Path:
        return self.dir / f"worker-{index}.log"

    def message_path(self, index: int) -> Path:
        """Worker `index`'s termination-message file (its TFJob container's
        terminationMessagePath), which it writes when it stops on a bad input."""
        return self.dir / f"worker-{index}.termination-log"

    def _start_all(self, envs: Sequence[Mapping[str, str]]) -> None:
        """Start the workers, in the lifeline's thread; stop starting once told to stop."""
        for index, env in enumerate(envs):
            if self._stopping.is_set():
                return
            self._start(index, env)

    def _start(self, index: int, env: Mapping[str, str]) -> None:
        log_file = self.log_path(index).open("wb")
        self.files.append(log_file)
        proc = subprocess.Popen(
            list(self.spec.command),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if index == 0 else log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so children die with it
            preexec_fn=die_with_parent(os.getpid()),  # and it dies with the lifeline
        )
        self.procs.append(proc)
        if index == 0:
            self.pump = threading.Thread(target=self._pump, args=(proc, log_file), daemon=True)
            self.pump.start()

    def _pump(self, proc: subprocess.Popen[bytes], log_file: IO[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            log_file.write(raw)
            log_file.flush()
            self.echo.line(f"[worker-0] {raw.decode('utf-8', errors='replace').rstrip()}")

    def wait(self, deadline: float | None, grace: float) -> _Exit:
        """Wait until worker 0 succeeds, any worker fails, or the deadline passes."""
        while True:
            for index, proc in enumerate(self.procs):
                code = exited(proc)
                if code is not None and code != 0:
                    return _Exit("failed", index, exit_code_of(code))
            if exited(self.procs[0]) == 0:
                # The operator's default success policy: the job succeeds when worker 0 does;
                # the other workers get a moment to finish before they are stopped.
                self._wait_all(time.monotonic() + grace)
                return _Exit("succeeded")
            if deadline is not None and time.monotonic() >= deadline:
                return _Exit("deadline")
            time.sleep(POLL_SECONDS)

    def _wait_all(self, until: float) -> None:
        while time.monotonic() < until and any(exited(p) is None for p in self.procs):
            time.sleep(POLL_SECONDS)

    def stop(self, grace: float) -> None:
        """Stop every worker and its children (`stop_groups`), then close the logs.

        The workers still starting are let finish starting first (no fork is cut short), and
        stopped with the others; the lifeline is released last, killing anything left.
        """
        self._stopping.set()
        try:
            self.lifeline.drain()
            stop_groups(self.procs, grace)
        finally:
            self.lifeline.release()
            if self.pump is not None:
                self.pump.join(timeout=5)
            for f in self.files:
                f.close()


def stop_groups(procs: Sequence[subprocess.Popen[bytes]], grace: float) -> None:
    """SIGTERM the process group of each of `procs`, then SIGKILL what is left after `grace`.

    Returns once no process of any group runs: a worker's children (data loaders, shells)
    die with it, and nothing of it can hold its ports or files afterwards. The processes are
    reaped only then, so that each group's ID is still theirs when signalled (`exited`). On
    macOS a process that exited was reaped already: its group is signalled as before, since
    members still running keep the group's ID from other processes. A second Ctrl-C (or
    SIGTERM) during the grace period cuts it short: the groups are SIGKILLed and reaped all the
    same, and the interruption is raised after.
    """
    interrupted: BaseException | None = None
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for proc in procs:
            if proc.returncode is None or not _WAITID:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
        until = time.monotonic() + wait
        try:
            while time.monotonic() < until and any(group_alive(p.pid) for p in procs):
                time.sleep(POLL_SECONDS)
        except BaseException as exc:  # noqa: BLE001 -- raised below, once nothing is left
            interrupted = interrupted or exc
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1)
    if interrupted is not None:
        raise interrupted


class LocalLauncher:
    """Runs a `JobSpec` with local worker processes and the operator's restart semantics."""

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
        self.echo = Echo(self.out)
        self.kill_grace_seconds = kill_grace_seconds  # SIGTERM to SIGKILL, and success grace
        self.log_tail_lines = log_tail_lines

    def run(self, spec: JobSpec, *, timeout_seconds: float | None = None) -> LaunchResult:
        """Run the workers to success; raise `LaunchError` (or a subclass) if the job fails.

        The job's deadline is the smaller of `spec.active_deadline_seconds` and
        `timeout_seconds`. SIGTERM and KeyboardInterrupt stop every worker before propagating.
        """
        log_dir = self.log_dir or Path(tempfile.mkdtemp(prefix=f"gptpipe-{spec.name}-"))
        started = time.monotonic()
        limits = [t for t in (spec.active_deadline_seconds, timeout_seconds) if t is not None]
        deadline = started + min(limits) if limits else None
        used_ports: set[int] = set()
        restarts = 0
        with cancel_on_sigterm():
            while True:
                attempt = restarts + 1
                ports = free_ports(spec.workers, used_ports)
                used_ports.update(ports)
                self._say(f"attempt {attempt}: {spec.workers} workers, logs in {log_dir}")
                group = _WorkerGroup(spec, log_dir / f"attempt-{attempt}", ports, self.echo)
                try:
                    ended = group.wait(deadline, self.kill_grace_seconds)
                finally:
                    group.stop(self.kill_grace_seconds)
                if ended.kind == "succeeded":
                    break
                if ended.kind == "deadline":
                    raise self._deadline_error(spec, group)
                ended = self._cause(group, ended)
                retryable = self._retryable(spec, ended.code)
                if not retryable or restarts >= spec.backoff_limit:
                    raise self._failure(spec, group, ended, retryable, restarts)
                restarts += 1
                self._say(
                    f"worker-{ended.index} exited with retryable code {ended.code}; restarting "
                    f"all workers ({restarts}/{spec.backoff_limit})"
                )
        wall = time.monotonic() - started
        self._say(f"succeeded in {wall:.1f} s after {attempt} attempt(s)")
        if self.log_dir is None:  # our own temporary logs: kept only when the job fails
            shutil.rmtree(log_dir, ignore_errors=True)
        return LaunchResult(
            launcher="local",
            job_name=spec.name,
            workers=spec.workers,
            attempts=attempt,
            restarts=restarts,
            wall_seconds=wall,
            gpu_hours=0.0,
        )

    @staticmethod
    def _cause(group: _WorkerGroup, seen: _Exit) -> _Exit:
        """The worker that failed the attempt: one that said why it stopped (exit 2 or 3 with
        its termination record), whichever exit was seen first, since its peers exit 143 as
        soon as they lose it; else the exit seen first."""
        for index, proc in enumerate(group.procs):
            if proc.returncode is None:  # not reaped: still running after the stop
                continue
            code = exit_code_of(proc.returncode)
            if told(code, read(str(group.message_path(index)))):
                return _Exit("failed", index, code)
        return seen

    @staticmethod
    def _retryable(spec: JobSpec, code: int) -> bool:
        if spec.restart_policy == "ExitCode":
            return is_retryable_exit_code(code)
        return spec.restart_policy == "OnFailure"

    def _show_other_tails(self, group: _WorkerGroup, skip: int) -> None:
        for index in range(1, group.spec.workers):
            if index != skip:
                lines = tail_lines(group.log_path(index), self.log_tail_lines)
                self._say(f"last lines of worker-{index} ({group.log_path(index)}):")
                for line in lines:
                    self.echo.line(f"[worker-{index}] {line}")

    def _failure(
        self, spec: JobSpec, group: _WorkerGroup, ended: _Exit, retryable: bool, restarts: int
    ) -> LaunchError:
        self._show_other_tails(group, skip=ended.index)
        tail = tail_lines(group.log_path(ended.index), self.log_tail_lines)
        replica = f"worker-{ended.index}"
        said = read(str(group.message_path(ended.index)))  # what it wrote when it stopped
        if retryable:
            reason = "BackoffLimitExceeded"
            head = (
                f"job {spec.name} failed: worker-{ended.index} exited with retryable code "
                f"{ended.code} after {restarts} restarts (backoff_limit={spec.backoff_limit})"
            )
        elif error := told_error(spec, f"job {spec.name}", replica, ended.code, said, tail):
            return error
        else:
            reason = "WorkerFailed"
            head = (
                f"job {spec.name} failed: worker-{ended.index} exited with code {ended.code}, "
                f"a permanent error under restart_policy={spec.restart_policy}"
            )
        return LaunchError(
            format_failure(head, replica, ended.code, tail),
            reason=reason,
            job_name=spec.name,
            replica=replica,
            exit_code=ended.code,
            log_tail=tail,
        )

    def _deadline_error(self, spec: JobSpec, group: _WorkerGroup) -> LaunchTimeout:
        self._show_other_tails(group, skip=0)
        tail = tail_lines(group.log_path(0), self.log_tail_lines)
        limit = spec.active_deadline_seconds
        return LaunchTimeout(
            format_failure(
                f"job {spec.name} ran past its deadline ({limit} s); stopped all workers",
                None,
                None,
                tail,
            ),
            reason="DeadlineExceeded",
            job_name=spec.name,
            log_tail=tail,
        )

    def _say(self, message: str) -> None:
        self.echo.line(f"[local] {message}")
