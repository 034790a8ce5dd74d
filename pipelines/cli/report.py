"""`gptpipe report`: where a local run's HTML evaluation report is, found through lineage.

The evaluate step records its HTML artifact as the output `html_report` of its execution; this
command reads it back from `<root>/metadata.sqlite`. KFP names an artifact's file after the
output, without an extension, and browsers pick how to show a local file by its extension (a
link does not help: they follow it to the target's name), so the command prints a copy named
`<root>/reports/<run>.html`, refreshed whenever the artifact differs.

ML Metadata, the storage layer and the pipeline (KFP) are imported when the command runs, not
when the CLI builds its parser.
"""

from __future__ import annotations

import argparse
import webbrowser
from pathlib import Path
from typing import Any

from contracts.errors import UserError
from pipelines.config import DEFAULT_ROOT

REPORT_OUTPUT = "html_report"  # the evaluate step's output key (components/evaluate/component.py)
REPORTS_DIR = "reports"  # under the root: the reports as .html files a browser opens


def add_parser(subparsers: Any) -> None:
    """Add `gptpipe report [RUN|--latest] [--root DIR] [--open]`."""
    rep = subparsers.add_parser("report", help="print (or --open) a local run's HTML report")
    rep.add_argument("run_id", nargs="?", metavar="RUN", help="run id, e.g. local-0123456789ab")
    rep.add_argument(
        "--latest", action="store_true", help="the newest run with a report (also without RUN)"
    )
    rep.add_argument(
        "--root",
        default=str(DEFAULT_ROOT),
        help="the local folder holding metadata.sqlite: `gptpipe run --local`'s --root, or its "
        "--state-dir (default ./runs)",
    )
    rep.add_argument("--open", action="store_true", help="open it in a web browser")
    rep.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    """Print the report's path; with --open, open it too."""
    if args.run_id and args.latest:
        raise UserError("give a RUN or --latest, not both")
    root = Path(args.root)
    store = store_path(root)
    run_id, artifact = find_report(store, args.run_id)
    path = html_copy(artifact, root / REPORTS_DIR / f"{run_id}.html")
    print(path)
    if args.open and not webbrowser.open(path.as_uri()):
        raise UserError(f"no web browser found to open {path}: open it with one yourself")
    return 0


def store_path(root: Path) -> str:
    """The local runs' metadata store under `root`; a UserError naming the fix without one."""
    path = root / "metadata.sqlite"
    if not path.is_file():
        raise UserError(
            f"no metadata store at {path}: pass --root, the folder `gptpipe run --local` kept "
            "its state in (its --state-dir, if it had one)"
        )
    return str(path.resolve())


def find_report(store: str, run_id: str | None) -> tuple[str, str]:
    """(run id, HTML artifact URI) of run `run_id`, or of the newest run with one when None."""
    from components import lineage
    from components.lineage import run_ids
    from pipelines.pipeline import PIPELINE_NAME

    if run_id:
        uri = report_of(store, run_id)
        if uri is None:
            failure = lineage.failure_of(store, run_id)
            why = (
                f"its step {failure[0]!r} failed: {failure[1].splitlines()[0]}"
                if failure
                else "its evaluate step did not complete"
            )
            raise UserError(f"run {run_id!r} has no HTML report: {why}")
        return run_id, uri
    for candidate in run_ids(store, PIPELINE_NAME):
        uri = report_of(store, candidate)
        if uri is not None:
            return candidate, uri
    raise UserError(f"no run with an HTML report in {store}: run `gptpipe run --local` first")


def report_of(store: str, run_id: str) -> str | None:
    """The URI of the HTML report a run's evaluate step recorded, or None (an unknown run is
    a UserError)."""
    from components import lineage

    evaluate = lineage.run_summary(store, run_id)["steps"].get("evaluate", {})
    found = evaluate.get("outputs", {}).get(REPORT_OUTPUT, [])
    return str(found[0]["uri"]) if found else None


def html_copy(artifact: str, target: Path) -> Path:
    """`target`, a copy of the local report artifact, written anew when it differs."""
    from components import storage

    if storage.is_gcs(artifact):
        raise UserError(f"the report {artifact} is on GCS, not local: open it in the KFP UI")
    source = Path(artifact)
    if not source.is_file():
        raise UserError(f"the report {source} is gone: was the run's pipeline_root removed?")
    data = source.read_bytes()
    if not target.is_file() or target.read_bytes() != data:
        storage.write_bytes(str(target), data)  # a browser never reads half of it
    return target.resolve()
