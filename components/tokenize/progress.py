"""Progress of the tokenize step: a rich bar on a terminal, a few plain lines in a KFP log, and
events for the run view (contracts.progress) counted in bytes of the corpus."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

from contracts import progress as events


class Report:
    """Progress for long steps: a rich bar on a terminal, a few plain lines in a log (KFP).

    `events` (default: none) also receives each line as a note and each stage's bytes.
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
    def stage(self, name: str, total: int) -> Iterator[Callable[[int], None]]:
        """Yield advance(done) for `done` of the corpus's `total` bytes through stage `name`.

        It moves a bar, or logs each quarter, and reports the bytes as events: none done when
        it starts, and all `total` when the block ends without an error.
        """
        self.corpus_bytes(0, total, name)
        with self._advance(name, total) as shown:

            def advance(done: int) -> None:
                shown(done)
                self.corpus_bytes(done, total, name)

            yield advance
        self.corpus_bytes(total, total, name, final=True)

    @contextlib.contextmanager
    def _advance(self, name: str, total: int) -> Iterator[Callable[[int], None]]:
        if self._console is None:
            yield lambda done: None
        elif self._console.is_terminal:
            with Progress(
                TextColumn(f"tokenize: {name}"),
                BarColumn(),
                DownloadColumn(),
                TimeElapsedColumn(),
                console=self._console,
            ) as bar:
                task = bar.add_task(name, total=total)
                yield lambda done: bar.update(task, completed=done)
                bar.update(task, completed=total)
        else:
            logged = [0]

            def advance(done: int) -> None:
                if 4 * done // max(total, 1) > logged[0]:
                    logged[0] = 4 * done // max(total, 1)
                    self.line(f"{name}: {25 * logged[0]}% of {_size(total)}")

            yield advance


def _size(count: int) -> str:
    """A byte count for a log line: 12.0 kB, 1.1 MB, 1.0 GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if count >= scale:
            return f"{count / scale:,.1f} {unit}"
    return f"{count / 1e3:,.1f} kB"
