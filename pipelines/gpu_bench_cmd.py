"""`gptpipe gpu-bench`: the GPU benchmark (bench/gpu_bench.py) as a one-worker TFJob on the cluster.

    gptpipe gpu-bench --namespace NS [--gpus 8] [--node-selector KEY=VALUE] [--toleration JSON]
    gptpipe gpu-bench --manifest ...        # only print the TFJob it would create

It runs in the trainer image of the digest lock, on the nodes and under the scheduling the train
step's TFJobs get (nodeSelector, tolerations, service account, pull secrets), through the same
launcher (components/train/tfjob.py), so what it measures is what training there will see: the
image's CUDA and cuDNN against the node's driver, the GPUs the device plugin hands the pod, NCCL
between them (MirroredStrategy over 2+ GPUs), and the trainer's own step at gpt2-small's shape.
Worker 0's log streams to stderr; the benchmark's one JSON line goes to stdout (and `--output`).
A pod that sees no GPU fails the command, naming what TensorFlow reported.

The trainer image holds bench/ at BENCH_ROOT (images/Dockerfile copies it there); the worker
finds it through PYTHONPATH.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from secrets import token_hex
from typing import Any, TextIO, cast

from components.train.launcher import JobSpec, job_name, run_label
from contracts.errors import UserError
from pipelines.cli_options import image_pull_secret_option

BENCH_ROOT = "/opt/gptpipe"  # images/Dockerfile's WORKDIR for the sources, bench/ included
CONTAINER_PYTHON = "python"  # the interpreter on the trainer image's PATH
# bench/gpu_bench.py ends its runs by 440 s, after the image pull and the pod's start; the job's
# own deadline stops a pod that never gets that far (stuck pulling, a hung driver).
DEADLINE_S = 1200


def job_spec(
    image: str,
    gpus: int,
    *,
    namespace: str = "kubeflow",
    batch: int = 8,
    runs: Sequence[str] = (),
    allow_cpu: bool = False,
    shape: str = "gpt2-small",
    bench_root: str = BENCH_ROOT,
    run_id: str = "",
    **placement: Any,
) -> JobSpec:
    """The benchmark's TFJob: one worker with `gpus` GPUs, no restarts (a benchmark that failed
    once says so). `runs` is passed on as it is (bench/gpu_bench.py checks the names).
    `placement` is JobSpec's scheduling fields (node_selector, tolerations, service_account,
    image_pull_secrets, cpu, memory, allow_unpinned)."""
    if gpus < 1 and not allow_cpu:
        raise UserError(f"--gpus {gpus}: the benchmark needs at least 1 GPU (or --allow-cpu)")
    # Two benchmarks started in the same second are two jobs, not one re-attached to.
    run_id = run_id or time.strftime("gpu-bench-%Y%m%d-%H%M%S-", time.gmtime()) + token_hex(2)
    command = [CONTAINER_PYTHON, "-m", "bench.gpu_bench", "--batch", str(batch)]
    command += ["--shape", shape, *(["--runs", ",".join(runs)] if runs else [])]
    command += ["--allow-cpu"] if allow_cpu else []
    return JobSpec(
        name=job_name(run_id, "gpu-bench", prefix="gpubench"),
        command=command,
        image=image,
        namespace=namespace,
        run_id=run_label(run_id),
        workers=1,
        gpus_per_worker=max(gpus, 0),
        restart_policy="Never",
        backoff_limit=0,
        active_deadline_seconds=DEADLINE_S,
        env={"PYTHONPATH": bench_root, "TF_CPP_MIN_LOG_LEVEL": "2"},
        **placement,
    )


def result_of(log_lines: Iterable[str]) -> dict[str, Any]:
    """The benchmark's JSON line, the last one in worker 0's log (`[pod] line` or bare)."""
    for line in reversed(list(log_lines)):
        text = line.split("] ", 1)[1] if line.startswith("[") and "] " in line else line
        try:
            found = json.loads(text)
        except ValueError:
            continue
        if isinstance(found, dict) and found.get("bench") == "gpu":
            return found
    raise UserError(
        "the benchmark's pod ended without its JSON line: its log is above (an image without "
        "bench/? build it again with `make images`)"
    )


class _Tee(io.TextIOBase):
    """A text stream that writes to `out` and keeps every line (the launcher's log stream)."""

    def __init__(self, out: TextIO) -> None:
        super().__init__()
        self.out = out
        self.lines: list[str] = []
        self._part = ""

    def write(self, text: str) -> int:
        self.out.write(text)
        *whole, self._part = (self._part + text).split("\n")
        self.lines.extend(whole)
        return len(text)

    def flush(self) -> None:
        self.out.flush()


def run(spec: JobSpec, api_client: Any = None, out: TextIO | None = None) -> dict[str, Any]:
    """Run the benchmark's TFJob to the end; its JSON result. A pod that saw no GPU (the
    benchmark skipped) is an error naming why."""
    from components.train.tfjob import TFJobLauncher

    tee = _Tee(out if out is not None else sys.stderr)
    TFJobLauncher(api_client, out=cast(TextIO, tee), poll_seconds=10).run(spec)
    result = result_of(tee.lines)
    if result.get("skipped"):
        raise UserError(
            f"TFJob {spec.namespace}/{spec.name} saw no GPU: {result.get('reason')} (the image's "
            "CUDA against the node's driver, or the NVIDIA device plugin: `kubectl describe "
            "node` shows nvidia.com/gpu)"
        )
    return result


def add_parser(subparsers: Any) -> None:
    """Add `gpu-bench` to the `gptpipe` command's subparsers."""
    p = subparsers.add_parser(
        "gpu-bench", help="benchmark the trainer on the cluster's GPU nodes (a one-worker TFJob)"
    )
    p.add_argument("--gpus", type=int, default=1, help="GPUs of the worker (2+: MirroredStrategy)")
    p.add_argument("--batch", type=int, default=8, help="sequences per GPU per step")
    p.add_argument(
        "--runs", default="", help="comma-separated configurations (bench/gpu_bench.py's RUNS)"
    )
    p.add_argument("--namespace", default="kubeflow", help="where the TFJob goes")
    p.add_argument("--image", default=None, help="trainer image (default: the digest lock's)")
    p.add_argument("--allow-unpinned", action="store_true", help="allow an image by tag")
    p.add_argument(
        "--node-selector", action="append", default=[], metavar="KEY=VALUE", help="repeatable"
    )
    p.add_argument("--toleration", action="append", default=[], metavar="JSON", help="repeatable")
    p.add_argument("--service-account", default=None, help="the worker's service account")
    p.add_argument("--cpu", default=JobSpec.cpu, help=f"CPU of the worker (default {JobSpec.cpu})")
    p.add_argument(
        "--memory", default=JobSpec.memory, help=f"memory of the worker (default {JobSpec.memory})"
    )
    image_pull_secret_option(p)
    p.add_argument("--output", type=Path, default=None, help="also write the JSON line here")
    p.add_argument("--manifest", action="store_true", help="only print the TFJob manifest")
    p.add_argument("--allow-cpu", action="store_true", help=argparse.SUPPRESS)  # a dry run
    p.add_argument("--shape", default="gpt2-small", help=argparse.SUPPRESS)  # tiny: a dry run
    p.set_defaults(func=cmd_gpu_bench)


def cmd_gpu_bench(args: argparse.Namespace) -> int:
    """Print the manifest, or run the benchmark and print its JSON line."""
    from components.train import tfjob_manifest

    spec = job_spec(
        args.image or _locked_trainer_image(args.allow_unpinned),
        args.gpus,
        namespace=args.namespace,
        batch=args.batch,
        runs=[r for r in args.runs.split(",") if r],
        allow_cpu=args.allow_cpu,
        shape=args.shape,
        node_selector=dict(_key_value(kv) for kv in args.node_selector),
        tolerations=[_toleration(t) for t in args.toleration],
        service_account=args.service_account,
        cpu=args.cpu,
        memory=args.memory,
        image_pull_secrets=tuple(args.image_pull_secrets),
        allow_unpinned=args.allow_unpinned,
    )
    if args.manifest:
        print(tfjob_manifest.render_yaml(spec), end="")
        return 0
    line = json.dumps(run(spec))
    print(line)
    if args.output is not None:
        args.output.write_text(line + "\n", encoding="utf-8")
    return 0


def _locked_trainer_image(allow_unpinned: bool) -> str:
    from pipelines import compiler

    return compiler.load_images(allow_unpinned=allow_unpinned).trainer


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise UserError(f"--node-selector {text!r}: use KEY=VALUE")
    return key, value


def _toleration(text: str) -> dict[str, Any]:
    try:
        found = json.loads(text)
    except ValueError:
        found = None
    if not isinstance(found, dict):
        raise UserError(
            f"--toleration {text!r} is not a JSON object: use e.g. "
            '\'{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}\''
        )
    return found
