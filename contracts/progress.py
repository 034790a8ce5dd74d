"""Live progress from the steps to whoever watches a run: JSON lines appended to one file.

`gptpipe run --local` sets `PROGRESS_ENV` to a file under the run's state folder; kfp.local
starts every step (and the local launcher every trainer worker) as a subprocess that inherits
it. Each step reports with a `Progress` made once at its edge (`Progress.from_env`); on a
cluster the variable is unset and reporting does nothing. The run view
(pipelines/runners/local/view.py)
reads the events back with `read_events`.

One event is one line of JSON under 4 KiB, appended with O_APPEND in a single write, so lines
from concurrent processes never interleave (POSIX guarantees this for local files).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PROGRESS_ENV = "GPTPIPE_PROGRESS"  # the events file of the run being watched; unset: no events
MIN_INTERVAL_S = 0.5  # at most two progress events a second per reporter (the last always goes)
MAX_EVENT_BYTES = 4096  # one write(2) of at most PIPE_BUF bytes to an O_APPEND file lands whole


@dataclass
class Progress:
    """Reports one step's progress: `update(done, total, unit, **numbers)` and `note(text)`."""

    path: str | None  # the events file; None reports nothing
    step: str  # the pipeline step's name: tokenize, train, evaluate, push
    _last: float = field(default=0.0, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str], step: str) -> Progress:
        return cls(env.get(PROGRESS_ENV) or None, step)

    def update(
        self, done: float, total: float | None, unit: str, *, final: bool = False, **numbers: Any
    ) -> None:
        """`done` of `total` `unit`s (bytes, steps, objects), with numbers such as loss."""
        now = time.monotonic()
        if not final and now - self._last < MIN_INTERVAL_S:
            return
        self._last = now
        self._write({"kind": "progress", "done": done, "total": total, "unit": unit, **numbers})

    def note(self, text: str) -> None:
        """A short line worth showing under the step (e.g. "reusing dataset <version>")."""
        self._write({"kind": "note", "text": text})

    def _write(self, event: dict[str, Any]) -> None:
        if not self.path:
            return
        data = _line({"step": self.step, "time": time.time(), **event})
        while len(data) > MAX_EVENT_BYTES and len(event.get("text", "")) > 1:
            # Shortened, not cut: a cut line would lose its newline and take the next with it.
            event = {**event, "text": event["text"][: len(event["text"]) // 2] + "…"}
            data = _line({"step": self.step, "time": time.time(), **event})
        if len(data) > MAX_EVENT_BYTES:  # long numbers: keep what the bar needs
            event = {k: v for k, v in event.items() if k in ("kind", "done", "total", "unit")}
            data = _line({"step": self.step, "time": time.time(), **event})
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


def _line(event: dict[str, Any]) -> bytes:
    return (json.dumps(event, default=str) + "\n").encode("utf-8")


def read_events(path: str, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The whole events appended to `path` since `offset`, and the offset to read from next."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
    events = []
    for line in data[:end].splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events, offset + end
