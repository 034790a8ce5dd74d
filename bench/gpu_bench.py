"""GPU benchmark: the trainer's model at gpt2-small's and gpt2-xl's shapes; one JSON line.

    bash bench/gpu.sh                      # on a GPU machine: about 6 minutes, at most 8
    python -m bench.gpu_bench --batch 16   # the same, 16 sequences per GPU
    python -m bench gpu                    # the same figures in bench's table and results.json
    python -m bench.gpu_bench --allow-cpu --shape tiny   # a dry run of the harness on CPU

The model is trainer/model.py's GPT at gpt2-small's shape (12 layers, 12 heads, d_model 768,
d_ff 3072, vocabulary 50257, seq_len 1024) and at gpt2-xl's (48 layers, 25 heads, d_model
1600), with trainer/optimization.py's AdamW, built and compiled by trainer/task.py's
`compiled_model`, so with the trainer's own train step, and trained by `fit` on random tokens
(nothing is downloaded). The run's shape comes from trainer/run_plan.py's `plan_run`, as the
trainer's does: `--batch` sequences per GPU per micro-batch, one micro-batch per step (the
presets' global_batch_tokens cleared) unless a run asks for accumulation. Each configuration
runs in a fresh process (the precision policy is global):

- `bf16_xla`: mixed_bfloat16 with XLA, one GPU: what `auto` picks on one Ampere+ GPU;
- `xl_recompute`: gpt2-xl at seq_len 1024, mixed_bfloat16, XLA, `train.recompute=blocks`
  (each block's activations recomputed in the backward pass), one GPU;
- `bf16`: mixed_bfloat16 without XLA, one GPU;
- `accum4`: `bf16_xla` with `train.global_batch_tokens` set so that each step sums the
  gradients of 4 micro-batches of the same size: accumulation's cost per token;
- `mirrored_xla`: MirroredStrategy over every visible GPU, mixed_bfloat16, XLA on
  (`train.jit_compile=on`, which `auto` leaves off for several replicas), the same batch per GPU;
- `xl`: `xl_recompute` without recomputation (what recomputation costs, or whether the batch
  fits at all without it);
- `fp32`: float32 without XLA, one GPU (TensorFlow uses TF32 tensor cores for it on Ampere+);
- `mirrored`: MirroredStrategy over every visible GPU, mixed_bfloat16, XLA off (the trainer's
  `auto` turns it off for several replicas), the same batch per GPU; on one GPU its figure is
  the strategy's overhead over `bf16`, which is what scaling starts from;
- `bf16_xla_host_syncs`: `bf16_xla` plus a callback that reads the loss and the step counter
  back to the host after every step, as the trainer's callbacks did when issue 13 was filed.

They run in that order, the two MFU targets' first, so that the deadline leaves out the least
important. tokens/s is timed from a synchronised start after the warm-up steps (compiling,
autotuning: 8, gpt2-xl's 4) to the end of the timed ones (40, gpt2-xl's 16), read back. MFU is
model FLOPs (6 N + 6 L T d per token, as trainer/flops.py counts them for the trainer's own
telemetry; recomputation's extra forward pass is not model FLOPs) over the chip's dense bf16
peak, looked up from the device name (H100 SXM and H200: 989 TFLOP/s, H100 PCIe: 756, A100:
312; other chips: null). The JSON line has tokens/s per configuration, MFU (gpt2-small's best
single-GPU bf16 run; gpt2-xl's with and without recomputation), the mixed-precision speed-up
(bf16 / fp32), the XLA speed-up (bf16_xla / bf16), the host-sync cost, the MirroredStrategy
scaling with and without XLA (mirrored / (GPUs x bf16), mirrored_xla / (GPUs x bf16_xla)),
recomputation's speed ratio (xl_recompute / xl) and accumulation's (accum4 over the
one-micro-batch run with the same XLA setting). Without a GPU it prints {"skipped": true, ...}
and exits 0. Configurations that would not finish before DEADLINE_S are reported as not run,
so the script always ends, in time, with its line; none may take more than RUN_CAP_S, so that
one stalled configuration (XLA autotuning, the driver compiling TensorFlow's kernels from PTX
on a chip newer than the wheel's machine code) leaves time for the others, and a run that fails
or times out reports the last lines of its stderr. The probe compiles one small XLA function on
the GPU: where XLA cannot compile there (no ptxas or libdevice), the configurations that are
about XLA (`bf16_xla`, `mirrored_xla`, the host-sync one) report why, and the others run with
`train.jit_compile=off`, without the XLA-fused GELU, rather than all failing. The children get
a CUDA compile cache of 4 GiB (CUDA_CACHE_MAXSIZE, unless set), so kernels compiled from PTX
once are reused by the next.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.results import Figure, Target
from trainer import flops

TIER = "gpu"  # only when named: `python -m bench gpu`, or bench/gpu.sh
TARGET = Target(">=", 0.45)  # gpt2-small's MFU, bf16, best single-GPU run
XL_TARGET = Target(">=", 0.50)  # gpt2-xl's MFU with recomputation (`xl_recompute`)
REPO = Path(__file__).resolve().parents[1]
DEADLINE_S = 440.0  # all runs end by then; gpu.sh's hard limit is 480
RUN_CAP_S = 180.0  # the longest one configuration may take
CUDA_CACHE_BYTES = str(4 << 30)  # the driver's cache of kernels compiled from PTX
WARMUP_STEPS = 8
TIMED_STEPS = 40
ACCUMULATION = 4  # micro-batches per step of `accum4`


@dataclass(frozen=True)
class Run:
    """One configuration: how it trains and at which shape."""

    policy: str  # Keras precision policy
    xla: str  # "on": XLA, not run where XLA does not compile; "off"; "best": XLA where it can
    all_gpus: bool = False  # MirroredStrategy over every visible GPU (else one GPU)
    host_syncs: bool = False  # read the loss and step back to the host after every step
    large: bool = False  # at LARGE[shape] (gpt2-xl) instead of the shape asked for
    overrides: tuple[str, ...] = ()  # config overrides of this run
    accumulation: int = 1  # micro-batches per optimizer step (train.global_batch_tokens)
    warmup_steps: int = WARMUP_STEPS  # optimizer steps before the clock starts
    timed_steps: int = TIMED_STEPS  # optimizer steps timed


_XL = {"large": True, "warmup_steps": 4, "timed_steps": 16}
# Runs in order of importance, as the deadline may leave the last ones out: the two MFU
# targets first. XLA "off" is the step uncompiled with train.jit_compile=auto's XLA-fused GELU
# inside, as the trainer runs on several GPUs (config.use_xla_kernels); so the XLA speed-up is
# over that.
RUNS = {
    "bf16_xla": Run("mixed_bfloat16", "on"),
    "xl_recompute": Run("mixed_bfloat16", "best", overrides=("train.recompute=blocks",), **_XL),
    "bf16": Run("mixed_bfloat16", "off"),
    "accum4": Run("mixed_bfloat16", "best", accumulation=ACCUMULATION),
    "mirrored_xla": Run("mixed_bfloat16", "on", all_gpus=True),
    "xl": Run("mixed_bfloat16", "best", **_XL),
    "fp32": Run("float32", "off"),
    "mirrored": Run("mixed_bfloat16", "off", all_gpus=True),
    "bf16_xla_host_syncs": Run("mixed_bfloat16", "on", host_syncs=True),
}
# Shapes: (preset, overrides). GPT-2's own vocabulary is 50257, not the presets' 32000; the
# presets' global_batch_tokens is cleared, so that a step is one micro-batch per GPU unless a
# run asks for accumulation.
_GPT2 = ("model.vocab_size=50257", "model.seq_len=1024", "model.dropout=0.0")
SHAPES = {
    "gpt2-small": ("gpt2-small", (*_GPT2, "train.global_batch_tokens=0")),
    "gpt2-xl": ("gpt2-xl", (*_GPT2, "train.global_batch_tokens=0")),
    "tiny": ("tiny", ()),  # for a dry run of the harness on CPU only
}
LARGE = {"gpt2-small": "gpt2-xl", "gpt2-xl": "gpt2-xl", "tiny": "tiny"}  # the `large` runs'


def summarize(runs: dict[str, dict[str, Any]], peak_tflops: float | None, gpus: int) -> dict:
    """The headline numbers from each run's {tokens_per_s, flops_per_token} (or {error})."""
    rate = {k: v["tokens_per_s"] for k, v in runs.items() if "tokens_per_s" in v}

    def ratio(a: str, b: str, scale: float = 1.0) -> float | None:
        return rate[a] / (scale * rate[b]) if a in rate and b in rate else None

    # MFU is against the bf16 peak, so only of the runs in bf16: float32 (TF32 on the tensor
    # cores) has its own, lower peak, and a failed bf16 run must not leave it as the headline.
    # Each run counts its own model's FLOPs (6 N + 6 L T d: recomputation's extra forward is
    # not model FLOPs).
    mfu_by_run = {
        k: flops.mfu(r, runs[k]["flops_per_token"], peak_tflops * 1e12 * _replicas(k, gpus))
        for k, r in rate.items()
        if peak_tflops and RUNS[k].policy == "mixed_bfloat16" and not RUNS[k].host_syncs
    }
    single = [k for k in ("bf16_xla", "bf16") if k in mfu_by_run]
    # accumulation's reference: one micro-batch per step, with XLA as accum4 ran
    one_step = "bf16_xla" if runs.get("accum4", {}).get("jit_compile") else "bf16"
    return {
        "tokens_per_s": rate,
        "mfu": max((mfu_by_run[k] for k in single), default=None),
        "xl_mfu_recompute": mfu_by_run.get("xl_recompute"),
        "xl_mfu": mfu_by_run.get("xl"),
        "mfu_by_run": mfu_by_run,
        "mixed_precision_speedup": ratio("bf16", "fp32"),
        "xla_speedup": ratio("bf16_xla", "bf16"),
        "host_syncs_speed_ratio": ratio("bf16_xla_host_syncs", "bf16_xla"),
        # On one GPU: MirroredStrategy's overhead, what scaling over several starts from.
        "mirrored_scaling": ratio("mirrored", "bf16", float(gpus)) if gpus else None,
        "mirrored_xla_scaling": ratio("mirrored_xla", "bf16_xla", float(gpus)) if gpus else None,
        "recompute_speed_ratio": ratio("xl_recompute", "xl"),
        "accumulation_speed_ratio": ratio("accum4", one_step),
    }


