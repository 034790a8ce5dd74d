"""GPU benchmark: the trainer's model at gpt2-small's shape; one JSON line (bench/gpu.sh).

    bash bench/gpu.sh                      # on a GPU machine: about 5 minutes, at most 8
    python -m bench.gpu_bench --batch 16   # the same, 16 sequences per GPU
    python -m bench gpu                    # the same figures in bench's table and results.json
    python -m bench.gpu_bench --allow-cpu --shape tiny   # a dry run of the harness on CPU

The model is trainer/model.py's GPT at gpt2-small's shape (12 layers, 12 heads, d_model 768,
d_ff 3072, vocabulary 50257, seq_len 1024), with trainer/optimization.py's AdamW, built and
compiled by trainer/task.py's `compiled_model`, so with the trainer's own train step, and
trained by `fit` on random tokens (nothing is downloaded). Each configuration runs in a fresh
process (the precision policy is global):

- `bf16_xla`: mixed_bfloat16 with XLA, one GPU: what `auto` picks on one Ampere+ GPU;
- `bf16`: mixed_bfloat16 without XLA, one GPU;
- `fp32`: float32 without XLA, one GPU (TensorFlow uses TF32 tensor cores for it on Ampere+);
- `mirrored`: MirroredStrategy over every visible GPU, mixed_bfloat16, XLA off (the trainer's
  `auto` turns it off for several replicas), the same batch per GPU; on one GPU its figure is
  the strategy's overhead over `bf16`, which is what scaling starts from;
- `bf16_xla_host_syncs`: `bf16_xla` plus a callback that reads the loss and the step counter
  back to the host after every step, as the trainer's callbacks did when issue 13 was filed.

tokens/s is timed from a synchronised start after WARMUP_STEPS (compiling, autotuning) to the
end of TIMED_STEPS more, read back. MFU is model FLOPs (6 N + 6 L T d per token, as
trainer/flops.py counts them for the trainer's own telemetry) over the chip's dense bf16 peak,
looked up from the device name (H100 SXM and H200: 989 TFLOP/s, H100 PCIe: 756, A100: 312;
other chips: null). The JSON line has tokens/s per configuration, MFU, the mixed-precision
speed-up (bf16 / fp32), the XLA speed-up (bf16_xla / bf16), the host-sync cost and the
MirroredStrategy scaling (mirrored / (GPUs x bf16)). Without a GPU it prints
{"skipped": true, ...} and exits 0. Configurations that would not finish before DEADLINE_S are
reported as not run, so the script always ends, in time, with its line; none may take more than
RUN_CAP_S, so that one stalled configuration (XLA autotuning, the driver compiling TensorFlow's
kernels from PTX on a chip newer than the wheel's machine code) leaves time for the others, and
a run that fails or times out reports the last lines of its stderr. The probe compiles one small
XLA function on the GPU: where XLA cannot compile there (no ptxas or libdevice), the XLA
configurations report why and the others run with `train.jit_compile=off`, without the
XLA-fused GELU, rather than all failing. The children get a CUDA compile cache of 4 GiB
(CUDA_CACHE_MAXSIZE, unless set), so kernels compiled from PTX once are reused by the next.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.results import Figure, Target
from trainer import flops

TIER = "gpu"  # only when named: `python -m bench gpu`, or bench/gpu.sh
TARGET = Target(">=", 0.45)
REPO = Path(__file__).resolve().parents[1]
DEADLINE_S = 440.0  # all runs end by then; gpu.sh's hard limit is 480
RUN_CAP_S = 180.0  # the longest one configuration may take
CUDA_CACHE_BYTES = str(4 << 30)  # the driver's cache of kernels compiled from PTX
WARMUP_STEPS = 8
TIMED_STEPS = 40
# Runs in order of importance: MFU first; each is (precision policy, XLA, all GPUs, host syncs).
# XLA False is the step uncompiled with train.jit_compile=auto's XLA-fused GELU inside, as the
# trainer runs on several GPUs (config.use_xla_kernels); so the XLA speed-up is over that.
RUNS = {
    "bf16_xla": ("mixed_bfloat16", True, False, False),
    "bf16": ("mixed_bfloat16", False, False, False),
    "fp32": ("float32", False, False, False),
    "mirrored": ("mixed_bfloat16", False, True, False),
    "bf16_xla_host_syncs": ("mixed_bfloat16", True, False, True),
}
# Shapes: (preset, overrides). gpt2-small's own vocabulary is GPT-2's 50257, not the preset's.
SHAPES = {
    "gpt2-small": (
        "gpt2-small",
        (
            "model.vocab_size=50257",
            "model.seq_len=1024",
            "model.n_layer=12",
            "model.n_head=12",
            "model.d_model=768",
            "model.d_ff=3072",
            "model.dropout=0.0",
        ),
    ),
    "tiny": ("tiny", ()),  # for a dry run of the harness on CPU only
}


def summarize(runs: dict[str, dict[str, Any]], peak_tflops: float | None, gpus: int) -> dict:
    """The headline numbers from each run's {tokens_per_s, flops_per_token} (or {error})."""
    rate = {k: v["tokens_per_s"] for k, v in runs.items() if "tokens_per_s" in v}

    def ratio(a: str, b: str, scale: float = 1.0) -> float | None:
        return rate[a] / (scale * rate[b]) if a in rate and b in rate else None

    per_token = next((v["flops_per_token"] for v in runs.values() if "flops_per_token" in v), 0)
    # MFU is against the bf16 peak, so only of the runs in bf16: float32 (TF32 on the tensor
    # cores) has its own, lower peak, and a failed bf16 run must not leave it as the headline.
    mfu_by_run = {
        k: flops.mfu(r, per_token, peak_tflops * 1e12 * (gpus if k == "mirrored" else 1))
        for k, r in rate.items()
        if peak_tflops and k in ("bf16_xla", "bf16", "mirrored")
    }
    single = [k for k in ("bf16_xla", "bf16") if k in mfu_by_run]
    return {
        "tokens_per_s": rate,
        "mfu": max((mfu_by_run[k] for k in single), default=None),
        "mfu_by_run": mfu_by_run,
        "mixed_precision_speedup": ratio("bf16", "fp32"),
        "xla_speedup": ratio("bf16_xla", "bf16"),
        "host_syncs_speed_ratio": ratio("bf16_xla_host_syncs", "bf16_xla"),
        # On one GPU: MirroredStrategy's overhead, what scaling over several starts from.
        "mirrored_scaling": ratio("mirrored", "bf16", float(gpus)) if gpus else None,
    }


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

    policy, jit, all_gpus, host_syncs = RUNS[name]
    gpus = tf.config.list_physical_devices("GPU")
    if gpus and not all_gpus:
        tf.config.set_visible_devices(gpus[:1], "GPU")
    strategy = tf.distribute.MirroredStrategy() if all_gpus else tf.distribute.get_strategy()
    steps = WARMUP_STEPS + TIMED_STEPS
    preset, shape_overrides = SHAPES[shape]
    overrides = [*shape_overrides, f"train.batch_size={batch}", f"train.train_steps={steps}"]
    overrides += ["train.warmup_steps=2", f"train.precision={policy}"]
    overrides += [] if xla_kernels else ["train.jit_compile=off"]
    cfg = config_lib.resolve_config(preset, overrides)
    keras.mixed_precision.set_global_policy(policy)
    replicas = strategy.num_replicas_in_sync
    plan = run_plan.plan_run(cfg, replicas)
    global_batch = plan.global_batch
    gpt = _trainee(strategy, cfg, plan, policy, jit)
    m = cfg.model
    rng = tf.random.Generator.from_seed(cfg.train.seed)
    ids = rng.uniform((global_batch, m.seq_len + 1), 0, m.vocab_size, dtype=tf.int32)
    data = tf.data.Dataset.from_tensors((ids[:, :-1], ids[:, 1:])).repeat()
    timer = _timer(WARMUP_STEPS, host_syncs)
    gpt.fit(data, steps_per_epoch=steps, epochs=1, callbacks=[timer], verbose=0)
    params = gpt.count_params()
    return {
        "tokens_per_s": TIMED_STEPS * global_batch * m.seq_len / timer.seconds,
        "xla_kernels": xla_kernels,
        "flops_per_token": flops.flops_per_token(m),
        "params": params,
        "replicas": replicas,
        "global_batch": global_batch,
        "policy": policy,
        "jit_compile": jit,
    }


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
    for name, (_policy, jit, all_gpus, _syncs) in RUNS.items():
        if (only and name not in only) or (all_gpus and found["gpus"] < 1):
            continue
        if jit and xla_error:
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
