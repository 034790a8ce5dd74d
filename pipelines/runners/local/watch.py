"""Watching a local run: its output into log files, its view on the terminal, how it ended.

`watch` runs the pipeline (`runner.run_local`) with everything it prints sent to
`<state>/logs/<run id>/kfp-local.log` (`runner.captured_output`), while a `Watcher`
thread polls that log, the steps' progress events and ML Metadata (read-only) into a
`view.RunView`, cuts the log into one file per step, and shows the view: live on a
terminal (`rich.live.Live`), as plain lines elsewhere, as kfp.local's whole output
(verbose), or not at all. The `Outcome` it returns is what `gptpipe run --local` reports at the
end, as a table, one line (`outcome_line`) or JSON (`outcome_json`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TextIO

from rich.console import Console
from rich.live import Live

from components import lineage
from contracts import progress
from pipelines.runners.local import runner
from pipelines.runners.local.view import (
    FAILED,
    PlainLines,
    RunView,
    apply_event,
    apply_kfp_line,
    apply_lineage,
    clock,
    finish,
    parse_kfp_line,
    render,
    without_colours,
)

# How a run is shown: AUTO is LIVE on a terminal and PLAIN lines elsewhere; QUIET and JSON
# show nothing while it runs; VERBOSE streams kfp.local's whole output instead.
AUTO, LIVE, PLAIN, QUIET, JSON, VERBOSE = "auto", "live", "plain", "quiet", "json", "verbose"

POLL_S = 0.25  # how often the log and the events are read (and a live view redrawn)
LINEAGE_POLL_S = 2.0  # how often ML Metadata is read while the run runs


class Watcher:
    """Polls a run's kfp.local log, progress events and lineage into its `RunView`, cuts the
    log into one file per step, and hands the view to `show` after each poll.

    `echo` (verbose) also gets kfp.local's output as it is, as it comes.
    """

    def __init__(
        self,
        view: RunView,
        logs: runner.RunLogs,
        metadata: str,
        show: Callable[[RunView, float], None],
        echo: TextIO | None = None,
    ) -> None:
        self.view, self.logs, self.metadata, self.show, self.echo = view, logs, metadata, show, echo
        # A store that does not exist yet is created by the first step: read only after a
        # step has reported (its lineage record is open by then), never while it is made.
        self._store_ready = Path(metadata).exists()
        self._log_offset = self._events_offset = 0
        self._partial = b""
        self._task = ""  # the task whose output kfp.local prints now
        self._step_logs: dict[str, IO[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="run-view", daemon=True)
        self._absl_level = logging.getLogger("absl").level

    def start(self) -> None:
        # MLMD logs each connection at INFO; kfp.local raises the root logger to INFO while
        # a task runs, which would put a line in the run's log at every lineage poll.
        logging.getLogger("absl").setLevel(logging.WARNING)
        self._thread.start()

    def stop(self, succeeded: bool, failed_step: str | None = None) -> None:
        """Read everything left, end the view, show it a last time, close the step logs."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()
        try:
            self.poll(time.time(), with_lineage=True)
        finally:
            finish(self.view, succeeded, time.time(), failed_step)
            self.show(self.view, time.time())
            for file in self._step_logs.values():
                file.close()
            logging.getLogger("absl").setLevel(self._absl_level)

    def poll(self, now: float, with_lineage: bool) -> None:
        self._read_kfp_log()
        for event in self._read_events():
            apply_event(self.view, event)
            self._store_ready = True
        if with_lineage and self._store_ready:
            with contextlib.suppress(Exception):  # not recorded yet, or locked a moment
                summary = lineage.run_summary(self.metadata, self.view.run_id)
                apply_lineage(self.view, summary["steps"], now)

    def _loop(self) -> None:
        lineage_read = 0.0
        while not self._stop.wait(POLL_S):
            now = time.time()
            with_lineage = now - lineage_read >= LINEAGE_POLL_S
            lineage_read = now if with_lineage else lineage_read
            try:
                self.poll(now, with_lineage)
                self.show(self.view, now)
            except Exception as err:  # noqa: BLE001 -- the view must never stop the run
                # sys.stderr is the run's log while its output is captured.
                print(f"gptpipe run view: {type(err).__name__}: {err}", file=sys.stderr)

    def _read_events(self) -> list[dict[str, Any]]:
        path = str(self.logs.events)
        found, self._events_offset = progress.read_events(path, self._events_offset)
        return found

    def _read_kfp_log(self) -> None:
        try:
            with open(self.logs.kfp_local, "rb") as f:
                f.seek(self._log_offset)
                data = f.read()
        except FileNotFoundError:
            return
        self._log_offset += len(data)
        data = self._partial + data
        end = data.rfind(b"\n") + 1
        self._partial = data[end:]
        now = time.time()
        for whole in data[:end].split(b"\n")[:-1]:
            raw = whole.decode("utf-8", errors="replace")
            if self.echo is not None:
                self.echo.write(raw + "\n")
            line = parse_kfp_line(raw, now)
            apply_kfp_line(self.view, line)
            self._store_ready = self._store_ready or bool(line.ends)
            self._task = line.starts or ("" if line.pipeline_ends else self._task)
            if self._task:
                self._step_log(self._task).write(_unindent(line.text) + "\n")
        if self.echo is not None:
            self.echo.flush()
        for file in self._step_logs.values():
            file.flush()

    def _step_log(self, task: str) -> IO[str]:
        if task not in self._step_logs:
            self._step_logs[task] = open(  # noqa: SIM115 -- closed by stop()
                self.logs.step(task), "a", encoding="utf-8"
            )
        return self._step_logs[task]


