"""`gptpipe gpu-bench`: the GPU benchmark (bench/gpu_bench.py) as a one-worker TFJob on the cluster.

    gptpipe gpu-bench --namespace NS [--gpus 8] [--node-selector KEY=VALUE] [--toleration JSON]
    gptpipe gpu-bench --manifest ...        # only print the TFJob it would create

It runs in the trainer image of the digest lock, on the nodes and under the scheduling the train
step's TFJobs get (nodeSelector, tolerations, service account, pull secrets), through the same
TFJob launcher (components/jobs/tfjob/launcher.py), so what it measures is what training there will
see: the image's CUDA libraries against the node's driver, the GPUs the pod is given, NCCL
between them (MirroredStrategy over 2+ GPUs), and the trainer's own step at gpt2-small's shape.
Worker 0's log streams to stderr; the benchmark's one JSON line, read back from the finished
pod's log, goes to stdout (and `--output`). A pod whose TensorFlow sees no GPU, a configuration
that failed, and a job that failed or never got scheduled each fail the command, saying which.

The trainer image holds bench/ at BENCH_ROOT (images/Dockerfile copies it there); the worker
finds it through PYTHONPATH.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from secrets import token_hex
from typing import Any, TextIO, cast

from components.jobs.errors import LaunchError, LaunchTimeout
from components.jobs.naming import job_name, run_label
from components.jobs.spec import JobSpec
from components.train.executor import CONTAINER_PYTHON
from contracts.errors import UserError
from pipelines.cli.options import image_pull_secret_option

BENCH_ROOT = "/opt/gptpipe"  # images/Dockerfile's WORKDIR for the sources, bench/ included
# bench/gpu_bench.py's configurations (its RUNS; tests/pipelines/cli/test_gpu_bench.py holds them
# equal): named here too, so that a typo fails before a GPU node is taken and a large image pulled.
RUNS = (
    "bf16_xla",
    "xl_recompute",
    "bf16",
    "accum4",
    "mirrored_xla",
    "xl",
    "fp32",
    "mirrored",
    "bf16_xla_host_syncs",
)
MIRRORED = ("mirrored", "mirrored_xla")  # its runs over every GPU of the worker
SHAPES = ("gpt2-small", "gpt2-xl", "tiny")  # its SHAPES: tiny only for a dry run on CPU
# bench/gpu_bench.py ends its runs by 440 s once it starts; the job's deadline also covers the
# wait for a GPU node (a node pool scaling from zero, its driver install) and the image pull.
DEADLINE_S = 1800
RESULT_LOG_LINES = 200  # of the finished pod's log, read back for the JSON line


def job_spec(
    image: str,
    gpus: int,
    *,
    namespace: str = "kubeflow",
    batch: int = 8,
    runs: Sequence[str] = (),
    allow_cpu: bool = False,
    shape: str = "gpt2-small",
    deadline_s: int = DEADLINE_S,
    bench_root: str = BENCH_ROOT,
    run_id: str = "",
    **placement: Any,
) -> JobSpec:
    """The benchmark's TFJob: one worker with `gpus` GPUs. Under the `ExitCode` policy a worker
    that exits 1-127 fails the job at once and its pod stays, log included; one killed by a
    signal (preemption, out of memory) is restarted by the operator until the deadline: under
    `ExitCode` the manifest sets no operator backoff limit (`manifest.operator_backoff_limit`:
    v1.9's is never counted past 0, and at 0 the operator deletes every pod, log included, at
    the first failure), and this job, applied with kubectl, has no launcher to count.
    `allow_cpu` is the dry run on a CPU node, with no GPU asked for. `placement` is JobSpec's
    scheduling fields (node_selector, tolerations, service_account, image_pull_secrets, cpu, memory,
    allow_unpinned)."""
    _check(gpus, runs, allow_cpu)
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
        gpus_per_worker=gpus,
        restart_policy="ExitCode",
        backoff_limit=1,
        active_deadline_seconds=deadline_s,
        env={"PYTHONPATH": bench_root, "TF_CPP_MIN_LOG_LEVEL": "2"},
        **placement,
    )


def _check(gpus: int, runs: Sequence[str], allow_cpu: bool) -> None:
    if allow_cpu and gpus:
        raise UserError(f"--allow-cpu is the dry run on a CPU node: drop --gpus {gpus}")
    if gpus < 1 and not allow_cpu:
        raise UserError(f"--gpus {gpus}: the benchmark needs at least 1 GPU (or --allow-cpu)")
    unknown = [r for r in runs if r not in RUNS]
    if unknown:
        raise UserError(f"--runs {','.join(unknown)} is unknown: use some of {', '.join(RUNS)}")
    for name in MIRRORED:
        if name in runs and gpus < 2:
            raise UserError(f"--runs {name} needs --gpus 2 or more, not {gpus}")


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
    raise UserError("the benchmark's pod ended without its JSON line: its log is above")


def failed_runs(result: dict[str, Any]) -> dict[str, str]:
    """Configuration -> its error, for each one that ran and failed (out of memory, NCCL...)."""
    return {name: run["error"] for name, run in result.get("runs", {}).items() if "error" in run}


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
    """Run the benchmark's TFJob to the end; its JSON result. A failed job, a pod whose
    TensorFlow saw no GPU (the benchmark skipped), and a cluster that cannot be reached or
    refuses the job are errors naming why."""
    from components.jobs.tfjob.launcher import TFJobLauncher

    tee = _Tee(out if out is not None else sys.stderr)
    with _cluster_errors(spec):
        launcher = TFJobLauncher(api_client, out=cast(TextIO, tee), poll_seconds=10)
        try:
            launcher.run(spec)
        except LaunchError as exc:
            tail = list(exc.log_tail) or _worker0_log(launcher, spec)
            raise UserError(_failure(spec, exc, tail)) from None
    try:
        result = result_of(tee.lines)
    except UserError:  # not streamed (the follower gave up at the job's end): the pod's log
        result = result_of([*tee.lines, *_worker0_log(launcher, spec)])
    if result.get("skipped"):
        reason = str(result.get("reason", ""))
        if reason.startswith("probe failed"):
            raise UserError(f"TFJob {spec.namespace}/{spec.name}: the benchmark's {reason}")
        raise UserError(
            f"TFJob {spec.namespace}/{spec.name} was given {spec.gpus_per_worker} GPU(s) but "
            f"TensorFlow saw none: {reason}. The trainer image's CUDA libraries do not load "
            "against the node's driver, or the container runtime does not expose the GPUs "
            "(the NVIDIA container toolkit); `nvidia-smi` in the pod tells which"
        )
    return result


@contextlib.contextmanager
def _cluster_errors(spec: JobSpec) -> Iterator[None]:
    """The Kubernetes client's errors (a refused request, no answer) as one line naming the
    cluster problem: this command runs from a user's own machine. No credentials at all is
    `kube.default_api_client`'s one line."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    where = f"TFJob {spec.namespace}/{spec.name}"
    try:
        yield
    except ApiException as exc:
        raise UserError(
            f"the Kubernetes API refused {where}: {exc.status} {exc.reason} "
            f"{_api_message(exc)}".rstrip()
        ) from None
    except HTTPError as exc:
        raise UserError(f"cannot reach the Kubernetes API for {where}: {exc}") from None


