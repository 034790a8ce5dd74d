"""Model FLOPs utilisation on CPU: the trainer's model FLOP/s over a float32 matmul's FLOP/s.

Model FLOP/s = the real trainer's tokens/s (bench/trainer_run.py, one worker, 2 threads) times
its FLOPs per token, 6 N + 6 L T d (bench/flops.py; N is every parameter of trainer/model.py's
GPT, the tied output projection included). The reference is what this machine's TensorFlow
gets from a 2048 x 2048 float32 `tf.matmul` with the same 2 threads, timed in a fresh process
before the trainer runs and after each model size; the figure uses the highest (each is the
best of a few repetitions of half a second), and the trainer's best run at each size: what the
machine showed it can do, so that other load on a shared machine more likely lowers the MFU
than raises it. A value above 100% (every reference slowed more than the trainer) is shown as
not measured, with the number in its note. The d_model 512 runs are peer_bench's when both
run in one `python -m bench` (bench/trainer_run.py caches runs by config). 100% would mean the
whole training step ran at the speed of one large matmul: attention, LayerNorm, GELU, the
softmax and AdamW cost extra.

The curve is at issue 13's shape (4 layers, 8 heads, seq_len 256, batch 8, vocabulary 2048)
with d_model 128, 256 and 512 (MLP 4 x d_model), the trainer in float32 (`train.precision=
float32`) as the reference is; the target is >= 85% at 512. Where the trainer's `auto` policy is
mixed_bfloat16 (a CPU that multiplies bfloat16 natively), one more point: d_model 512 in that
policy (peer_bench's runs) over a bfloat16 2048 x 2048 matmul's FLOP/s, timed the same way.

    python -m bench.mfu_bench --matmul 2048 --threads 2 [--dtype bfloat16]   # the reference
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from bench import flops, trainer_run, workloads
from bench.results import Figure, Target

TIER = "quick"
TARGET = Target(">=", 0.85)
MATMUL_N = 2048
D_MODELS = (128, 256, 512)
ATTEMPTS = {512: 2}  # trainer runs per point, the best counts: at 512, peer_bench's two


def matmul_reference(
    n: int = MATMUL_N, threads: int = workloads.THREADS, dtype: str = "float32"
) -> float:
    """FLOP/s of an n x n matmul in `dtype` in a fresh process with `threads` threads."""
    command = [sys.executable, "-m", "bench.mfu_bench", "--matmul", str(n)]
    command += ["--threads", str(threads), "--dtype", dtype]
    done = subprocess.run(
        command, capture_output=True, text=True, check=True, timeout=300, cwd=trainer_run.REPO
    )
    return float(json.loads(done.stdout.strip().splitlines()[-1])["flops_per_second"])


def _time_matmul(
    n: int, threads: int, dtype: str = "float32", repeats: int = 8, seconds: float = 0.5
) -> float:
    """Best FLOP/s over `repeats` timings of about `seconds` each (runs in this process)."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    a = tf.cast(tf.random.normal((n, n), seed=1), dtype)
    b = tf.cast(tf.random.normal((n, n), seed=2), dtype)
    matmul = tf.function(lambda x, y: tf.matmul(x, y))
    matmul(a, b).numpy()  # trace and warm up
    started = time.perf_counter()
    matmul(a, b).numpy()
    calls = max(1, int(seconds / max(time.perf_counter() - started, 1e-6)))
    best = 0.0
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            out = matmul(a, b)
        out.numpy()
        best = max(best, calls * flops.matmul_flops(n) / (time.perf_counter() - started))
    return best


def _overrides(d_model: int, full: bool, precision: str = "float32") -> tuple[str, ...]:
    steps = workloads.steps(workloads.PEER_STEPS[d_model], full)
    return workloads.peer_overrides(d_model, steps, precision)


def _point(d_model: int, full: bool, reference: float, precision: str = "float32") -> Figure:
    from trainer.config import config_to_dict

    overrides = _overrides(d_model, full, precision)
    steps = workloads.steps(workloads.PEER_STEPS[d_model], full)
    runs = [
        trainer_run.run_trainer("tiny", overrides, attempt=attempt)
        for attempt in range(ATTEMPTS.get(d_model, 1))
    ]
    cfg = trainer_run.config("tiny", overrides)
    m = cfg.model
    params = flops.param_count(m.vocab_size, m.seq_len, m.n_layer, m.d_model, m.d_ff)
    per_token = flops.flops_per_token(params, m.n_layer, m.seq_len, m.d_model)
    tokens_per_s = max(float(run["tokens_per_second"]) for run in runs)
    policy = runs[0].get("precision_policy", precision)
    in_float32 = policy == "float32"
    return Figure(
        name=f"MFU on CPU (model FLOP/s / {MATMUL_N}^2 matmul FLOP/s), d_model {d_model}"
        + ("" if in_float32 else f", {policy} over a bfloat16 matmul"),
        value=flops.mfu(tokens_per_s, per_token, reference),
        unit="%",
        target=TARGET if d_model == 512 and in_float32 else None,
        inputs={
            "config": config_to_dict(cfg),
            "steps": steps,
            "timed_tokens": (steps - 1) * m.seq_len * cfg.train.batch_size,
            "threads": workloads.THREADS,
            "params": params,
            "flops_per_token": per_token,
            "precision_policy": policy,
        },
        details={
            "trainer_tokens_per_s": tokens_per_s,
            "model_flops_per_s": tokens_per_s * per_token,
            "matmul_flops_per_s": reference,
        },
    )


def figures(full: bool) -> list[Figure]:
    samples = [matmul_reference()]
    for d_model in D_MODELS:  # train first, a reference after each size
        for attempt in range(ATTEMPTS.get(d_model, 1)):
            trainer_run.run_trainer("tiny", _overrides(d_model, full), attempt=attempt)
        samples.append(matmul_reference())
    points = [_point(d, full, max(samples)) for d in D_MODELS]
    for p in points:
        p.details["matmul_flops_per_s_samples"] = samples
    policy = workloads.auto_policy()
    if policy == "mixed_bfloat16":
        bf16 = [matmul_reference(dtype="bfloat16")]
        for attempt in range(ATTEMPTS[512]):
            trainer_run.run_trainer("tiny", _overrides(512, full, policy), attempt=attempt)
        bf16.append(matmul_reference(dtype="bfloat16"))
        points.append(_point(512, full, max(bf16), policy))
        points[-1].details["matmul_flops_per_s_samples"] = bf16
    for p in points:
        if p.value is not None and p.value > 1.0:  # faster than a bare matmul: impossible
            p.note = (
                f"{p.value:.0%} measured, impossible: other load slowed every matmul "
                "reference more than the trainer; run again on a quieter machine"
            )
            p.value = None
    return points


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.mfu_bench")
    p.add_argument("--matmul", type=int, help="only time an N x N matmul and print its FLOP/s")
    p.add_argument("--threads", type=int, default=workloads.THREADS)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = p.parse_args(argv)
    if args.matmul:
        flops_per_s = _time_matmul(args.matmul, args.threads, args.dtype)
        print(json.dumps({"flops_per_second": flops_per_s}))
        return
    from bench.results import markdown_table

    print(markdown_table(figures(full=False)))


if __name__ == "__main__":
    main(sys.argv[1:])
