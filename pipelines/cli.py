"""The `gptpipe` command line. The environment is read here, once, and passed down."""

import argparse
import dataclasses
import json
import os
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from contracts.errors import UserError
from pipelines.config import DEFAULT_ROOT, RunConfig
from trainer.config import Config, resolve_config

DEFAULT_CORPUS = Path("data") / "tinyshakespeare.txt"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit status."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    warnings.filterwarnings("ignore", category=FutureWarning, module="google")
    args = _parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as err:
        print(f"gptpipe: error: {err}", file=sys.stderr)
        return 2


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
        _add_kfp,
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
    _config_options(run)
    run.add_argument("--workers", type=int, default=None, help="trainer worker processes")
    run.add_argument(
        "--tokenizer", default="", help="SentencePiece model to reuse (default: train one)"
    )
    run.add_argument("--json", action="store_true", help="print the summary as JSON")
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
    comp.add_argument(
        "--image-pull-secret",
        dest="image_pull_secrets",
        action="append",
        default=[],
        metavar="NAME",
        help="a Secret the step pods pull their image with, repeatable",
    )
    _config_options(comp)
    comp.set_defaults(func=_cmd_compile)


def _config_options(parser: argparse.ArgumentParser) -> None:
    """--config and --set: the trainer config, resolved once here and passed on resolved."""
    parser.add_argument(
        "--config",
        default=RunConfig().config,
        help=f"trainer preset or YAML file (default {RunConfig().config})",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="trainer config override, repeatable",
    )


def _resolved_config(args: argparse.Namespace) -> Config:
    """The one place a command resolves the trainer config from its --config and --set."""
    return resolve_config(args.config, args.overrides)


def _add_tfjob_manifest(sub: Any) -> None:
    tfjob = sub.add_parser("tfjob-manifest", help="print the TFJob manifest the train step submits")
    tfjob.add_argument("--workers", type=int, default=RunConfig().workers, help="worker replicas")
    tfjob.add_argument("--gpus-per-worker", type=int, default=RunConfig().gpus_per_worker)
    tfjob.add_argument("--image", default=None, help="trainer image (default: the digest lock's)")
    _config_options(tfjob)
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


def _add_kfp(sub: Any) -> None:
    kfp = sub.add_parser("kfp", help="upload, run and schedule gptpipe on a KFP cluster")
    ops = kfp.add_subparsers(dest="kfp_command", required=True)
    conn = argparse.ArgumentParser(add_help=False)
    conn.add_argument("--host", default=None, help="KFP API URL (default $KF_PIPELINES_ENDPOINT)")
    conn.add_argument(
        "--token-file",
        type=Path,
        default=None,
        help="bearer token file (default $KF_PIPELINES_SA_TOKEN_PATH, then the pod's token)",
    )
    conn.add_argument("--namespace", default="", help="profile namespace on a multi-user KFP")
    conn.add_argument(
        "--retries", type=int, default=None, help="retries after a 5xx or a lost connection"
    )

    upload = ops.add_parser("upload", parents=[conn], help="upload the pipeline as a new version")
    upload.add_argument("--version", default=None, help="version name (default git-<short sha>)")
    source = upload.add_mutually_exclusive_group(required=True)
    source.add_argument("--file", type=Path, default=None, help="a compiled pipeline YAML")
    source.add_argument("--pipeline-root", default=None, help="gs://BUCKET/PATH: compile now")
    upload.add_argument("--lock", type=Path, default=None, help="image digest lock")
    upload.add_argument("--allow-unpinned", action="store_true", help="allow images by tag")
    upload.add_argument(
        "--image-pull-secret",
        dest="image_pull_secrets",
        action="append",
        default=[],
        metavar="NAME",
        help="a Secret the step pods pull their image with, repeatable",
    )
    _config_options(upload)
    upload.set_defaults(func=_cmd_kfp_upload)

    params = argparse.ArgumentParser(add_help=False)
    params.add_argument(
        "--param",
        dest="params",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="pipeline parameter (JSON when it parses, else a string), repeatable",
    )
    params.add_argument("--experiment", default="gptpipe", help="KFP experiment (default gptpipe)")
    params.add_argument(
        "--pipeline-root", default=None, help="gs:// root (default: the compiled one)"
    )
    params.add_argument(
        "--config",
        default=None,
        help="trainer preset or YAML file, resolved here into the config parameter "
        "(default: the one compiled in)",
    )
    params.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="trainer config override on top of --config, repeatable",
    )

    run = ops.add_parser("run", parents=[conn, params], help="start a run")
    which = run.add_mutually_exclusive_group()
    which.add_argument("--version", default=None, help="uploaded version (default the newest)")
    which.add_argument("--file", type=Path, default=None, help="run a compiled YAML as it is")
    run.add_argument("--run-name", default=None, help="run name (default gptpipe <version>)")
    run.add_argument("--wait", action="store_true", help="follow the run; fail when it fails")
    run.add_argument("--poll", type=float, default=15.0, help="seconds between checks (--wait)")
    run.add_argument("--mlmd", default=None, help="ML Metadata host:port: the failed step's error")
    run.set_defaults(func=_cmd_kfp_run)

    sched = ops.add_parser("schedule", parents=[conn, params], help="create or replace a schedule")
    sched.add_argument("--name", required=True, help="recurring run name")
    sched.add_argument("--cron", required=True, help="six fields, seconds first: '0 0 2 * * *'")
    sched.add_argument(
        "--max-concurrency", type=int, default=1, help="runs at once (default 1: one serving dir)"
    )
    sched.add_argument("--no-catchup", action="store_true", help="skip missed firings")
    sched.set_defaults(func=_cmd_kfp_schedule)

    unsched = ops.add_parser("unschedule", parents=[conn], help="delete or pause a schedule")
    unsched.add_argument("--name", required=True, help="recurring run name")
    unsched.add_argument("--disable", action="store_true", help="pause it instead of deleting")
    unsched.set_defaults(func=_cmd_kfp_unschedule)

    runs = ops.add_parser("runs", parents=[conn], help="recent runs")
    runs.add_argument("--limit", type=int, default=10, help="how many (default 10)")
    runs.add_argument("--mlmd", default=None, help="ML Metadata host:port: dataset, pushed version")
    runs.add_argument("--json", action="store_true", help="print the runs as JSON")
    runs.set_defaults(func=_cmd_kfp_runs)