def _api_message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message", ""))
    except (TypeError, ValueError, AttributeError):
        return ""


def _worker0_log(launcher: Any, spec: JobSpec) -> list[str]:
    """Worker 0's finished log, or none when it cannot be listed (the stream had it anyway)."""
    try:
        return list(launcher.worker0_log(spec, RESULT_LOG_LINES))
    except Exception:  # a convenience on top of the streamed log, never a second failure
        return []


def _failure(spec: JobSpec, exc: LaunchError, tail: Sequence[str]) -> str:
    """A failed benchmark job's message (`tail`: the failing worker's last lines, or worker 0's
    when the launcher had none), with what to look at."""
    message = str(exc)
    if tail and not exc.log_tail:
        message += "\nworker 0's last lines:\n" + "\n".join(f"  | {line}" for line in tail)
    if any("No module named 'bench'" in line for line in tail):
        return (
            f"{message}\nthe trainer image has no bench/: build it again from this checkout "
            "(`make images REGISTRY=...`)"
        )
    # The operator's own deadline (activeDeadlineSeconds) fails the job before the launcher's
    # timeout does: either way, a job that left no log never ran.
    if not tail and (isinstance(exc, LaunchTimeout) or "deadline" in message):
        pod = f"{spec.name}-worker-0"
        return (
            f"{message}\nno log came back: the pod may never have been scheduled (no node with "
            f"{spec.gpus_per_worker} free nvidia.com/gpu) or pulled its image: "
            f"`kubectl -n {spec.namespace} get events --field-selector involvedObject.name={pod}`"
        )
    return message


