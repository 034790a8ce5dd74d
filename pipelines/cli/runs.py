"""`gptpipe runs --local`: past local runs from ML Metadata, newest first.

Each row is a run as lineage recorded it (`components.lineage.list_runs`): when it started and
how long it took, its state, dataset version, evaluate's nats/char, whether it was blessed and
the serving version it pushed. The store is `<root>/metadata.sqlite`, where `gptpipe run
--local` keeps it (the run root, or its `--state-dir` when the root is on gs://); it is only read.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contracts.errors import UserError
from pipelines.config import DEFAULT_ROOT

if TYPE_CHECKING:
    from components.lineage import RunRow

DEFAULT_LIMIT = 20
NOT_KNOWN = "-"
COLUMNS = ("run", "started", "took", "state", "dataset", "nats/char", "blessed", "pushed")
# Where the table is wider than the terminal (80 columns, or 80 when piped), columns are left
# out in this order, those that least tell runs apart first, rather than cells broken across
# lines; --json keeps every one. The run id is never left out: other commands take it.
LEFT_OUT_FIRST = ("took", "dataset", "blessed", "started", "nats/char")
GAP = 2  # spaces between the table's columns


def add_parser(subparsers: Any) -> None:
    """Add `runs` to the `gptpipe` command's subparsers."""
    runs = subparsers.add_parser("runs", help="past local runs, newest first")
    runs.add_argument(
        "--local", action="store_true", help="list the runs `gptpipe run --local` recorded"
    )
    runs.add_argument(
        "--root",
        default=str(DEFAULT_ROOT),
        help="the runs' local root, or their --state-dir (default ./runs): holds metadata.sqlite",
    )
    runs.add_argument(
        "--limit", type=int, default=DEFAULT_LIMIT, help=f"how many (default {DEFAULT_LIMIT})"
    )
    runs.add_argument("--json", action="store_true", help="print the runs as a JSON list")
    runs.set_defaults(func=cmd_runs)


def cmd_runs(args: argparse.Namespace) -> int:
    """List past runs as a table, or as JSON with --json."""
    if not args.local:
        raise UserError(
            "only local runs are listed here: use `gptpipe runs --local`, or `gptpipe kfp runs` "
            "for a KFP cluster's"
        )
    if args.limit < 1:
        raise UserError(f"--limit {args.limit}: pass 1 or more")
    from components import lineage  # here, as main.py imports: `gptpipe` starts fast

    store = store_path(args.root)
    rows = lineage.list_runs(store, limit=args.limit)
    if args.json:
        print(json.dumps([json_row(row) for row in rows], indent=2))
    else:
        print_table(rows, store)
    return 0


def store_path(root: str) -> str:
    """The metadata.sqlite under a local run root; one that is not there is a UserError.

    Checked before opening, because opening a SQLite store creates it.
    """
    from components import storage

    if storage.is_gcs(root):
        raise UserError(
            f"--root {root} is on GCS, but local runs keep metadata.sqlite on local disk: pass "
            "the --state-dir those runs were given"
        )
    path = Path(root) / "metadata.sqlite"
    if not path.is_file():
        raise UserError(
            f"no metadata store at {path}: run `gptpipe run --local` first, or pass --root, the "
            "folder a local run was given as --root (or --state-dir)"
        )
    return str(path.resolve())


def json_row(row: RunRow) -> dict[str, Any]:
    """A run for --json: the row as lineage read it, plus its start as ISO 8601 and duration."""
    return {**row, "started": _iso(row["start_time_ms"]), "duration_s": _duration_s(row)}


def table_cells(row: RunRow, now: datetime.datetime | None = None) -> tuple[str, ...]:
    """A run's cells, in the order of `COLUMNS`; `now` (default: now) dates them."""
    duration = _duration_s(row)
    return (
        row["run_id"],
        _local_time(row["start_time_ms"], now or datetime.datetime.now().astimezone()),
        NOT_KNOWN if duration is None else _duration(duration),
        row["state"],
        (row["dataset_version"] or NOT_KNOWN)[:8],
        _nats(row["eval_nats_per_char"]),
        {True: "yes", False: "no", None: NOT_KNOWN}[row["blessed"]],
        _pushed(row),
    )


def fitted_columns(cells: list[tuple[str, ...]], width: int) -> list[int]:
    """The indexes of the COLUMNS shown in `width` characters: all of them where they fit
    whole, else all but the first of LEFT_OUT_FIRST that must go for the rest to fit."""
    widths = [max(len(name), *(len(row[i]) for row in cells)) for i, name in enumerate(COLUMNS)]
    shown = list(range(len(COLUMNS)))
    for name in LEFT_OUT_FIRST:
        if sum(widths[i] for i in shown) + GAP * (len(shown) - 1) <= width:
            break
        shown.remove(COLUMNS.index(name))
    return shown


def print_table(rows: list[RunRow], store: str) -> None:
    """Print the runs as a table that fits the terminal (or a line saying there are none)."""
    from rich.console import Console

    console = Console()
    if not rows:
        console.print(f"no runs recorded in {store}", soft_wrap=True)
        return
    console.print(runs_table(rows, store, console.width))


def runs_table(rows: list[RunRow], store: str, width: int) -> Any:
    """The runs as a rich Table of at most `width` columns, no cell or header broken."""
    from rich import box
    from rich.table import Table

    cells = [table_cells(row) for row in rows]
    shown = fitted_columns(cells, width)
    left_out = [name for i, name in enumerate(COLUMNS) if i not in shown]
    table = Table(
        title=f"gptpipe local runs, newest first: {store}",
        caption=f"left out to fit: {', '.join(left_out)} (--json has all)" if left_out else None,
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
    for i in shown:
        table.add_column(COLUMNS[i], no_wrap=True, overflow="ellipsis")
    for row in cells:
        table.add_row(*(row[i] for i in shown))
    return table


def _pushed(row: RunRow) -> str:
    if row["pushed"] is None:
        return NOT_KNOWN
    return str(row["pushed_version"]) if row["pushed"] else "no"


def _nats(value: float | str | None) -> str:
    """A recorded loss: a number, or the string ("nan", "inf") the store keeps for one."""
    if value is None:
        return NOT_KNOWN
    return format(value, ".4f") if isinstance(value, int | float) else str(value)


def _duration_s(row: RunRow) -> float | None:
    end = row["end_time_ms"]
    return None if end is None else round((end - row["start_time_ms"]) / 1000, 3)


def _duration(seconds: float) -> str:
    """`12m34s`, or from an hour on `3h07m`: a run's length to the precision a person reads."""
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _local_time(ms: int, now: datetime.datetime) -> str:
    """When, in this machine's time zone: to the minute in `now`'s year (`11-14 22:13`), else
    the day (`2023-11-14`), as `ls -l` dates files."""
    when = datetime.datetime.fromtimestamp(ms / 1000).astimezone()
    return when.strftime("%m-%d %H:%M" if when.year == now.year else "%Y-%m-%d")


def _iso(ms: int) -> str:
    when = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")
