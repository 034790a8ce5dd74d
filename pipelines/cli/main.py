"""The `gptpipe` command line. The environment is read here, once, and passed down."""

import argparse
import dataclasses
import json
import os
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contracts.errors import UserError
from pipelines.cli import gpu_bench
from pipelines.cli import model as model_cmd
from pipelines.cli import report as report_cmd
from pipelines.cli import runs as runs_cmd
from pipelines.cli import tensorboard as tensorboard_cmd
from pipelines.cli.kfp import add_kfp
from pipelines.cli.options import config_options, image_pull_secret_option, resolved_config
from pipelines.config import DEFAULT_ROOT, RunConfig

if TYPE_CHECKING:  # imported where used: most commands need neither kfp nor rich
    from pipelines.runners.local.runner import LocalRun
    from pipelines.runners.local.watch import Outcome

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
    except KeyboardInterrupt:  # one line, not a traceback
        started = getattr(args, "kfp_command", "") == "run"
        goes_on = "; a KFP run it started goes on (`gptpipe kfp runs`)" if started else ""
        print(f"gptpipe: interrupted{goes_on}", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gptpipe",
        description="Tokenize, train, evaluate and push GPT models on Kubeflow Pipelines.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (
        _add_run,
        _add_compile,
        _add_tfjob_manifest,
        _add_lineage,
        _add_reproduce,
        _add_rollback,
        add_kfp,
        model_cmd.add_parser,  # generate, score
        runs_cmd.add_parser,  # runs
        report_cmd.add_parser,  # report
        tensorboard_cmd.add_parser,  # tensorboard
        gpu_bench.add_parser,  # gpu-bench
    ):
        add(sub)
    return parser


def _add_run(sub: Any) -> None:
    run = sub.add_parser("run", help="run the whole pipeline")
    run.add_argument("--local", action="store_true", help="run on this machine with kfp.local")
    run.add_argument(
        "--root",
        default=str(DEFAULT_ROOT),
        help="run root, local or gs:// (default ./runs); models go to ROOT/serving/",
    )
    run.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="local folder for step artifacts and metadata.sqlite (default: ROOT)",
    )
    run.add_argument("--corpus", default=str(DEFAULT_CORPUS), help="text file, folder or glob")
    config_options(run)
    run.add_argument("--workers", type=int, default=None, help="trainer worker processes")
    run.add_argument(
        "--tokenizer", default="", help="SentencePiece model to reuse (default: train one)"
    )
    shown = run.add_mutually_exclusive_group()
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
    run.set_defaults(func=_cmd_run)


def _add_compile(sub: Any) -> None:
    comp = sub.add_parser("compile", help="write the pipeline YAML for the KFP UI")
    comp.add_argument("--output", type=Path, required=True, help="YAML file to write")
    comp.add_argument(
        "--lock", type=Path, default=None, help="image digest lock (images/digests.json)"
    )
    comp.add_argument("--allow-unpinned", action="store_true", help="allow images without digests")
    comp.add_argument(
        "--pipeline-root",
        required=True,
        help="gs://BUCKET/PATH: KFP's pipeline root and artifact_root's default",
    )
    image_pull_secret_option(comp)
    config_options(comp)
    comp.set_defaults(func=_cmd_compile)


def _add_tfjob_manifest(sub: Any) -> None:
    tfjob = sub.add_parser("tfjob-manifest", help="print the TFJob manifest the train step submits")
    tfjob.add_argument("--workers", type=int, default=RunConfig().workers, help="worker replicas")
    tfjob.add_argument("--gpus-per-worker", type=int, default=RunConfig().gpus_per_worker)
    tfjob.add_argument("--image", default=None, help="trainer image (default: the digest lock's)")
    config_options(tfjob)
    tfjob.add_argument("--examples", default="gs://BUCKET/examples", help="Examples artifact URI")
    tfjob.add_argument("--model-dir", default="gs://BUCKET/model", help="Model artifact URI")
    tfjob.add_argument("--work-dir", default="gs://BUCKET/work/RUN/train", help="checkpoints")
    tfjob.add_argument("--run-id", default="manual", help="pipeline run id (names the job)")
    tfjob.add_argument("--allow-unpinned", action="store_true", help="allow an image by tag")
    tfjob.set_defaults(func=_cmd_tfjob_manifest)


def _add_lineage(sub: Any) -> None:
    lin = sub.add_parser("lineage", help="what produced a pushed model, back to its data")
    lin.add_argument(
        "model_uri",
        nargs="?",
        metavar="MODEL_URI",
        help="a pushed model version (e.g. runs/serving/gpt/1)",
    )
    lin.add_argument("--latest", action="store_true", help="the most recently pushed model")
    _store_options(lin)
    lin.add_argument("--json", action="store_true", help="print the chain as JSON")
    lin.set_defaults(func=_cmd_lineage)


def _add_reproduce(sub: Any) -> None:
    rep = sub.add_parser("reproduce", help="write a pipeline + arguments that redo a model's run")
    rep.add_argument("model_uri", metavar="MODEL_URI", help="a pushed model version")
    rep.add_argument(
        "--output",
        type=Path,
        required=True,
        help="pipeline YAML to write; its arguments go to OUTPUT.params.json",
    )
    _store_options(rep)
    rep.add_argument(
        "--allow-unpinned",
        action="store_true",
        help="reuse recorded image references that carry no digest",
    )
    image_pull_secret_option(rep)  # lineage does not record the original run's
    rep.set_defaults(func=_cmd_reproduce)