def add_parser(subparsers: Any) -> None:
    """Add `gpu-bench` to the `gptpipe` command's subparsers."""
    p = subparsers.add_parser(
        "gpu-bench", help="benchmark the trainer on the cluster's GPU nodes (a one-worker TFJob)"
    )
    p.add_argument(
        "--gpus", type=int, default=None, help="GPUs of the worker (default 1; 2+: mirrored)"
    )
    p.add_argument("--batch", type=int, default=8, help="sequences per GPU per step")
    p.add_argument("--runs", default="", help=f"comma-separated, some of {', '.join(RUNS)}")
    p.add_argument("--namespace", default="kubeflow", help="where the TFJob goes")
    p.add_argument("--image", default=None, help="trainer image (default: the digest lock's)")
    p.add_argument("--allow-unpinned", action="store_true", help="allow an image by tag")
    p.add_argument(
        "--node-selector", action="append", default=[], metavar="KEY=VALUE", help="repeatable"
    )
    p.add_argument("--toleration", action="append", default=[], metavar="JSON", help="repeatable")
    p.add_argument("--service-account", default=None, help="the worker's service account")
    image_pull_secret_option(p)
    p.add_argument("--cpu", default=JobSpec.cpu, help=f"CPUs of the worker ({JobSpec.cpu})")
    p.add_argument("--memory", default=JobSpec.memory, help=f"its memory ({JobSpec.memory})")
    p.add_argument(
        "--deadline", type=int, default=DEADLINE_S, help=f"seconds in all ({DEADLINE_S})"
    )
    p.add_argument("--output", type=Path, default=None, help="also write the JSON line here")
    p.add_argument("--manifest", action="store_true", help="only print the TFJob manifest")
    p.add_argument(
        "--allow-cpu", action="store_true", help="a dry run on a CPU node: no GPU, the tiny model"
    )
    p.add_argument("--shape", choices=SHAPES, default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_gpu_bench)


def cmd_gpu_bench(args: argparse.Namespace) -> int:
    """Print the manifest, or run the benchmark and print its JSON line; 1 if a configuration
    failed."""
    from components.jobs.tfjob import manifest as tfjob_manifest

    if args.output is not None:
        _check_output(args.output, args.manifest)
    gpus = args.gpus if args.gpus is not None else (0 if args.allow_cpu else 1)
    spec = job_spec(
        args.image or _locked_trainer_image(args.allow_unpinned),
        gpus,
        namespace=args.namespace,
        batch=args.batch,
        runs=[r for r in args.runs.split(",") if r],
        allow_cpu=args.allow_cpu,
        shape=args.shape or ("tiny" if args.allow_cpu else "gpt2-small"),
        deadline_s=args.deadline,
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
    try:
        result = run(spec)
    except KeyboardInterrupt:  # the launcher has deleted the job by now
        print(f"gptpipe gpu-bench: interrupted; TFJob {spec.name} deleted", file=sys.stderr)
        return 130
    line = json.dumps(result)
    print(line)
    if args.output is not None:
        try:
            args.output.write_text(line + "\n", encoding="utf-8")
        except OSError as exc:
            raise UserError(f"--output {args.output}: {exc.strerror}") from None
    failed = failed_runs(result)
    for name, error in failed.items():
        print(f"gptpipe gpu-bench: {name} failed: {error}", file=sys.stderr)
    if not result.get("tokens_per_s"):
        raise UserError("no configuration was measured (see each one's error above)")
    return 1 if failed else 0


def _check_output(path: Path, manifest: bool) -> None:
    if manifest:
        raise UserError("--output is for the benchmark's result: --manifest prints to stdout")
    if not path.parent.is_dir():
        raise UserError(f"--output {path}: the folder {path.parent} does not exist")


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
