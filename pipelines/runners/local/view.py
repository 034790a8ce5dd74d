"""The run view: what `gptpipe run --local` shows of a run while it runs.

Each step's state (waiting, running, done, cached, failed, skipped), duration and progress are
put together from what the run leaves behind (pipelines/runners/local/watch.py reads it):

- kfp.local's own lines ("Executing task 'train'", "Task 'train' finished with status
  SUCCESS"): `parse_kfp_line`, `apply_kfp_line`;
- the steps' progress events (contracts.progress): bytes tokenized, steps trained with the loss
  and tokens/s, objects pushed, and short notes: `apply_event`;
- ML Metadata, where lineage records each step RUNNING as it starts and COMPLETE, FAILED (with
  its error) or CACHED as it ends: `apply_lineage`.

`render` draws a `RunView` as a rich table and `PlainLines` as lines for a log; both are pure
functions of the view and the time, so tests check frames without a run.
"""

from __future__ import annotations

import datetime
import math
import re
from dataclasses import dataclass, field
from typing import Any

from rich import filesize
from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

STEPS = ("tokenize", "train", "evaluate", "push")  # the pipeline's steps, in order
WAITING, RUNNING, DONE, CACHED, FAILED, SKIPPED = (
    "waiting",
    "running",
    "done",
    "cached",
    "failed",
    "skipped",
)
ENDED = (DONE, CACHED, FAILED, SKIPPED)
_LINEAGE_STATES = {"RUNNING": RUNNING, "COMPLETE": DONE, "CACHED": CACHED, "FAILED": FAILED}


# ---- the state ------------------------------------------------------------------------------


@dataclass
class StepView:
    """What is known of one step."""

    name: str
    state: str = WAITING
    started: float | None = None  # epoch seconds
    ended: float | None = None
    done: float | None = None  # progress: `done` of `total` `unit`s
    total: float | None = None
    unit: str = ""
    numbers: dict[str, Any] = field(default_factory=dict)  # with progress: stage, loss...
    measured_from: tuple[float, float] | None = None  # (time, done) the rate is measured from
    updated: float | None = None  # time of the latest progress event
    note: str = ""  # the latest note
    error: str = ""  # why it failed

    def duration(self, now: float) -> float | None:
        if self.started is None:
            return None
        return max(0.0, (self.ended if self.ended is not None else now) - self.started)

    def eta(self, now: float) -> float | None:
        """Seconds left at the rate seen since the current unit and stage began, or None."""
        if self.state != RUNNING or not self.total or self.done is None:
            return None
        if self.measured_from is None or self.updated is None:
            return None
        since, done_then = self.measured_from
        if self.updated <= since or self.done <= done_then:
            return None
        rate = (self.done - done_then) / (self.updated - since)
        return max(0.0, (self.total - self.done) / rate - (now - self.updated))


@dataclass
class RunView:
    """What is known of one run: its steps in pipeline order, then any other step seen."""

    run_id: str
    started: float  # epoch seconds
    steps: dict[str, StepView] = field(default_factory=dict)
    outcome: str = RUNNING  # running, then done or failed
    ended: float | None = None

    @classmethod
    def new(cls, run_id: str, started: float) -> RunView:
        return cls(run_id, started, {name: StepView(name) for name in STEPS})

    def step(self, name: str) -> StepView:
        return self.steps.setdefault(name, StepView(name))


def _move(step: StepView, state: str, at: float) -> None:
    """Move a step forward (waiting, running, then an end); an end is kept, but a done step
    that lineage says was served from KFP's cache becomes cached."""
    if step.state in ENDED and not (step.state == DONE and state == CACHED):
        return
    if state == WAITING or state == step.state:
        return
    if step.started is None:
        step.started = at
    if state in ENDED and step.ended is None:
        step.ended = at
    # Its last progress may have been left unsent; but a training that diverged stopped where
    # its last progress (a non-finite loss) says.
    loss = (step.numbers or {}).get("loss")
    stopped = isinstance(loss, float) and not math.isfinite(loss)
    if state == DONE and step.total and not stopped:
        step.done = step.total
    step.state = state


# ---- what the sources say -------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_KFP_LINE = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d{3}) - [A-Z]+ - (.*)$")
_STARTS = re.compile(r"^Executing task '([^']+)'$")
_ENDS = re.compile(r"^Task '([^']+)' finished with status (\w+)$")
_PIPELINE_ENDS = re.compile(r"^Pipeline '[^']+' finished with status")


