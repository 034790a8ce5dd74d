"""`gptpipe kfp ...`: upload, run, schedule and list runs on a KFP API server (docs/operations.md).

The parser and one small command function per subcommand; the work is in
`pipelines.runners.kfp` (`ops`, `schedule`, `runs`). The environment is read here, once
(`_cmd_kfp_api`). `gptpipe run --kfp HOST` is `kfp run` (`run_parents`, `cmd_run`).
"""

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from contracts.errors import UserError
from pipelines.cli.options import (
    config_options,
    image_pull_secret_option,
    param_option,
    resolved_config,
)

# The options of `kfp run` that `gptpipe run --kfp` takes too and `run --local` refuses, by dest.
RUN_ONLY = (
    "token_file",
    "namespace",
    "retries",
    "experiment",
    "pipeline_root",
    "version",
    "file",
    "run_name",
    "wait",
    "poll",
    "mlmd",
)


def _connection_options(with_host: bool = True) -> argparse.ArgumentParser:
    """--host, --token-file, --namespace, --retries: how every subcommand reaches KFP
    (`gptpipe run --kfp HOST` names the host its own way)."""
    conn = argparse.ArgumentParser(add_help=False)
    if with_host:
        conn.add_argument(
            "--host", default=None, help="KFP API URL (default $KF_PIPELINES_ENDPOINT)"
        )
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
    return conn


