"""The `gptpipe` command line. The environment is read here, once, and passed down."""

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from trainer.errors import UserError

DEFAULT_ROOT = Path("runs")
DEFAULT_CORPUS = Path("data") / "tinyshakespeare.txt"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit status."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args = _parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as err:
        print(f"gptpipe: error: {err}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gptpipe", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the whole pipeline")
    run.add_argument("--local", action="store_true", help="run on this machine with kfp.local")
    run.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="run root (default ./runs)")
    run.add_argument("--corpus", default=str(DEFAULT_CORPUS), help="text file, folder or glob")
    run.add_argument("--config", default=None, help="trainer preset or YAML file (default tiny)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="trainer config override, repeatable")
    run.add_argument("--workers", type=int, default=None, help="trainer worker processes")
    run.add_argument("--json", action="store_true", help="print the summary as JSON")
    run.set_defaults(func=_cmd_run)

    comp = sub.add_parser("compile", help="write the pipeline YAML for the KFP UI")
    comp.add_argument("--output", type=Path, required=True, help="YAML file to write")
    comp.add_argument("--lock", type=Path, default=None, help="image digest lock (images/digests.json)")
    comp.add_argument("--allow-unpinned", action="store_true", help="allow images without digests")
    comp.set_defaults(func=_cmd_compile)
    return parser


def _cmd_run(args: argparse.Namespace) -> int:
    from pipelines import local_runner

    if not args.local:
        raise UserError("only local runs exist so far: use `gptpipe run --local`")
    defaults = local_runner.LocalRun(root=args.root, corpus=args.corpus)
    run = local_runner.LocalRun(
        root=args.root,
        corpus=args.corpus,
        config=args.config or defaults.config,
        overrides=tuple(args.overrides),
        workers=args.workers or defaults.workers,
    )
    try:
        summary = local_runner.run_local(run)
    except local_runner.PipelineFailed as err:
        print(f"gptpipe: the pipeline failed: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        _print_summary(summary)
    return 0


def _cmd_compile(args: argparse.Namespace) -> int:
    from pipelines import compiler

    images = compiler.load_images(args.lock, allow_unpinned=args.allow_unpinned)
    path = compiler.compile_pipeline(args.output, images)
    print(f"wrote {path}")
    return 0


def _print_summary(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="gptpipe run", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", overflow="fold")
    for key, value in summary_rows(summary):
        table.add_row(key, value)
    Console().print(table)


def summary_rows(summary: dict) -> list[tuple[str, str]]:
    """The run summary as (label, value) rows: data, losses, baseline, blessing, push."""
    steps = summary.get("steps", {})

    def output(step: str, key: str) -> dict:
        found = steps.get(step, {}).get("outputs", {}).get(key, [])
        return found[0]["properties"] if found else {}

    numbers = output("evaluate", "evaluation")
    blessing = output("evaluate", "blessing")
    pushed = output("push", "pushed_model")
    baseline = blessing.get("baseline_model") or "none (first model: change check skipped)"
    if numbers.get("baseline_nats_per_char") is not None:
        baseline += f" ({numbers['baseline_nats_per_char']:.4f} nats/char)"
    where = (
        f"{pushed.get('pushed_destination')}/{pushed.get('pushed_version')}"
        if pushed.get("pushed")
        else "not pushed"
    )
    return [
        ("run", str(summary.get("run_id"))),
        ("dataset version", str(summary.get("dataset_version"))),
        ("eval loss", _loss(numbers)),
        ("baseline", baseline),
        ("blessed", f"{'yes' if blessing.get('blessed') else 'no'}: {blessing.get('reason', '')}"),
        ("pushed to", where),
    ]


def _loss(numbers: dict) -> str:
    if "eval_nats_per_token" not in numbers:
        return "n/a"
    return (
        f"{numbers['eval_nats_per_token']:.4f} nats/token, "
        f"{numbers['eval_nats_per_char']:.4f} nats/char "
        f"(perplexity {numbers['eval_perplexity']:.2f})"
    )
