"""Progress of the tokenize step: a rich bar on a terminal, a few plain lines in a KFP log."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class Report:
    """Progress for long steps: a rich bar on a terminal, a few plain lines in a log (KFP)."""

    def __init__(self, enabled: bool) -> None:
        self._console = Console(stderr=True, soft_wrap=True) if enabled else None

    def line(self, message: str) -> None:
        if self._console:
            self._console.print(f"tokenize: {message}", markup=False, highlight=False)

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