def _replicas(name: str, gpus: int) -> int:
    return gpus if RUNS[name].all_gpus else 1


def _python_env() -> dict[str, str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO)}
    env.setdefault("CUDA_CACHE_MAXSIZE", CUDA_CACHE_BYTES)
    return env


def _child(args: list[str], timeout: float) -> dict[str, Any]:
    """Run this module with `args` in a fresh process; the last JSON line it printed (kept even
    if it crashed on its way out), else {"error": ...} with the last lines of its stderr."""
    command = [sys.executable, "-m", "bench.gpu_bench", *args]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=_python_env()
        )
    except subprocess.TimeoutExpired as exc:
        return {"error": f"did not finish in {timeout:.0f} s{_tail(exc.stderr)}"}
    result = last_json(done.stdout)
    if result is None:
        return {"error": f"exit {done.returncode}{_tail(done.stderr or done.stdout)}"}
    return result


def last_json(text: str) -> dict[str, Any] | None:
    """The last line of `text` that is a JSON object, or None."""
    for line in reversed(text.strip().splitlines()):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict):
            return found
    return None


def _tail(output: str | bytes | None, lines: int = 3) -> str:
    """': <the last lines of output>', or '' for none."""
    if isinstance(output, bytes):
        output = output.decode("utf-8", errors="replace")
    kept = (output or "").strip().splitlines()[-lines:]
    return f": {' | '.join(kept)}" if kept else ""