def _run_options() -> argparse.ArgumentParser:
    """--param, --experiment, --pipeline-root, --config, --set: what a run or schedule runs."""
    params = argparse.ArgumentParser(add_help=False)
    param_option(
        params,
        "a pipeline parameter (JSON when it parses, else a string), or one field of a step's "
        "parameters: tokenize.FIELD, train_job.FIELD, eval_policy.FIELD (contracts.params)",
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
    return params


def _run_only_options() -> argparse.ArgumentParser:
    """What `kfp run` alone takes: which version, the run's name, and waiting for it."""
    run = argparse.ArgumentParser(add_help=False)
    which = run.add_mutually_exclusive_group()
    which.add_argument("--version", default=None, help="uploaded version (default the newest)")
    which.add_argument("--file", type=Path, default=None, help="run a compiled YAML as it is")
    run.add_argument("--run-name", default=None, help="run name (default gptpipe <version>)")
    run.add_argument("--wait", action="store_true", help="follow the run; fail when it fails")
    run.add_argument("--poll", type=float, default=15.0, help="seconds between checks (--wait)")
    run.add_argument("--mlmd", default=None, help="ML Metadata host:port: the failed step's error")
    return run


def run_parents() -> list[argparse.ArgumentParser]:
    """The options of a KFP run but --host, for `gptpipe run`, whose --kfp names the host."""
    return [_connection_options(with_host=False), _run_options(), _run_only_options()]


def add_parser(sub: Any) -> None:
    """Add `gptpipe kfp` and its subcommands to the CLI's subparsers."""
    kfp = sub.add_parser("kfp", help="upload, run and schedule gptpipe on a KFP cluster")
    ops = kfp.add_subparsers(dest="kfp_command", required=True)
    conn = _connection_options()
    params = _run_options()

    upload = ops.add_parser("upload", parents=[conn], help="upload the pipeline as a new version")
    upload.add_argument("--version", default=None, help="version name (default git-<short sha>)")
    source = upload.add_mutually_exclusive_group(required=True)
    source.add_argument("--file", type=Path, default=None, help="a compiled pipeline YAML")
    source.add_argument("--pipeline-root", default=None, help="gs://BUCKET/PATH: compile now")
    upload.add_argument("--lock", type=Path, default=None, help="image digest lock")
    upload.add_argument("--allow-unpinned", action="store_true", help="allow images by tag")
    image_pull_secret_option(upload)
    config_options(upload)
    upload.set_defaults(func=_cmd_kfp_upload)

    run = ops.add_parser(
        "run",
        parents=[conn, params, _run_only_options()],
        help="start a run (also `gptpipe run --kfp HOST`)",
    )
    run.set_defaults(func=cmd_run)

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
    from pipelines.runners.kfp import client

    where = client.endpoint(
        args.host, args.token_file, args.namespace, args.retries, dict(os.environ)
    )
    return client.Api(where)


def _cmd_kfp_upload(args: argparse.Namespace) -> int:
    import tempfile

    from components import provenance
    from pipelines import compiler
    from pipelines.pipeline import Target
    from pipelines.runners.kfp import ops as kfp_ops

    if args.file is not None:
        _refuse_compile_options_with_file(args)
    version = args.version or kfp_ops.default_version(provenance.code_version(os.environ))
    with tempfile.TemporaryDirectory(prefix="gptpipe-kfp-") as tmp:
        package = args.file
        if package is None:
            images = compiler.load_images(args.lock, allow_unpinned=args.allow_unpinned)
            target = Target(images, args.pipeline_root, tuple(args.image_pull_secrets))
            package = compiler.compile_pipeline(
                Path(tmp) / "gptpipe.yaml", target, resolved_config(args)
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


def cmd_run(args: argparse.Namespace) -> int:
    """`gptpipe kfp run` and `gptpipe run --kfp`: start a run on KFP, and follow it with --wait."""
    from pipelines.runners.kfp import ops as kfp_ops

    if not 0 <= args.poll < math.inf:  # NaN too: refused before the run starts
        raise UserError(f"--poll {args.poll}: pass a number of seconds, 0 or more")
    _check_mlmd(args.mlmd)
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
    from pipelines.pipeline import EXIT_TASK

    failures = kfp_ops.failed_tasks(final)
    cleanup = [f for f in failures if f.task == EXIT_TASK]
    if cleanup:
        # The exit task's failure does not fail the run (Argo's exit hook), so say it here:
        # a TFJob it did not delete holds its GPUs until its activeDeadlineSeconds.
        print(
            f"gptpipe: run {run.run_id}: its exit task {EXIT_TASK} failed "
            f"({cleanup[0].error}): a TFJob of this run still running keeps its GPUs; list "
            f"them with `kubectl get tfjobs -l {kfp_ops.run_jobs_selector(str(run.run_id))}`",
            file=sys.stderr,
        )
    if final.state in kfp_ops.SUCCESS_STATES:
        return 0
    steps = [f for f in failures if f.task != EXIT_TASK]
    if args.mlmd:
        try:
            steps = _cmd_kfp_lineage_failure(args.mlmd, str(run.run_id)) or steps
        except UserError as err:  # the run's own failure, as the API has it, still gets told
            print(f"gptpipe: warning: {err}", file=sys.stderr)
    why = "; ".join(f"task {f.task} failed: {f.error}" for f in steps) or "no failed task"
    print(f"gptpipe: run {run.run_id} {final.state}: {why}", file=sys.stderr)
    return 1


def _check_mlmd(address: str | None) -> None:
    """--mlmd names the cluster's ML Metadata service (or a SQLite copy of a store): a path
    that holds none is a mistake, which opening it would turn into a new, empty store."""
    from components import lineage

    if address and not lineage.is_service(address) and not Path(address).expanduser().is_file():
        raise UserError(
            f"--mlmd {address!r}: no such store; give the ML Metadata service as host:port (a "
            "port-forward of metadata-grpc-service: localhost:8080), grpcs://host:port, or a "
            "SQLite file that exists"
        )


def _refuse_compile_options_with_file(args: argparse.Namespace) -> None:
    """`upload --file` uploads the YAML as it was compiled: options that only compiling reads
    would be ignored without a word."""
    from pipelines.config import RunConfig

    given = {
        "--config": args.config != RunConfig().config,
        "--set": bool(args.overrides),
        "--lock": args.lock is not None,
        "--allow-unpinned": args.allow_unpinned,
        "--image-pull-secret": bool(args.image_pull_secrets),
    }
    ignored = [flag for flag, was_given in given.items() if was_given]
    if ignored:
        raise UserError(
            f"--file uploads {args.file} as it was compiled, so {', '.join(ignored)} would be "
            "ignored: pass them to `gptpipe compile`, or compile here with --pipeline-root"
        )


def _config_param(args: argparse.Namespace) -> dict[str, Any]:
    """The `config` run parameter from --config/--set, resolved here; {} to keep the compiled."""
    if args.config is None:
        if args.overrides:
            raise UserError("--set needs --config: name the preset or YAML file it overrides")
        return {}
    if any(p.partition("=")[0].strip() == "config" for p in args.params):
        raise UserError("--param config=... and --config both give the config: pass one")
    from trainer.config import config_to_dict

    return {"config": config_to_dict(resolved_config(args))}


def _cmd_kfp_lineage_failure(store: str, run_id: str) -> list[Any]:
    """The failed step and its one-line error as the step recorded it in ML Metadata."""
    from components import lineage
    from pipelines.runners.kfp import ops as kfp_ops

    found = lineage.failure_of(store, run_id)
    return [kfp_ops.TaskFailure(*found)] if found else []


def _cmd_kfp_schedule(args: argparse.Namespace) -> int:
    from pipelines.runners.kfp import ops as kfp_ops
    from pipelines.runners.kfp import schedule as kfp_schedule

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
    from pipelines.runners.kfp import schedule as kfp_schedule

    count = kfp_schedule.unschedule(_cmd_kfp_api(args), args.name, disable=args.disable)
    if not count:
        print(f"no recurring run named {args.name}: nothing to do")
    else:
        print(
            f"{'paused' if args.disable else 'deleted'} {count} recurring run(s) named {args.name}"
        )
    return 0


def _cmd_kfp_runs(args: argparse.Namespace) -> int:
    from pipelines.runners.kfp import runs as kfp_runs

    _check_mlmd(args.mlmd)
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