def _unindent(text: str) -> str:
    """A step's own line as it printed it: kfp.local indents streamed output by 4 spaces."""
    return text[4:] if text.startswith("    ") else text


INTERRUPTED = "interrupted"  # the PipelineFailed message of a run Ctrl-C or a signal ended


@dataclass
class Outcome:
    """How a watched run ended."""

    view: RunView  # every step's final state and duration
    logs: runner.RunLogs
    summary: dict[str, Any] | None  # lineage's run summary (a failed run's may be partial)
    failure: runner.PipelineFailed | None  # None when the run succeeded

    @property
    def failed_step(self) -> str | None:
        """The step that failed: lineage's, else the one the view saw fail or stop."""
        if self.failure is None:
            return None
        failed = [s.name for s in self.view.steps.values() if s.state == FAILED]
        return self.failure.step or (failed[0] if failed else None)

    @property
    def interrupted(self) -> bool:
        """True when Ctrl-C, SIGTERM or SIGHUP ended the run."""
        return self.failure is not None and str(self.failure) == INTERRUPTED

    @property
    def error(self) -> str:
        """The failure in one line: its first, the summary (a launcher's error goes on with the
        failing worker's log tail, which the step's log keeps)."""
        if self.failure is None:
            return ""
        error = without_colours(self.failure.error).strip().splitlines()
        return error[0] if error else "no error recorded"

    def log_of(self, step: str | None) -> Path:
        """A step's log, or the whole kfp.local log where there is none."""
        path = self.logs.step(step) if step else None
        return path if path is not None and path.is_file() else self.logs.kfp_local


def watch(run: runner.LocalRun, mode: str = AUTO) -> Outcome:
    """Run the pipeline locally with its output in log files, showing it in `mode`.

    Nothing is created before the run's inputs are checked (`runner.preflight`).
    """
    runner.preflight(run)
    run_id = runner.new_run_id()
    logs = runner.run_logs(run, run_id)
    logs.folder.mkdir(parents=True, exist_ok=True)
    view = RunView.new(run_id, time.time())
    summary: dict[str, Any] | None = None
    failure: runner.PipelineFailed | None = None
    with runner.captured_output(logs.kfp_local) as terminal, _shown(mode, terminal) as show:
        watcher = Watcher(view, logs, run.metadata, show, terminal if mode == VERBOSE else None)
        watcher.start()
        succeeded = False
        try:
            summary = runner.run_local(run, run_id=run_id, progress_file=logs.events)
            succeeded = True
        except runner.PipelineFailed as err:
            failure = err
        except KeyboardInterrupt as err:  # the step got the Ctrl-C too (or run_local's
            # SIGTERM), and has stopped
            how = str(err) or "Ctrl-C"
            failure = runner.PipelineFailed(INTERRUPTED, None, f"interrupted ({how})")
        finally:
            watcher.stop(succeeded, failure.step if failure else None)
        if failure is not None:
            with contextlib.suppress(Exception):  # a run that failed before lineage has none
                summary = lineage.run_summary(run.metadata, run_id)
    return Outcome(view, logs, summary, failure)


