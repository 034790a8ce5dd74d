"""`gptpipe tensorboard`: TensorBoard on a run's training logs, found through lineage.

    gptpipe tensorboard [--run ID | --latest] [--root DIR | --mlmd HOST:PORT] [--port N] [--print]

The train step's work folder is `<artifact_root>/work/<run id>/train/`
(contracts.artifacts.step_work_dir), and the chief writes TensorBoard's files under its
`logs/` (trainer/telemetry.py). The artifact root is read back from lineage, where the tokenize
step recorded it among its parameters, so this finds a local run's logs and a cluster run's on
gs:// alike; a train step KFP took from its cache points to the run that really trained.
`--latest` (the default) is the newest run with a train step. TensorBoard runs as a subprocess
of this Python (`python -m tensorboard.main`, `start_tensorboard`) until Ctrl-C.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

from contracts.artifacts import TENSORBOARD_DIR, step_work_dir
from contracts.errors import UserError
from pipelines.config import DEFAULT_ROOT

DEFAULT_PORT = 6006  # TensorBoard's own default


def add_parser(subparsers: Any) -> None:
    """Add `tensorboard` to the `gptpipe` command's subparsers."""
    tb = subparsers.add_parser("tensorboard", help="TensorBoard on a run's training logs")
    which = tb.add_mutually_exclusive_group()
    which.add_argument("--run", metavar="ID", help="the run whose training to show")
    which.add_argument(
        "--latest", action="store_true", help="the newest run that trained (the default)"
    )
    tb.add_argument(
        "--root",
        default=str(DEFAULT_ROOT),
        help="a local run root, or its --state-dir (default ./runs): holds metadata.sqlite",
    )
    tb.add_argument("--mlmd", metavar="HOST:PORT", help="read lineage from this ML Metadata")
    tb.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    tb.add_argument("--host", default="localhost", help="interface to serve on (localhost)")
    tb.add_argument(
        "--print", dest="print_only", action="store_true", help="only print the log folder"
    )
    tb.set_defaults(func=cmd_tensorboard)


def cmd_tensorboard(args: argparse.Namespace) -> int:
    """Print the run's TensorBoard folder, or serve it until interrupted."""
    from pipelines.cli.lineage import store_address

    store = store_address(args.root, args.mlmd)
    logdir = train_logdir(store, args.run)
    if args.print_only:
        print(logdir)
        return 0
    if not logdir.startswith("gs://") and not Path(logdir).is_dir():
        raise UserError(
            f"no TensorBoard logs at {logdir} yet: the run's chief writes them from its first "
            "training step; try again once training has started"
        )
    server = start_tensorboard(logdir, args.port, args.host)
    print(f"TensorBoard on http://{args.host}:{args.port}/ for {logdir} (Ctrl-C stops it)")
    try:
        return server.wait()
    except KeyboardInterrupt:
        server.terminate()
        server.wait()
        return 0


def train_logdir(store_uri: str, run_id: str | None = None) -> str:
    """The TensorBoard folder of run `run_id`'s training (default: the newest run that trained)."""
    from components import lineage, storage

    run_id = run_id or _latest_trained_run(store_uri)
    summary = lineage.run_summary(store_uri, run_id)  # an unknown run is a UserError
    train = summary["steps"].get("train")
    if train is None:
        raise UserError(f"run {run_id} has no train step: pass the --run of a run that trained")
    cached_from = train["properties"].get("cached_from_run_id")
    if train["state"] == "CACHED" and cached_from and cached_from != run_id:
        return train_logdir(store_uri, str(cached_from))  # KFP reused that run's model
    tokenize = summary["steps"].get("tokenize")
    root = lineage.parameters_of(tokenize).get("artifact_root") if tokenize else None
    if not root:
        raise UserError(
            f"run {run_id}: lineage has no artifact_root for it (recorded by its tokenize step), "
            "so its work folder is unknown"
        )
    return storage.join(str(root), step_work_dir(run_id, "train"), TENSORBOARD_DIR)


def _latest_trained_run(store_uri: str) -> str:
    from components import lineage

    for row in lineage.list_runs(store_uri):
        if "train" in row["steps"]:
            return row["run_id"]
    raise UserError(f"no run in metadata store {store_uri} has trained: run the pipeline first")


def start_tensorboard(logdir: str, port: int, host: str = "localhost") -> subprocess.Popen[bytes]:
    """Start TensorBoard on `logdir` as a subprocess (argv, no shell); the caller stops it.

    TensorBoard 2.19 (the one TensorFlow 2.19 pins) imports `pkg_resources`, which setuptools
    82 removed (tensorflow/tensorboard#7003, fixed in TensorBoard 2.21): pyproject.toml pins
    setuptools below 82 for it.
    """
    argv = ["--logdir", logdir, "--port", str(port), "--host", host]
    return subprocess.Popen([sys.executable, "-m", "tensorboard.main", *argv])