@dataclass(frozen=True)
class KfpLine:
    """One line of kfp.local's output, as the view reads it."""

    text: str  # without colour codes
    at: float | None  # the time kfp.local stamped on its own lines; None on a step's line
    starts: str = ""  # the task this line says starts
    ends: str = ""  # the task this line says ended
    status: str = ""  # with `ends`: SUCCESS or FAILURE
    pipeline_ends: bool = False


def without_colours(text: str) -> str:
    """`text` without its terminal colour codes."""
    return _ANSI.sub("", text)


def parse_kfp_line(raw: str, now: float) -> KfpLine:
    """Read one line kfp.local printed; a step's own (indented) lines carry no news."""
    text = without_colours(raw).rstrip("\r\n")
    found = _KFP_LINE.match(text)
    if not found:
        return KfpLine(text, None)
    hour, minute, second, milli, message = found.groups()
    at = _today_at(now, int(hour), int(minute), int(second), int(milli))
    if starts := _STARTS.match(message):
        return KfpLine(text, at, starts=starts[1])
    if ends := _ENDS.match(message):
        return KfpLine(text, at, ends=ends[1], status=ends[2])
    return KfpLine(text, at, pipeline_ends=bool(_PIPELINE_ENDS.match(message)))


def _today_at(now: float, hour: int, minute: int, second: int, milli: int) -> float:
    """The epoch time of a local clock reading at most a little after `now`."""
    base = datetime.datetime.fromtimestamp(now)
    at = base.replace(hour=hour, minute=minute, second=second, microsecond=milli * 1000)
    if at.timestamp() > now + 3600:  # stamped before midnight, read after it
        at -= datetime.timedelta(days=1)
    return at.timestamp()


def apply_kfp_line(view: RunView, line: KfpLine) -> None:
    """What a line of kfp.local says about a task."""
    if line.starts and line.at is not None:
        _move(view.step(line.starts), RUNNING, line.at)
    elif line.ends and line.at is not None:
        _move(view.step(line.ends), DONE if line.status == "SUCCESS" else FAILED, line.at)


def apply_event(view: RunView, event: dict[str, Any]) -> None:
    """What a step's progress event (contracts.progress) says."""
    name, at = event.get("step"), event.get("time")
    if not isinstance(name, str) or not isinstance(at, int | float):
        return
    step = view.step(name)
    _move(step, RUNNING, at)
    if event.get("kind") == "note":
        step.note = str(event.get("text", ""))
    elif event.get("kind") == "progress" and isinstance(event.get("done"), int | float):
        numbers = {
            k: v for k, v in event.items() if k not in ("step", "time", "kind", "done", "unit")
        }
        total = numbers.pop("total", None)
        unit = str(event.get("unit", ""))
        done = float(event["done"])
        restarted = (unit, numbers.get("stage")) != (step.unit, step.numbers.get("stage"))
        if restarted or step.measured_from is None or done < (step.done or 0.0):
            step.measured_from = (at, done)
        step.done, step.unit, step.numbers, step.updated = done, unit, numbers, at
        step.total = float(total) if isinstance(total, int | float) else None


def apply_lineage(view: RunView, steps: dict[str, Any], now: float) -> None:
    """What ML Metadata says: each step's latest execution (`lineage.run_summary`'s steps).

    kfp.local's own lines time the steps it runs, start-up and exit included, so lineage's
    RUNNING and COMPLETE count only for a step kfp.local has said nothing of yet; a failure
    (with its error) and a step served from KFP's cache always count.
    """
    for name, execution in steps.items():
        state = _LINEAGE_STATES.get(str(execution.get("state")))
        if state is None or not name:
            continue
        step = view.step(name)
        if state in (RUNNING, DONE) and step.state != WAITING:
            continue
        props = execution.get("properties", {})
        if step.started is None and isinstance(props.get("start_time_ms"), int | float):
            step.started = props["start_time_ms"] / 1000
        ended_ms = props.get("end_time_ms")
        if state in ENDED and step.ended is None and isinstance(ended_ms, int | float):
            step.ended = ended_ms / 1000
        if state == FAILED and props.get("error"):
            step.error = str(props["error"])
        _move(step, state, now)


def finish(view: RunView, succeeded: bool, now: float, failed_step: str | None = None) -> None:
    """End the run: after a success every step ran; after a failure the failed step (and any
    still running) failed, and those that never started were skipped."""
    if failed_step:
        _move(view.step(failed_step), FAILED, now)
    for step in view.steps.values():
        if step.state == RUNNING:
            _move(step, DONE if succeeded else FAILED, now)
        elif step.state == WAITING:
            step.state = SKIPPED
    view.outcome, view.ended = (DONE if succeeded else FAILED), now


# ---- drawing --------------------------------------------------------------------------------

_SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
_LOOK = {  # state: (mark, style)
    WAITING: ("·", "dim"),
    RUNNING: ("", "cyan"),
    DONE: ("✔", "green"),
    CACHED: ("↺", "green"),
    FAILED: ("✘", "bold red"),
    SKIPPED: ("–", "dim"),
}
BAR_WIDTH = 24


def render(view: RunView, now: float) -> RenderableType:
    """The view as a rich renderable: a title line, then one row per step."""
    took = clock((view.ended or now) - view.started)
    title = Text.assemble(("gptpipe run ", "bold"), (view.run_id, "bold cyan"), f"  {took}")
    if view.outcome != RUNNING:
        title.append(f"  {view.outcome}", _LOOK[view.outcome][1])
    table = Table.grid(padding=(0, 1), expand=True)
    table.add_column(width=1, no_wrap=True)  # the mark
    table.add_column(width=max(len(name) for name in view.steps), no_wrap=True)
    table.add_column(width=max(len(state) for state in _LOOK), no_wrap=True)
    table.add_column(width=7, no_wrap=True, justify="right")  # the duration
    table.add_column(width=BAR_WIDTH, no_wrap=True)
    table.add_column(ratio=1, no_wrap=True, overflow="ellipsis")  # progress, ETA, note
    for step in view.steps.values():
        mark, style = _LOOK[step.state]
        if step.state == RUNNING:
            mark = _SPINNER[int(now * 10) % len(_SPINNER)]
        duration = step.duration(now)
        table.add_row(
            Text(mark, style),
            Text(step.name, "bold"),
            Text(step.state, style),
            Text(clock(duration) if duration is not None else "", "dim"),
            _bar(step),
            _detail(step, now),
        )
    return Group(title, table)


def _bar(step: StepView) -> RenderableType:
    if step.total is None or step.done is None:
        return Text(" " * BAR_WIDTH)
    return ProgressBar(total=step.total or 1, completed=step.done, width=BAR_WIDTH)


def _detail(step: StepView, now: float) -> Text:
    """Progress in words, then the ETA, then the error or the latest note."""
    text = Text()
    if step.done is not None and step.state != SKIPPED:
        text.append(progress_words(step))
        eta = step.eta(now)
        if eta is not None:
            text.append(f" · eta {clock(eta)}", "cyan")
    if step.error:
        text.append(("  " if text else "") + step.error, "red")
    elif step.note:
        text.append(("  " if text else "") + step.note, "dim")
    return text


def progress_words(step: StepView) -> str:
    """`done`/`total` in the step's unit, with its stage, loss and tokens/s when known."""
    done, total = step.done or 0.0, step.total
    if step.unit == "bytes":
        amount = f"{filesize.decimal(int(done))}" + (
            f"/{filesize.decimal(int(total))}" if total else ""
        )
    else:
        amount = f"{done:,.0f}" + (f"/{total:,.0f}" if total else "") + f" {step.unit}"
    words = [f"{step.numbers['stage']} {amount}" if step.numbers.get("stage") else amount]
    loss = step.numbers.get("loss")
    if isinstance(loss, int | float):
        words.append(f"loss {loss:.4g}")
    speed = step.numbers.get("tokens_per_s")
    if isinstance(speed, int | float):
        words.append(f"{_si(speed)} tokens/s")
    return " · ".join(words)


def _si(value: float) -> str:
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.1f}{suffix}"
    return f"{value:.0f}"


def clock(seconds: float) -> str:
    """Seconds as m:ss, or h:mm:ss from an hour."""
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class PlainLines:
    """The view where there is no terminal: a line when a step changes state, and one as its
    progress passes each quarter of each stage."""

    def __init__(self) -> None:
        self._said: dict[str, tuple[str, object]] = {}

    def lines(self, view: RunView, now: float) -> list[str]:
        out = []
        for step in view.steps.values():
            state, quarter = self._said.get(step.name, (WAITING, None))
            if step.state != state:
                out.append(self._state_line(step, now))
            if step.state == RUNNING and step.total and step.done is not None:
                passed = (step.unit, step.numbers.get("stage"), int(4 * step.done / step.total))
                if passed != quarter:
                    out.append(f"{step.name}: {progress_words(step)}")
                    quarter = passed
            self._said[step.name] = (step.state, quarter)
        return out

    @staticmethod
    def _state_line(step: StepView, now: float) -> str:
        took = step.duration(now)
        line = f"{step.name}: {step.state}"
        if step.state in (DONE, CACHED, FAILED) and took is not None:
            line += f" in {clock(took)}"
        if step.error:
            line += f": {step.error}"
        elif step.note and step.state in (DONE, CACHED):
            line += f" ({step.note})"
        return line