@contextlib.contextmanager
def _shown(mode: str, terminal: TextIO) -> Iterator[Callable[[RunView, float], None]]:
    """Yield show(view, now) for `mode` on `terminal`."""
    if mode not in (AUTO, LIVE, PLAIN):
        yield lambda view, now: None
        return
    console = Console(file=terminal, width=_width(terminal))
    if mode == PLAIN or not console.is_terminal:
        plain = PlainLines()

        def say(view: RunView, now: float) -> None:
            for line in plain.lines(view, now):
                console.print(line, markup=False, highlight=False, soft_wrap=True)

        yield say
        return
    with Live(
        console=console,
        auto_refresh=False,
        redirect_stdout=False,  # stdout goes to the run's log, not above the view
        redirect_stderr=False,
        transient=False,  # the last frame stays on screen
    ) as live:
        yield lambda view, now: live.update(render(view, now), refresh=True)


def _width(terminal: TextIO) -> int | None:
    """The terminal's width (rich would ask fds 0-2, which point at the log meanwhile)."""
    try:
        return os.get_terminal_size(terminal.fileno()).columns
    except (OSError, ValueError, io.UnsupportedOperation):
        return None


# ---- what a run ends with -------------------------------------------------------------------


def step_output(summary: dict[str, Any] | None, step: str, key: str) -> dict[str, Any]:
    """The properties of a step's first output `key` in lineage's run summary, or {}."""
    found = (summary or {}).get("steps", {}).get(step, {}).get("outputs", {}).get(key, [])
    return dict(found[0]["properties"]) if found else {}


def outcome_json(outcome: Outcome) -> dict[str, Any]:
    """The run for scripts and CI: states, durations, the numbers that matter, log paths."""
    view, summary = outcome.view, outcome.summary or {}
    numbers = step_output(summary, "evaluate", "evaluation")
    blessing = step_output(summary, "evaluate", "blessing")
    pushed = step_output(summary, "push", "pushed_model")
    failure = outcome.failure
    return {
        "run_id": view.run_id,
        "state": "succeeded" if failure is None else "failed",
        "error": None
        if failure is None
        else {
            "step": outcome.failed_step,
            "message": outcome.error,
            "log": str(outcome.log_of(outcome.failed_step)),
        },
        "steps": {
            step.name: {
                "state": step.state,
                "duration_s": _rounded(step.duration(view.ended or time.time())),
                "log": str(outcome.log_of(step.name)),
            }
            for step in view.steps.values()
        },
        "duration_s": _rounded((view.ended or time.time()) - view.started),
        "dataset_version": summary.get("dataset_version"),
        "eval_nats_per_char": _finite_or_text(numbers.get("eval_nats_per_char")),
        "blessed": bool(blessing["blessed"]) if "blessed" in blessing else None,
        "blessing_reason": blessing.get("reason"),
        "pushed_version": pushed.get("pushed_version") or None,
        "pushed_to": _pushed_to(pushed),
        "logs": log_paths(outcome),
    }


def _finite_or_text(value: Any) -> Any:
    """A number strict JSON can hold: NaN and infinities as the text lineage keeps them as."""
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def _pushed_to(pushed: dict[str, Any]) -> str | None:
    if not pushed.get("pushed"):
        return None
    return f"{pushed['pushed_destination'].rstrip('/')}/{pushed['pushed_version']}"


def log_paths(outcome: Outcome) -> dict[str, str]:
    """Where the run's logs are: kfp.local's whole output, its folder, the workers' logs."""
    paths = {"kfp_local": str(outcome.logs.kfp_local), "folder": str(outcome.logs.folder)}
    if outcome.logs.workers.is_dir():
        paths["workers"] = str(outcome.logs.workers)
    return paths


def outcome_line(outcome: Outcome) -> str:
    """A successful run in one line (`--quiet`): its eval loss, blessing and push."""
    facts = outcome_json(outcome)
    took = clock(facts["duration_s"])
    loss = facts["eval_nats_per_char"]
    loss_words = f"{loss:.4f} nats/char" if isinstance(loss, int | float) else f"{loss} nats/char"
    blessed = "blessed" if facts["blessed"] else "not blessed"
    pushed = f"pushed to {facts['pushed_to']}" if facts["pushed_to"] else "not pushed"
    return f"run {facts['run_id']} succeeded in {took}: eval {loss_words}, {blessed}, {pushed}"
