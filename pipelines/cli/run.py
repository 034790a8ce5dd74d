"""`gptpipe run`: the whole pipeline, here (`--local`, kfp.local) or on a cluster (`--kfp HOST`).

A local run is shown live and ends with its summary (`run_and_report`); a cluster run is
`gptpipe kfp run` (pipelines/cli/kfp.py), which `run --kfp HOST` is. Each step's parameters
are its object in `contracts.params`, set with `--param <object>.<field>=VALUE` in both places.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contracts.errors import UserError
from contracts.params import apply_overrides
from pipelines.cli import kfp as kfp_cli
from pipelines.cli.options import resolved_config
from pipelines.config import DEFAULT_ROOT
from pipelines.paths import check_folder

if TYPE_CHECKING:  # imported where used: most commands need neither kfp nor rich
    from pipelines.runners.local.runner import LocalRun
    from pipelines.runners.local.watch import Outcome

DEFAULT_CORPUS = Path("data") / "tinyshakespeare.txt"
# Options only one kind of run takes, by their argparse dest; the other kind refuses them.
LOCAL_ONLY = (
    "root",
    "state_dir",
    "corpus",
    "workers",
    "tokenizer",
    "text_field",
    "verbose",
    "quiet",
    "json",
)
KFP_ONLY = kfp_cli.RUN_ONLY


def add_parser(sub: Any) -> None:
    """Add `run` to the `gptpipe` command's subparsers."""
    run = sub.add_parser(
        "run",
        parents=kfp_cli.run_parents(),
        help="run the whole pipeline: here (--local) or on KFP (--kfp HOST)",
    )
    where = run.add_mutually_exclusive_group(required=True)
    where.add_argument("--local", action="store_true", help="run on this machine with kfp.local")
    where.add_argument(
        "--kfp",
        metavar="HOST",
        nargs="?",
        const="",
        default=None,
        help="run on the KFP API at HOST (default $KF_PIPELINES_ENDPOINT); what "
        "`gptpipe kfp run --host HOST` does",
    )
    _local_options(run)
    run.set_defaults(func=_cmd_run, run_parser=run)


def _local_options(run: argparse.ArgumentParser) -> None:
    local = run.add_argument_group("local runs (--local)")
    local.add_argument(
        "--root",
        default=str(DEFAULT_ROOT),
        help="run root, local or gs:// (default ./runs); models go to ROOT/serving/",
    )
    local.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="local folder for step artifacts and metadata.sqlite (default: ROOT)",
    )
    local.add_argument(
        "--corpus",
        default=str(DEFAULT_CORPUS),
        help="files, a folder or a glob: .txt, .jsonl, .parquet, each maybe .gz/.bz2/.xz/.zst",
    )
    local.add_argument(
        "--text-field",
        default="",
        metavar="NAME",
        help="the JSONL field or Parquet column that holds each document's text "
        "(tokenize.text_field; default text)",
    )
    local.add_argument(
        "--workers", type=int, default=None, help="trainer worker processes (train_job.workers)"
    )
    local.add_argument(
        "--tokenizer",
        default="",
        help="SentencePiece model to reuse (tokenize.tokenizer; default: train one)",
    )
    shown = local.add_mutually_exclusive_group()
    shown.add_argument(
        "--verbose",
        action="store_true",
        help="stream kfp.local's and the steps' whole output instead of the live view",
    )
    shown.add_argument(
        "--quiet", action="store_true", help="print only the outcome in one line, or the error"
    )
    shown.add_argument(
        "--json",
        action="store_true",
        help="print only one JSON object: states, durations, results and log paths",
    )


def _cmd_run(args: argparse.Namespace) -> int:
    parser = args.run_parser
    if args.kfp is not None:
        _refuse_given(args, parser, LOCAL_ONLY, "--kfp")
        args.host = args.kfp or None
        return kfp_cli.cmd_run(args)
    _refuse_given(args, parser, KFP_ONLY, "--local")
    return _cmd_run_local(args)


def _refuse_given(
    args: argparse.Namespace, parser: argparse.ArgumentParser, dests: tuple[str, ...], mode: str
) -> None:
    given = [d for d in dests if getattr(args, d, None) != parser.get_default(d)]
    if given:
        flag = "--" + given[0].replace("_", "-")
        instead = _AS_PARAM.get(given[0], "leave it out")
        raise UserError(f"{flag} is not an option of a {mode} run: {instead}")


# What a cluster run takes instead of a local run's shortcut.
_AS_PARAM = {
    "workers": "pass --param train_job.workers=N",
    "tokenizer": "pass --param tokenize.tokenizer=gs://...",
    "text_field": "pass --param tokenize.text_field=NAME",
    "corpus": "pass --param corpus=gs://...",
}


