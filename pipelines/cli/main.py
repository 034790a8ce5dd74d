"""The `gptpipe` command line: one module per verb in this folder, assembled here.

The environment is read at this edge (here and in each verb's command function), once, and
passed down.
"""

import argparse
import importlib.metadata
import os
import sys
from collections.abc import Mapping, Sequence

from contracts.errors import UserError
from pipelines.cli import (
    compile,
    doctor,
    gpu_bench,
    kfp,
    lineage,
    model,
    plan,
    report,
    rollback,
    run,
    runs,
    serve,
    tensorboard,
)


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
        on_kfp = getattr(args, "kfp", None) is not None  # gptpipe run --kfp
        started = getattr(args, "kfp_command", "") == "run" or on_kfp
        goes_on = "; a KFP run it started goes on (`gptpipe kfp runs`)" if started else ""
        print(f"gptpipe: interrupted{goes_on}", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gptpipe",
        description="Tokenize, train, evaluate and push GPT models on Kubeflow Pipelines.",
    )
    parser.add_argument(
        "--version",
        action=_Version,
        nargs=0,
        help="print gptpipe's version and its code's git commit, then exit",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for verb in (
        run,  # run
        compile,  # compile, tfjob-manifest
        lineage,  # lineage, reproduce
        rollback,  # rollback
        kfp,  # kfp upload, run, schedule, unschedule, runs
        doctor,  # doctor
        model,  # generate, score
        serve,  # serve
        runs,  # runs
        report,  # report
        tensorboard,  # tensorboard
        gpu_bench,  # gpu-bench
        plan,  # plan
    ):
        verb.add_parser(sub)
    return parser


def version_line(env: Mapping[str, str]) -> str:
    """`gptpipe VERSION (commit COMMIT)`: the installed package's version and the code's commit
    as lineage records it (components/provenance.py: the image's baked-in revision, else this
    checkout's HEAD, "-dirty" with uncommitted changes), each "unknown" where not found."""
    from components import provenance

    try:
        version = importlib.metadata.version("gptpipe")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        version = provenance.UNKNOWN
    return f"gptpipe {version} (commit {provenance.code_version(env)})"


class _Version(argparse.Action):
    """--version, worked out only when given: finding the commit runs git."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(version_line(os.environ))
        parser.exit()