def _add_rollback(sub: Any) -> None:
    roll = sub.add_parser("rollback", help="re-publish an earlier model version as the newest")
    roll.add_argument("--destination", required=True, help="serving folder (local or gs://)")
    roll.add_argument("--to", dest="to_version", type=int, required=True, help="version to restore")
    roll.add_argument(
        "--metadata",
        default=str(DEFAULT_ROOT / "metadata.sqlite"),
        help="ML Metadata store: SQLite path or host:port",
    )
    roll.set_defaults(func=_cmd_rollback)


def _store_options(parser: argparse.ArgumentParser) -> None:
    store = parser.add_mutually_exclusive_group()
    store.add_argument("--root", default=None, help="local run root (default ./runs)")
    store.add_argument(
        "--mlmd",
        default=None,
        metavar="HOST:PORT",
        help="an ML Metadata gRPC service, e.g. metadata-grpc-service.kubeflow:8080",
    )


def _cmd_lineage(args: argparse.Namespace) -> int:
    from pipelines.cli import lineage as lineage_cmd

    store = lineage_cmd.store_address(args.root, args.mlmd)
    found = lineage_cmd.report(store, lineage_cmd.resolve_model(store, args.model_uri, args.latest))
    if args.json:
        print(json.dumps(found, indent=2, sort_keys=True, default=str))
    else:
        lineage_cmd.print_report(found)
    return 0


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from pipelines.cli import lineage as lineage_cmd

    store = lineage_cmd.store_address(args.root, args.mlmd)
    model = lineage_cmd.resolve_model(store, args.model_uri, latest=False)
    pipeline, params = lineage_cmd.reproduce(
        store,
        model,
        args.output,
        allow_unpinned=args.allow_unpinned,
        image_pull_secrets=tuple(args.image_pull_secrets),
    )
    print(f"wrote {pipeline} and {params}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from pipelines.runners.local import runner
    from pipelines.runners.local import watch as run_watch

    if not args.local:
        raise UserError("only local runs exist so far: use `gptpipe run --local`")
    defaults = runner.LocalRun(root=args.root, corpus=args.corpus)
    run = runner.LocalRun(
        root=args.root,
        corpus=args.corpus,
        state_dir=args.state_dir,
        config=resolved_config(args),
        workers=defaults.workers if args.workers is None else args.workers,
        tokenizer=args.tokenizer,
    )
    flags = (
        (args.verbose, run_watch.VERBOSE),
        (args.quiet, run_watch.QUIET),
        (args.json, run_watch.JSON),
    )
    return run_and_report(run, next((mode for given, mode in flags if given), run_watch.AUTO))


def run_and_report(run: "LocalRun", mode: str) -> int:
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


def _failure_words(outcome: "Outcome") -> str:
    step = outcome.failed_step
    return f"step {step!r} failed: {outcome.error}" if step else f"the run failed: {outcome.error}"


def _cmd_compile(args: argparse.Namespace) -> int:
    from pipelines import compiler
    from pipelines.pipeline import Target

    images = compiler.load_images(args.lock, allow_unpinned=args.allow_unpinned)
    target = Target(
        images,
        pipeline_root=args.pipeline_root,
        image_pull_secrets=tuple(args.image_pull_secrets),
    )
    path = compiler.compile_pipeline(args.output, target, resolved_config(args))
    print(f"wrote {path}")
    return 0


def _cmd_tfjob_manifest(args: argparse.Namespace) -> int:
    from components.jobs.tfjob import manifest as tfjob_manifest
    from components.train import executor
    from pipelines import compiler

    image = args.image or compiler.load_images(allow_unpinned=args.allow_unpinned).trainer
    spec = executor.job_spec(
        args.examples,
        args.model_dir,
        args.work_dir,
        resolved_config(args),
        launcher="tfjob",
        run_id=args.run_id,
        image=image,
        workers=args.workers,
        gpus_per_worker=args.gpus_per_worker,
    )
    if args.allow_unpinned:
        spec = dataclasses.replace(spec, allow_unpinned=True)
    print(tfjob_manifest.render_yaml(spec), end="")
    return 0


def _cmd_rollback(args: argparse.Namespace) -> int:
    from components import lineage, provenance, serving, storage

    if not lineage.is_service(args.metadata) and not Path(args.metadata).is_file():
        raise UserError(
            f"no metadata store at {args.metadata}: pass --metadata, the runs' metadata.sqlite "
            "(or host:port), so the rollback is recorded beside the pushes it undoes"
        )
    destination = serving.normalize(args.destination)  # as the pushes recorded it
    params = {"destination": destination, "rollback_to": args.to_version}
    # Unique even for two rollbacks in one second: lineage keeps one run per id.
    run_id = f"rollback-{int(time.time())}-{uuid.uuid4().hex[:6]}"
    found = provenance.detect(provenance.LOCAL_IMAGE, os.environ).properties()
    with lineage.step(args.metadata, "push", "gptpipe", run_id, params, found) as rec:
        rec.input(
            "model", lineage.PUSHED_MODEL_TYPE, storage.join(destination, str(args.to_version))
        )
        version = serving.rollback(destination, args.to_version)
        rec.output(
            "pushed_model",
            lineage.PUSHED_MODEL_TYPE,
            storage.join(destination, str(version)),
            {
                "pushed": 1,
                "pushed_destination": destination,
                "pushed_version": str(version),
                "reason": f"rollback to version {args.to_version}",
            },
        )
    print(f"version {args.to_version} of {destination} is now served as version {version}")
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
