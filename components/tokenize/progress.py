"""Progress of the tokenize step: a rich bar on a terminal, a few plain lines in a KFP log, and
events for the run view (contracts.progress) counted in bytes of the corpus."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from contracts import progress as events


class Report:
    """Progress for long steps: a rich bar on a terminal, a few plain lines in a log (KFP).

    `events` (default: none) also receives each line as a note and `corpus_bytes` as progress.
    """

    def __init__(self, enabled: bool, events: events.Progress | None = None) -> None:
        self._console = Console(stderr=True, soft_wrap=True) if enabled else None
        self._events = events

    def line(self, message: str) -> None:
        if self._console:
            self._console.print(f"tokenize: {message}", markup=False, highlight=False)
        if self._events:
            self._events.note(message)

    def corpus_bytes(self, done: float, total: int, stage: str, final: bool = False) -> None:
        """`done` of the corpus's `total` bytes have been through `stage` (read, encode...)."""
        if self._events:
            self._events.update(round(done), total, "bytes", final=final, stage=stage)

    @contextlib.contextmanager
    def task(self, what: str) -> Iterator[Callable[[int, int], None]]:
        """Yield advance(done, total) for one task: it moves a bar, or logs each quarter."""
        if self._console is None:
            yield lambda done, total: None
        elif self._console.is_terminal:
            with Progress(
                TextColumn(f"tokenize: {what}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self._console,
            ) as bar:
                task = bar.add_task(what, total=None)
                yield lambda done, total: bar.update(task, completed=done, total=total)
        else:
            logged = [-1]

            def advance(done: int, total: int) -> None:
                if 4 * done // total > logged[0]:
                    logged[0] = 4 * done // total
                    self.line(f"{what}: {done}/{total}")

            yield advance
