"""Run every benchmark module `bench/*_bench.py` and print its results as one table.

    python -m bench                 # all of them
    python -m bench storage         # only modules whose name contains "storage"

Each module exposes `main() -> dict[str, float | int | str]`; benchmarks measure speed,
tests never do.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
from pathlib import Path


def discover(selected: list[str]) -> list[str]:
    """Names of the benchmark modules in this package, filtered by substrings if given."""
    names = sorted(
        info.name
        for info in pkgutil.iter_modules([str(Path(__file__).parent)])
        if info.name.endswith("_bench")
    )
    return [n for n in names if not selected or any(s in n for s in selected)]


def _cell(value: object) -> str:
    return f"{value:,.3f}" if isinstance(value, float) else str(value)


def main(argv: list[str]) -> int:
    rows: list[tuple[str, str, str]] = []
    failed = 0
    for name in discover(argv):
        started = time.perf_counter()
        try:
            results = importlib.import_module(f"bench.{name}").main()
        except Exception as e:  # one broken benchmark must not hide the others' numbers
            failed += 1
            results = {"error": f"{type(e).__name__}: {e}"}
        results = {**results, "wall_s": time.perf_counter() - started}
        rows += [(name, key, _cell(value)) for key, value in results.items()]
    widths = [
        max([len(h), *(len(r[i]) for r in rows)])
        for i, h in enumerate(("bench", "metric", "value"))
    ]
    for row in [("bench", "metric", "value"), tuple("-" * w for w in widths), *rows]:
        print(
            "  ".join(
                cell.ljust(w) if i < 2 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