def _cmd_kfp_api(args: argparse.Namespace) -> Any:
    """The connected API for a `gptpipe kfp` command; the environment is read here, once."""
    from pipelines import kfp_client

    where = kfp_client.endpoint(
        args.host, args.token_file, args.namespace, args.retries, dict(os.environ)
    )
    return kfp_client.Api(where)


def _cmd_kfp_upload(args: argparse.Namespace) -> int:
    import tempfile

    from components import provenance
    from pipelines import compiler, kfp_ops
    from pipelines.pipeline import Target

    version = args.version or kfp_ops.default_version(provenance.code_version(os.environ))
    with tempfile.TemporaryDirectory(prefix="gptpipe-kfp-") as tmp:
        package = args.file
        if package is None:
            images = compiler.load_images(args.lock, allow_unpinned=args.allow_unpinned)
            target = Target(images, args.pipeline_root, tuple(args.image_pull_secrets))
            package = compiler.compile_pipeline(
                Path(tmp) / "gptpipe.yaml", target, _resolved_config(args)
            )
        kfp_ops.pipeline_root(kfp_ops.source_from_file(package), None)
        done = kfp_ops.upload(_cmd_kfp_api(args), package, version)
    if done.created_pipeline:
        print(f"created pipeline gptpipe ({done.pipeline_id})")
    if not done.version_id:
        print(f"version {version} of gptpipe already exists: nothing uploaded")
    else:
        print(f"uploaded version {version} of gptpipe ({done.version_id})")
    return 0


def _cmd_kfp_run(args: argparse.Namespace) -> int:
    from pipelines import kfp_ops

    params = {**kfp_ops.parse_params(args.params), **_config_param(args)}
    file_source = kfp_ops.source_from_file(args.file) if args.file else None
    api = _cmd_kfp_api(args)
    source = file_source or kfp_ops.source_from_server(api, args.version)
    root = kfp_ops.pipeline_root(source, args.pipeline_root)
    name = args.run_name or f"gptpipe {source.label}"
    run = kfp_ops.start_run(api, source, args.experiment, params, root, name)
    print(f"started run {run.run_id} of {source.label} (pipeline root {root or 'KFP default'})")
    if not args.wait:
        return 0
    final = kfp_ops.wait(
        api, str(run.run_id), args.poll, lambda state: print(f"run {run.run_id}: {state}")
    )
    if final.state in kfp_ops.SUCCESS_STATES:
        return 0
    failures = kfp_ops.failed_tasks(final)
    if args.mlmd:
        failures = _cmd_kfp_lineage_failure(args.mlmd, str(run.run_id)) or failures
    why = "; ".join(f"task {f.task} failed: {f.error}" for f in failures) or "no failed task"
    print(f"gptpipe: run {run.run_id} {final.state}: {why}", file=sys.stderr)
    return 1


def _config_param(args: argparse.Namespace) -> dict[str, Any]:
    """The `config` run parameter from --config/--set, resolved here; {} to keep the compiled."""
    if args.config is None:
        if args.overrides:
            raise UserError("--set needs --config: name the preset or YAML file it overrides")
        return {}
    from trainer.config import config_to_dict

    return {"config": config_to_dict(_resolved_config(args))}


def _cmd_kfp_lineage_failure(store: str, run_id: str) -> list[Any]:
    """The failed step and its one-line error as the step recorded it in ML Metadata."""
    from components import lineage
    from pipelines import kfp_ops

    found = lineage.failure_of(store, run_id)
    return [kfp_ops.TaskFailure(*found)] if found else []