def _cmd_run_local(args: argparse.Namespace) -> int:
    from pipelines.runners.local import watch as run_watch

    run = local_run(args)
    flags = (
        (args.verbose, run_watch.VERBOSE),
        (args.quiet, run_watch.QUIET),
        (args.json, run_watch.JSON),
    )
    return run_and_report(run, next((mode for given, mode in flags if given), run_watch.AUTO))


def local_run(args: argparse.Namespace) -> LocalRun:
    """The `LocalRun` the options describe: its step parameter objects resolved once here,
    from their defaults, then --workers, --tokenizer and --text-field, then each --param; its
    folders checked, and this machine read, before anything is written."""
    from components import storage
    from pipelines.runners.local.machine import this_machine
    from pipelines.runners.local.runner import LocalRun

    if not storage.is_gcs(args.root):
        check_folder(args.root, "--root")
    if args.state_dir is not None:
        check_folder(args.state_dir, "--state-dir")
    base = LocalRun(root=args.root, corpus=args.corpus)
    shortcuts = [f"train_job.workers={args.workers}"] if args.workers is not None else []
    if args.tokenizer:
        shortcuts.append(f"tokenize.tokenizer={args.tokenizer}")
    if args.text_field:
        shortcuts.append(f"tokenize.text_field={args.text_field}")
    objects = apply_overrides(
        {p.NAME: p for p in (base.tokenize, base.train_job, base.eval_policy)},
        [*shortcuts, *args.params],
    )
    return LocalRun(
        root=args.root,
        corpus=args.corpus,
        state_dir=args.state_dir,
        config=resolved_config(args),
        tokenize=objects["tokenize"],  # type: ignore[arg-type]
        train_job=objects["train_job"],  # type: ignore[arg-type]
        eval_policy=objects["eval_policy"],  # type: ignore[arg-type]
        machine=this_machine(),
    )


def run_and_report(run: LocalRun, mode: str) -> int:
    """Run `run` as `gptpipe run --local` does, shown in `mode`
    (`run_watch.AUTO`, `VERBOSE`, `QUIET` or `JSON`), and report how it ended; the exit status.

    A failure ends with the failed step, its one-line error and its log, never a traceback.
    """
    from pipelines.runners.local import watch as run_watch

    outcome = run_watch.watch(run, mode)
    failed = outcome.failure is not None
    if mode == run_watch.JSON:
        print(json.dumps(run_watch.outcome_json(outcome), indent=2, default=str))
    where = outcome.log_of(outcome.failed_step)
    if failed and mode == run_watch.QUIET:
        print(f"gptpipe: {_failure_words(outcome)} (log: {where})", file=sys.stderr)
    elif failed:
        print(f"gptpipe: {_failure_words(outcome)}", file=sys.stderr)
        print(f"gptpipe: its log: {where}", file=sys.stderr)
    elif mode == run_watch.QUIET:
        print(run_watch.outcome_line(outcome))
    elif mode != run_watch.JSON:
        _print_summary(outcome.summary or {})
    if mode in (run_watch.AUTO, run_watch.VERBOSE):
        for what, path in run_watch.log_paths(outcome).items():
            print(f"{_LOG_NAMES.get(what, what)}: {path}")
    return 130 if outcome.interrupted else 1 if failed else 0  # 130: the shell's Ctrl-C


_LOG_NAMES = {
    "kfp_local": "kfp.local's output",
    "folder": "each step's log",
    "workers": "trainer workers' logs",
}


def _failure_words(outcome: Outcome) -> str:
    step = outcome.failed_step
    return f"step {step!r} failed: {outcome.error}" if step else f"the run failed: {outcome.error}"


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
    from pipelines.runners.local.watch import step_output

    numbers = step_output(summary, "evaluate", "evaluation")
    blessing = step_output(summary, "evaluate", "blessing")
    pushed = step_output(summary, "push", "pushed_model")
    baseline = blessing.get("baseline_model") or "none (first model: change check skipped)"
    if numbers.get("baseline_nats_per_char") is not None:
        baseline += f" ({_number(numbers['baseline_nats_per_char'], '.4f')} nats/char)"
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
        f"{_number(numbers['eval_nats_per_token'], '.4f')} nats/token, "
        f"{_number(numbers['eval_nats_per_char'], '.4f')} nats/char "
        f"(perplexity {_number(numbers.get('eval_perplexity'), '.2f')})"
    )


def _number(value: object, spec: str) -> str:
    """A metric as lineage stored it: a number, or the string ("nan", "inf") SQL keeps for one."""
    return format(value, spec) if isinstance(value, int | float) else str(value)
