"""Make the README's pictures from a finished local run: the live view's final frame (SVG, from
the run's own logs replayed through the run view) and evaluate's report (PNG, rendered
by headless Chromium).

    .venv/bin/gptpipe run --local --root /tmp/shots
    .venv/bin/python docs/img/make_screenshots.py /tmp/shots
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from contracts.progress import read_events
from pipelines.runners.local import view as run_view

HERE = Path(__file__).resolve().parent


def run_view_svg(root: Path) -> None:
    logs = max((root / "logs").iterdir(), key=lambda p: p.stat().st_mtime)
    kfp_lines = (logs / "kfp-local.log").read_text(encoding="utf-8").splitlines()
    events, _ = read_events(str(logs / "progress.jsonl"))
    now = time.time()
    first = run_view.parse_kfp_line(next(line for line in kfp_lines if "Executing" in line), now)
    view = run_view.RunView.new(logs.name, first.at or now)
    timeline = [(e["time"], "event", e) for e in events]
    for raw in kfp_lines:
        line = run_view.parse_kfp_line(raw, now)
        if line.at is not None:
            timeline.append((line.at, "kfp", line))
    for _, kind, item in sorted(timeline, key=lambda t: t[0]):
        if kind == "kfp":
            run_view.apply_kfp_line(view, item)
        else:
            run_view.apply_event(view, item)
    end = max(t for t, _, _ in timeline)
    run_view.finish(view, True, end)
    console = Console(record=True, width=100, force_terminal=True)
    console.print(run_view.render(view, end))
    console.save_svg(str(HERE / "run-view.svg"), title="gptpipe run --local")


def report_png(root: Path) -> None:
    reports = root / "reports"
    if not reports.is_dir() or not any(reports.iterdir()):
        from pipelines.cli import main as cli

        cli.main(["report", "--root", str(root)])  # copies the newest report to reports/
    report = max(reports.iterdir(), key=lambda p: p.stat().st_mtime)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium on PATH: install Debian's chromium package")
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--screenshot={HERE / 'report.png'}",
            "--window-size=1100,1700",
            report.resolve().as_uri(),
        ],
        check=True,
        capture_output=True,
    )


if __name__ == "__main__":
    run_root = Path(sys.argv[1] if len(sys.argv) > 1 else "runs").resolve()
    run_view_svg(run_root)
    report_png(run_root)
    print(json.dumps({"wrote": [str(HERE / "run-view.svg"), str(HERE / "report.png")]}))