def _cmd_kfp_schedule(args: argparse.Namespace) -> int:
    from pipelines import kfp_ops, kfp_schedule

    kfp_schedule.check_cron(args.cron)  # before any call: a bad schedule never half-replaces
    params = {**kfp_ops.parse_params(args.params), **_config_param(args)}
    created, replaced = kfp_schedule.schedule(
        _cmd_kfp_api(args),
        args.name,
        args.cron,
        params,
        experiment=args.experiment,
        root=args.pipeline_root,
        max_concurrency=args.max_concurrency,
        no_catchup=args.no_catchup,
    )
    verb = f"replaced {replaced} recurring run(s) named" if replaced else "created recurring run"
    print(
        f"{verb} {args.name} ({created.recurring_run_id}): cron '{args.cron.strip()}', "
        "each firing runs the newest version of gptpipe"
    )
    return 0


def _cmd_kfp_unschedule(args: argparse.Namespace) -> int:
    from pipelines import kfp_schedule

    count = kfp_schedule.unschedule(_cmd_kfp_api(args), args.name, disable=args.disable)
    if not count:
        print(f"no recurring run named {args.name}: nothing to do")
    else:
        print(
            f"{'paused' if args.disable else 'deleted'} {count} recurring run(s) named {args.name}"
        )
    return 0


def _cmd_kfp_runs(args: argparse.Namespace) -> int:
    from pipelines import kfp_runs

    rows = kfp_runs.recent(_cmd_kfp_api(args), args.limit, args.mlmd)
    if args.json:
        print(json.dumps([row.as_dict() for row in rows], indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="gptpipe runs on KFP")
    for column in ("run", "state", "created", "duration", "version", "dataset", "pushed"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(
            f"{row.name}\n{row.run_id}",
            row.state,
            row.created_at,
            row.duration,
            row.version,
            row.dataset_version[:12],
            row.pushed_version,
        )
    Console().print(table)
    return 0


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
    from pipelines import lineage_cmd

    store = lineage_cmd.store_address(args.root, args.mlmd)
    found = lineage_cmd.report(store, lineage_cmd.resolve_model(store, args.model_uri, args.latest))
    if args.json:
        print(json.dumps(found, indent=2, sort_keys=True, default=str))
    else:
        lineage_cmd.print_report(found)
    return 0


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from pipelines import lineage_cmd

    store = lineage_cmd.store_address(args.root, args.mlmd)
    model = lineage_cmd.resolve_model(store, args.model_uri, latest=False)
    pipeline, params = lineage_cmd.reproduce(
        store, model, args.output, allow_unpinned=args.allow_unpinned
    )
    print(f"wrote {pipeline} and {params}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from pipelines import local_runner

    if not args.local:
        raise UserError("only local runs exist so far: use `gptpipe run --local`")
    defaults = local_runner.LocalRun(root=args.root, corpus=args.corpus)
    run = local_runner.LocalRun(
        root=args.root,
        corpus=args.corpus,
        state_dir=args.state_dir,
        config=_resolved_config(args),
        workers=defaults.workers if args.workers is None else args.workers,
        tokenizer=args.tokenizer,
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
    from pipelines.pipeline import Target

    images = compiler.load_images(args.lock, allow_unpinned=args.allow_unpinned)
    target = Target(
        images,
        pipeline_root=args.pipeline_root,
        image_pull_secrets=tuple(args.image_pull_secrets),
    )
    path = compiler.compile_pipeline(args.output, target, _resolved_config(args))
    print(f"wrote {path}")
    return 0


def _cmd_tfjob_manifest(args: argparse.Namespace) -> int:
    from components.train import executor, tfjob_manifest
    from pipelines import compiler

    image = args.image or compiler.load_images(allow_unpinned=args.allow_unpinned).trainer
    spec = executor.job_spec(
        args.examples,
        args.model_dir,
        args.work_dir,
        _resolved_config(args),
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
    from components import lineage, provenance, serving

    if not lineage.is_service(args.metadata) and not Path(args.metadata).is_file():
        raise UserError(
            f"no metadata store at {args.metadata}: pass --metadata, the runs' metadata.sqlite "
            "(or host:port), so the rollback is recorded beside the pushes it undoes"
        )
    params = {"destination": args.destination, "rollback_to": args.to_version}
    run_id = f"rollback-{int(time.time())}"
    found = provenance.detect(provenance.LOCAL_IMAGE, os.environ).properties()
    with lineage.step(args.metadata, "push", "gptpipe", run_id, params, found) as rec:
        source = f"{args.destination.rstrip('/')}/{args.to_version}"
        rec.input("model", "PushedModel", source)
        version = serving.rollback(args.destination, args.to_version)
        target = f"{args.destination.rstrip('/')}/{version}"
        rec.output(
            "pushed_model",
            "PushedModel",
            target,
            {
                "pushed": 1,
                "pushed_destination": args.destination,
                "pushed_version": str(version),
                "reason": f"rollback to version {args.to_version}",
            },
        )
    print(f"version {args.to_version} of {args.destination} is now served as version {version}")
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
