"""Run the benchmark modules `bench/*_bench.py`, write bench/results.json, print the table.

    python -m bench                  # the quick tier: about 15 minutes on 2 CPU cores
    python -m bench --full           # adds the long ones (quality per minute: 2 x 10 min)
    python -m bench peer mfu         # only modules whose name contains "peer" or "mfu"
    python -m bench gpu              # the GPU benchmark (bench/gpu.sh runs it on its own)

Each module has `TIER` ("quick", "full": only with --full, "gpu": only when named) and
`figures(full: bool) -> list[results.Figure]`. Every figure is a ratio against a reference
measured in the same run, because absolute times on a shared machine are noise. A module that
fails still leaves a row saying so; the exit status is 1 then. Benchmarks measure speed; tests
never do.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
import time
from pathlib import Path

from bench import results
from bench.results import Figure

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results.json"
# The table's order; modules not named here follow, sorted.
ORDER = (
    "peer",
    "torch",
    "mfu",
    "input",
    "tokenize",
    "train",
    "orchestration",
    "storage",
    "serve",
    "quality",
    "gpu",
)


def discover() -> list[str]:
    """Names of the benchmark modules in this package, in the table's order."""
    names = sorted(
        info.name for info in pkgutil.iter_modules([str(BENCH)]) if info.name.endswith("_bench")
    )
    rank = {f"{n}_bench": i for i, n in enumerate(ORDER)}
    return sorted(names, key=lambda n: (rank.get(n, len(ORDER)), n))


def select(names: list[str], tiers: dict[str, str], wanted: list[str], full: bool) -> list[str]:
    """The modules to run: those named (by substring) if any, else the tier's."""
    if wanted:
        return [n for n in names if any(w in n for w in wanted)]
    allowed = ("quick", "full") if full else ("quick",)
    return [n for n in names if tiers.get(n, "quick") in allowed]


def run_module(name: str, full: bool) -> list[Figure]:
    """One module's figures; a failure becomes one row that says so."""
    started = time.perf_counter()
    try:
        figures = importlib.import_module(f"bench.{name}").figures(full)
    except Exception as e:  # one broken benchmark must not hide the others' numbers
        error = f"{type(e).__name__}: {e}"
        note = error.splitlines()[0][:300]  # the table's cell; the whole error is in the JSON
        figures = [
            Figure(f"{name}: failed", None, note=note, details={"error": error}, failed=True)
        ]
    wall = time.perf_counter() - started
    for f in figures:
        f.bench = name
        f.details.setdefault("module_wall_s", round(wall, 1))
    return figures


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    p.add_argument("names", nargs="*", help="run only modules whose name contains one of these")
    p.add_argument("--full", action="store_true", help="also the long benchmarks")
    p.add_argument("--output", type=Path, default=RESULTS, help="where results.json goes")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    names = discover()
    tiers = {n: getattr(importlib.import_module(f"bench.{n}"), "TIER", "quick") for n in names}
    chosen = select(names, tiers, args.names, args.full)
    if not chosen:
        print(f"no benchmark matches {args.names}; there are {', '.join(names)}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    figures: list[Figure] = []
    for name in chosen:
        print(f"bench: {name} ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
        figures += run_module(name, args.full)
    tier = "full" if args.full else "quick"
    if args.names:
        tier += f", only {' '.join(args.names)}"
    doc = results.report(figures, tier, argv, time.perf_counter() - started)
    args.output.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
    print(results.heading(doc))
    print()
    print(results.markdown_table(figures))
    print(f"\n(every figure's inputs and measurements: {args.output})")
    return 1 if any(f.failed for f in figures) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