def probe() -> dict[str, Any]:
    """The GPUs TensorFlow sees, and whether XLA compiles on the first (`xla_error`)."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    details = tf.config.experimental.get_device_details(gpus[0]) if gpus else {}
    found = {
        "gpus": len(gpus),
        "device": details.get("device_name", "cpu" if not gpus else "unknown GPU"),
        "compute_capability": details.get("compute_capability"),
        "tensorflow": tf.__version__,
        "xla_error": None,
    }
    try:
        double = tf.function(lambda x: 2.0 * x, jit_compile=True)
        double(tf.ones([2])).numpy()
    except Exception as err:  # noqa: BLE001 -- what XLA said is the point
        found["xla_error"] = _tail(str(err), lines=2).removeprefix(": ")
    return found


def measure_one(name: str, shape: str, batch: int, xla_kernels: bool = True) -> dict[str, Any]:
    """One configuration in this process: tokens/s of `fit` on random tokens. Without
    `xla_kernels` (XLA does not compile here), the step is plain TensorFlow throughout."""
    import tensorflow as tf
    import tf_keras as keras

    from trainer import config as config_lib
    from trainer import run_plan

    run = RUNS[name]
    jit = run.xla == "on" or (run.xla == "best" and xla_kernels)
    gpus = tf.config.list_physical_devices("GPU")
    if gpus and not run.all_gpus:
        tf.config.set_visible_devices(gpus[:1], "GPU")
    strategy = tf.distribute.MirroredStrategy() if run.all_gpus else tf.distribute.get_strategy()
    replicas = strategy.num_replicas_in_sync
    shape = LARGE[shape] if run.large else shape
    cfg = config_lib.resolve_config(*run_config(run, shape, batch, replicas, jit, xla_kernels))
    keras.mixed_precision.set_global_policy(run.policy)
    plan = run_plan.plan_run(cfg, replicas)
    global_batch = plan.global_batch
    gpt = _trainee(strategy, cfg, plan, run.policy, jit)
    m = cfg.model
    rng = tf.random.Generator.from_seed(cfg.train.seed)
    ids = rng.uniform((global_batch, m.seq_len + 1), 0, m.vocab_size, dtype=tf.int32)
    data = tf.data.Dataset.from_tensors((ids[:, :-1], ids[:, 1:])).repeat()
    timer = _timer(run.warmup_steps, run.host_syncs)
    steps = run.warmup_steps + run.timed_steps
    gpt.fit(data, steps_per_epoch=steps, epochs=1, callbacks=[timer], verbose=0)
    return {
        "tokens_per_s": run.timed_steps * global_batch * m.seq_len / timer.seconds,
        "xla_kernels": xla_kernels,
        "flops_per_token": flops.flops_per_token(m),
        "params": gpt.count_params(),
        "shape": shape,
        "replicas": replicas,
        "micro_batch": plan.micro_batch,
        "accumulation": plan.accumulation,
        "global_batch": global_batch,
        "recompute": cfg.train.recompute,
        "policy": run.policy,
        "jit_compile": jit,
    }


def run_config(
    run: Run, shape: str, batch: int, replicas: int, jit: bool, xla_kernels: bool
) -> tuple[str, list[str]]:
    """(preset, overrides) of `run` at `shape` with `batch` sequences per GPU per micro-batch:
    with accumulation, train.global_batch_tokens makes each step `run.accumulation`
    micro-batches per replica (trainer/run_plan.py derives the split)."""
    preset, overrides = SHAPES[shape]
    steps = run.warmup_steps + run.timed_steps
    found = [*overrides, f"train.batch_size={batch}", f"train.train_steps={steps}"]
    found += ["train.warmup_steps=2", f"train.precision={run.policy}", *run.overrides]
    if run.accumulation > 1:
        from trainer import config as config_lib

        seq_len = config_lib.resolve_config(preset, found).model.seq_len
        found.append(f"train.global_batch_tokens={run.accumulation * batch * seq_len * replicas}")
    if jit:
        found.append("train.jit_compile=on")
    elif not xla_kernels:
        found.append("train.jit_compile=off")
    return preset, found


def _trainee(strategy: Any, cfg: Any, plan: Any, policy: str, jit: bool) -> Any:
    """The model `fit` trains, built and compiled by the trainer's own code (trainer/task.py's
    `compiled_model`): the GPT with the trainer's instrumented train step."""
    from trainer import task

    return task.compiled_model(strategy, cfg, plan, policy, jit).trainee


def _timer(warmup: int, host_syncs: bool) -> Any:
    """A Keras callback timing from a synchronised start at batch `warmup` to the read-back
    end; with `host_syncs`, it also reads the loss and step back after every step."""
    import tf_keras as keras

    class Timer(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self._supports_tf_logs = True  # keep logs on the device: no implicit syncs
            self.started = 0.0
            self.seconds = 0.0

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            if batch == warmup:
                int(self.model.optimizer.iterations.numpy())  # wait for the warm-up steps
                self.started = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if host_syncs:
                float(logs["loss"])
                int(self.model.optimizer.iterations.numpy())

        def on_train_end(self, logs: Any = None) -> None:
            int(self.model.optimizer.iterations.numpy())  # wait for the last step
            self.seconds = time.perf_counter() - self.started

    return Timer()


def run_all(
    shape: str,
    batch: int,
    allow_cpu: bool,
    deadline_s: float = DEADLINE_S,
    only: tuple[str, ...] = (),
) -> dict:
    """Probe, run every configuration (or those in `only`) that fits before the deadline,
    summarise."""
    started = time.perf_counter()
    found = _child(["--probe"], timeout=deadline_s)
    base = {
        "bench": "gpu",
        "shape": shape,
        "batch_per_gpu": batch,
        "python": sys.version.split()[0],
    }
    if "error" in found:
        return {**base, "skipped": True, "reason": f"probe failed: {found['error']}"}
    if found["gpus"] == 0 and not allow_cpu:
        reason = "no GPU visible to TensorFlow"
        if _has_nvidia_smi():
            reason += (
                " (nvidia-smi sees one: TensorFlow's CUDA libraries did not load; outside the"
                " trainer image, install tensorflow[and-cuda]==2.19.* in this venv)"
            )
        return {**base, "skipped": True, "reason": reason, **found}
    runs: dict[str, dict[str, Any]] = {}
    xla_error = found.get("xla_error")
    for name, run in RUNS.items():
        if (only and name not in only) or (run.all_gpus and found["gpus"] < 1):
            continue
        if run.xla == "on" and xla_error:
            runs[name] = {"error": f"not run: XLA does not compile here: {xla_error}"}
            continue
        left = deadline_s - (time.perf_counter() - started)
        if left < 30:
            runs[name] = {"error": "not run: out of time"}
            continue
        args = ["--one", name, "--shape", shape, "--batch", str(batch)]
        args += ["--no-xla-kernels"] if xla_error else []
        runs[name] = _child(args, min(left - 5, RUN_CAP_S))
    peak_flops = flops.peak_flops(found["device"]) if found["gpus"] else None
    peak = peak_flops / 1e12 if peak_flops else None
    return {
        **base,
        "skipped": False,
        **found,
        "peak_bf16_tflops": peak,
        **summarize(runs, peak, found["gpus"]),
        "runs": runs,
        "wall_s": round(time.perf_counter() - started, 1),
        "machine": platform.node(),
    }


def _has_nvidia_smi() -> bool:
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def figures(full: bool) -> list[Figure]:
    """bench's table rows from one run_all."""
    out = run_all("gpt2-small", 8, allow_cpu=False)
    if out["skipped"]:
        return [Figure(name="GPU benchmark", value=None, note=f"skipped: {out['reason']}")]
    inputs = {k: out.get(k) for k in ("device", "gpus", "shape", "batch_per_gpu", "tensorflow")}
    rows = [
        ("GPU MFU (bf16, best single-GPU run), gpt2-small", out["mfu"], "%", TARGET),
        ("GPU MFU, gpt2-xl T1024, bf16, recompute=blocks", out["xl_mfu_recompute"], "%", XL_TARGET),
        ("GPU MFU, gpt2-xl T1024, bf16, no recomputation", out["xl_mfu"], "%", None),
        (
            "GPU tokens/s, bf16 + XLA, gpt2-small",
            out["tokens_per_s"].get("bf16_xla"),
            "tok/s",
            None,
        ),
        ("GPU mixed precision speed-up (bf16 / fp32)", out["mixed_precision_speedup"], "x", None),
        ("GPU XLA speed-up (bf16 + XLA / bf16)", out["xla_speedup"], "x", None),
        ("GPU speed with per-step host syncs / without", out["host_syncs_speed_ratio"], "x", None),
        ("GPU MirroredStrategy scaling efficiency", out["mirrored_scaling"], "x", None),
        ("GPU MirroredStrategy + XLA scaling efficiency", out["mirrored_xla_scaling"], "x", None),
        (
            f"GPU tokens/s, accumulation {ACCUMULATION} / 1, same micro-batch",
            out["accumulation_speed_ratio"],
            "x",
            None,
        ),
    ]
    return [
        Figure(name=n, value=v, unit=u, target=t, inputs=inputs, details=out) for n, v, u, t in rows
    ]


def _run_names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in RUNS]
    if unknown or not names:
        what = ", ".join(unknown) or repr(text)
        raise argparse.ArgumentTypeError(
            f"unknown configuration {what}: use some of {', '.join(RUNS)}"
        )
    return names


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.gpu_bench", description=__doc__.split("\n")[0]
    )
    p.add_argument("--batch", type=int, default=8, help="sequences per GPU per step")
    p.add_argument("--shape", choices=sorted(SHAPES), default="gpt2-small")
    p.add_argument("--allow-cpu", action="store_true", help="run without a GPU (a dry run)")
    p.add_argument(
        "--runs",
        type=_run_names,
        default=(),
        help=f"comma-separated configurations to run (default: all of {', '.join(RUNS)})",
    )
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--one", choices=sorted(RUNS), help=argparse.SUPPRESS)
    p.add_argument("--no-xla-kernels", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.probe:
        print(json.dumps(probe()))
    elif args.one:
        print(json.dumps(measure_one(args.one, args.shape, args.batch, not args.no_xla_kernels)))
    else:
        print(json.dumps(run_all(args.shape, args.batch, args.allow_cpu, only=args.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
