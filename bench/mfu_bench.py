"""Model FLOPs utilisation on CPU: the trainer's model FLOP/s over a float32 matmul's FLOP/s,
and the ceiling that the step's own matmuls put on it.

Model FLOP/s = the real trainer's tokens/s (bench/trainer_run.py, one worker, 2 threads) times
its FLOPs per token, 6 N + 6 L T d (trainer/flops.py, the count the trainer's telemetry uses; N
is every parameter of trainer/model.py's GPT that multiplies an activation, the tied output
projection included). The reference is what this machine's TensorFlow gets from a 2048 x 2048
float32 `tf.matmul` with the same 2 threads, timed in a fresh process before the trainer runs
and after each model size; the figure uses the highest (each is the best of a few repetitions
of half a second), and the trainer's best run at each size: what the machine showed it can do,
so that other load on a shared machine more likely lowers the MFU than raises it. A value above
100% (every reference slowed more than the trainer) is shown as not measured, with the number in
its note. The d_model 512 runs are peer_bench's when both run in one `python -m bench`
(bench/trainer_run.py caches runs by config). 100% would mean the whole training step ran at
the speed of one large matmul: attention, LayerNorm, GELU, the softmax and AdamW cost extra.

The ceiling is the MFU the trainer would reach if every op of its step but the matmuls took no
time: the step's matmuls (trainer/flops.py's `step_matmuls`: each Dense layer's three, the
attention's six over the whole T x T scores, the tied head's three) at the model's own shapes,
timed alone in one fresh process right after the same 2048^2 reference, over that reference.
Smaller, transposed and batched matmuls run below the 2048^2 one's rate, and the count holds
only the causal half of the attention matmuls the step runs, so the ceiling is under 100%; an
MFU target above it cannot be met by any change outside the matmul kernels. The ceiling figure's
details also list each distinct matmul of the d_model 512 step timed alone
over the same reference, slowest first, with its share of the matmul time (its note names the
slowest): which shapes the CPU's matmul library runs below its 2048^2 rate.

The curve is at issue 13's shape (4 layers, 8 heads, seq_len 256, batch 8, vocabulary 2048)
with d_model 128, 256 and 512 (MLP 4 x d_model), the trainer in float32 (`train.precision=
float32`) as the reference is; the target is >= 85% at 512. Where the trainer's `auto` policy is
mixed_bfloat16 (a CPU that multiplies bfloat16 natively), one more point: d_model 512 in that
policy (peer_bench's runs) over a bfloat16 2048 x 2048 matmul's FLOP/s, timed the same way.

    python -m bench.mfu_bench --matmul 2048 --threads 2 [--dtype bfloat16]   # the reference
    python -m bench.mfu_bench --ceiling 128,256,512 [--dtype bfloat16]       # and the ceilings
    python -m bench.mfu_bench --rates 512                # each step matmul alone, slowest first
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bench import trainer_run, workloads
from bench.results import Figure, Target
from trainer import flops

TIER = "quick"
TARGET = Target(">=", 0.85)
MATMUL_N = 2048
D_MODELS = (128, 256, 512)
ATTEMPTS = {512: 2}  # trainer runs per point, the best counts: at 512, peer_bench's two


def _child(args: list[str], env: Mapping[str, str] | None = None) -> dict:
    """Run this module with `args` in a fresh process, `env` set over this one's environment;
    its last stdout line, as JSON."""
    command = [sys.executable, "-m", "bench.mfu_bench", *args]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        cwd=trainer_run.REPO,
        env={**os.environ, **env} if env else None,
    )
    result: dict = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def matmul_reference(
    n: int = MATMUL_N,
    threads: int = workloads.THREADS,
    dtype: str = "float32",
    env: Mapping[str, str] | None = None,
) -> float:
    """FLOP/s of an n x n matmul in `dtype` in a fresh process with `threads` threads (and
    `env` over this process's environment: TF_ENABLE_ONEDNN_OPTS, say)."""
    done = _child(["--matmul", str(n), "--threads", str(threads), "--dtype", dtype], env)
    return float(done["flops_per_second"])


def ceilings(
    d_models: tuple[int, ...], full: bool, dtype: str = "float32", threads: int = workloads.THREADS
) -> dict[int, float]:
    """The MFU ceiling at each d_model (the module's docstring), timed in one fresh process."""
    args = ["--ceiling", ",".join(map(str, d_models)), "--threads", str(threads)]
    done = _child([*args, "--dtype", dtype, *(["--full"] if full else [])])
    return {int(d): float(c) for d, c in done["ceilings"].items()}


def matmul_rates(d_model: int, full: bool, threads: int = workloads.THREADS) -> list[dict]:
    """Each distinct matmul of the step at `d_model`, timed alone in one fresh process, over
    the 2048^2 reference timed there: which shapes hold the ceiling down (`_time_rates`)."""
    args = ["--rates", str(d_model), "--threads", str(threads), *(["--full"] if full else [])]
    rates: list[dict] = _child(args)["rates"]
    return rates


def _best_seconds(
    fn: Callable[..., Any], args: Sequence[Any], repeats: int, seconds: float
) -> float:
    """The shortest time of one call of `fn(*args)`, over `repeats` timings of about `seconds`."""
    fn(*args).numpy()  # trace and warm up
    started = time.perf_counter()
    fn(*args).numpy()
    calls = max(1, int(seconds / max(time.perf_counter() - started, 1e-6)))
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        out.numpy()
        best = min(best, (time.perf_counter() - started) / calls)
    return best


def _time_matmul(n: int, threads: int, dtype: str = "float32") -> float:
    """Best FLOP/s of an n x n matmul in `dtype` (runs in this process)."""
    import tensorflow as tf

    _threads(threads)
    a = tf.cast(tf.random.normal((n, n), seed=1), dtype)
    b = tf.cast(tf.random.normal((n, n), seed=2), dtype)
    matmul = tf.function(lambda x, y: tf.matmul(x, y))
    return flops.square_matmul_flops(n) / _best_seconds(matmul, (a, b), 8, 0.5)


def _time_step_matmuls(cfg: Any, dtype: str) -> float:
    """Seconds of one training step's matmuls alone (flops.step_matmuls), best of a few: each
    on operands of its own (so that no two are the same computation for grappler to merge),
    all in one tf.function, as the step has them."""
    import tensorflow as tf

    matmuls = flops.step_matmuls(cfg.model, cfg.train.batch_size)
    operands = [
        (tf.cast(tf.random.normal(mm.a), dtype), tf.cast(tf.random.normal(mm.b), dtype))
        for mm in matmuls
    ]
    flat = [x for pair in operands for x in pair]

    @tf.function
    def step(*tensors: tf.Tensor) -> tf.Tensor:
        products = [
            tf.matmul(a, b, transpose_a=mm.transpose_a, transpose_b=mm.transpose_b)
            for mm, a, b in zip(matmuls, tensors[::2], tensors[1::2], strict=True)
        ]
        # A corner of each product, so that none is pruned and the sum adds nothing to time.
        return tf.add_n([tf.reduce_sum(tf.cast(p[..., :1, :1], tf.float32)) for p in products])

    return _best_seconds(step, flat, 5, 1.0)


def _time_ceilings(d_models: list[int], full: bool, threads: int, dtype: str) -> dict:
    """In this process: the 2048^2 reference, each size's step matmuls, the reference again;
    the ceilings over the higher reference, as the MFU figures take theirs."""
    samples = [_time_matmul(MATMUL_N, threads, dtype)]
    seconds = {}
    for d_model in d_models:
        cfg = trainer_run.config("tiny", _overrides(d_model, full))  # shapes only
        seconds[d_model] = (cfg, _time_step_matmuls(cfg, dtype))
    samples.append(_time_matmul(MATMUL_N, threads, dtype))
    found = {
        str(d): flops.flops_per_token(cfg.model)
        * cfg.train.batch_size
        * cfg.model.seq_len
        / took
        / max(samples)
        for d, (cfg, took) in seconds.items()
    }
    return {"flops_per_second": samples, "ceilings": found}


def _time_rates(d_model: int, full: bool, threads: int) -> dict:
    """In this process: the reference, then each distinct matmul of the step at `d_model`
    alone (float32), ranked by `rank_matmuls`."""
    import tensorflow as tf

    reference = _time_matmul(MATMUL_N, threads)
    cfg = trainer_run.config("tiny", _overrides(d_model, full))
    matmuls = flops.step_matmuls(cfg.model, cfg.train.batch_size)
    seconds = {}
    for mm in dict.fromkeys(matmuls):
        a, b = tf.random.normal(mm.a), tf.random.normal(mm.b)
        product = tf.function(
            lambda x, y, mm=mm: tf.matmul(
                x, y, transpose_a=mm.transpose_a, transpose_b=mm.transpose_b
            )
        )
        seconds[mm] = _best_seconds(product, (a, b), 3, 0.25)
    return {"rates": rank_matmuls(matmuls, seconds, reference)}


def rank_matmuls(
    matmuls: Sequence[flops.Matmul], seconds: dict[flops.Matmul, float], reference: float
) -> list[dict]:
    """Each distinct matmul of a step with its FLOP/s over the `reference` FLOP/s and its share
    of the step's matmul time (repeats counted: each block's run n_layer times), slowest first.
    `seconds`: one run of each, timed alone."""
    total = sum(seconds[mm] for mm in matmuls)
    found = [
        {
            "a": mm.a,
            "b": mm.b,
            "transpose_a": mm.transpose_a,
            "transpose_b": mm.transpose_b,
            "of_reference": mm.flops / took / reference,
            "share_of_matmul_time": took * matmuls.count(mm) / total,
        }
        for mm, took in seconds.items()
    ]
    return sorted(found, key=lambda r: float(r["of_reference"]))


def describe_matmul(rate: dict) -> str:
    """A `rank_matmuls` entry as text: "(2048, 2048) x (512, 2048)T" (T: transposed)."""
    a = f"{tuple(rate['a'])}" + ("T" if rate["transpose_a"] else "")
    return f"{a} x {tuple(rate['b'])}" + ("T" if rate["transpose_b"] else "")


def _threads(threads: int) -> None:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)


def _overrides(d_model: int, full: bool, precision: str = "float32") -> tuple[str, ...]:
    steps = workloads.steps(workloads.PEER_STEPS[d_model], full)
    return workloads.peer_overrides(d_model, steps, precision)


def _point(
    d_model: int, full: bool, reference: float, ceiling: float, precision: str = "float32"
) -> Figure:
    from trainer.config import config_to_dict

    overrides = _overrides(d_model, full, precision)
    steps = workloads.steps(workloads.PEER_STEPS[d_model], full)
    runs = [
        trainer_run.run_trainer("tiny", overrides, attempt=attempt)
        for attempt in range(ATTEMPTS.get(d_model, 1))
    ]
    cfg = trainer_run.config("tiny", overrides)
    m = cfg.model
    per_token = flops.flops_per_token(m)
    tokens_per_s = max(float(run["tokens_per_second"]) for run in runs)
    policy = runs[0].get("precision_policy", precision)
    in_float32 = policy == "float32"
    value = flops.mfu(tokens_per_s, per_token, reference)
    return Figure(
        name=f"MFU on CPU (model FLOP/s / {MATMUL_N}^2 matmul FLOP/s), d_model {d_model}"
        + ("" if in_float32 else f", {policy} over a bfloat16 matmul"),
        value=value,
        unit="%",
        target=TARGET if d_model == 512 and in_float32 else None,
        inputs={
            "config": config_to_dict(cfg),
            "steps": steps,
            "timed_tokens": (steps - 1) * m.seq_len * cfg.train.batch_size,
            "threads": workloads.THREADS,
            "params": flops.matmul_params(m),
            "flops_per_token": per_token,
            "precision_policy": policy,
        },
        details={
            "trainer_tokens_per_s": tokens_per_s,
            "model_flops_per_s": tokens_per_s * per_token,
            "matmul_flops_per_s": reference,
            "ceiling": ceiling,
            "of_ceiling": value / ceiling,
        },
        note=f"{value / ceiling:.0%} of its ceiling, {ceiling:.1%}",
    )


def _ceiling_figure(
    d_model: int, ceiling: float, samples: dict[int, float], rates: list[dict]
) -> Figure:
    # Above 100% can be real: on an AVX2-only EPYC the d_model 512 step's matmuls, smaller
    # than the reference's, ran faster than it (2026-12-02: 107%). Other load slowing the
    # references can do the same, so the note says both.
    note = (
        "above 100%: the step's matmul shapes ran faster than the reference (or other load "
        "slowed the reference: run again if unexpected)"
        if ceiling > 1
        else ""
    )
    if rates:  # the slowest matmul, what a user tuning the shapes would look at first
        slowest = rates[0]
        note = "; ".join(
            n
            for n in (
                note,
                f"slowest matmul {describe_matmul(slowest)} at "
                f"{slowest['of_reference']:.0%} of the reference "
                f"({slowest['share_of_matmul_time']:.0%} of the matmul time)",
            )
            if n
        )
    return Figure(
        name=f"MFU ceiling on CPU, d_model {d_model}: the step's matmuls alone, at the model's "
        f"shapes, over the {MATMUL_N}^2 matmul",
        value=ceiling,
        unit="%",
        inputs={"matmuls": "trainer/flops.py step_matmuls", "threads": workloads.THREADS},
        details={"ceilings_by_d_model": samples, "matmul_rates": rates},
        note=note,
    )


def figures(full: bool) -> list[Figure]:
    samples = [matmul_reference()]
    for d_model in D_MODELS:  # train first, a reference after each size
        for attempt in range(ATTEMPTS.get(d_model, 1)):
            trainer_run.run_trainer("tiny", _overrides(d_model, full), attempt=attempt)
        samples.append(matmul_reference())
    tops = ceilings(D_MODELS, full)
    points = [_checked(_point(d, full, max(samples), tops[d])) for d in D_MODELS]
    for p in points:
        p.details["matmul_flops_per_s_samples"] = samples
    points.append(_ceiling_figure(512, tops[512], tops, matmul_rates(512, full)))
    policy = workloads.auto_policy()
    if policy == "mixed_bfloat16":
        bf16 = [matmul_reference(dtype="bfloat16")]
        for attempt in range(ATTEMPTS[512]):
            trainer_run.run_trainer("tiny", _overrides(512, full, policy), attempt=attempt)
        bf16.append(matmul_reference(dtype="bfloat16"))
        top = ceilings((512,), full, "bfloat16")[512]
        points.append(_checked(_point(512, full, max(bf16), top, policy)))
        points[-1].details["matmul_flops_per_s_samples"] = bf16
    return points


def _checked(point: Figure) -> Figure:
    """`point` (an MFU figure), not measured where it is impossible: above 100% and above its
    ceiling, the whole step faster than a bare matmul and than its own matmuls alone."""
    bound = max(1.0, point.details["ceiling"])
    if point.value is not None and point.value > bound:
        point.note = (
            f"{point.value:.0%} measured, impossible: other load slowed every matmul "
            "reference more than the trainer; run again on a quieter machine"
        )
        point.value = None
    return point


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.mfu_bench")
    p.add_argument("--matmul", type=int, help="only time an N x N matmul and print its FLOP/s")
    p.add_argument("--ceiling", help="only time the step matmuls at these d_models (1,2,...)")
    p.add_argument("--rates", type=int, help="only time each step matmul at this d_model")
    p.add_argument("--full", action="store_true", help="the full tier's configs (--ceiling)")
    p.add_argument("--threads", type=int, default=workloads.THREADS)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = p.parse_args(argv)
    if args.matmul:
        flops_per_s = _time_matmul(args.matmul, args.threads, args.dtype)
        print(json.dumps({"flops_per_second": flops_per_s}))
        return
    if args.rates:
        print(json.dumps(_time_rates(args.rates, args.full, args.threads)))
        return
    if args.ceiling:
        d_models = [int(d) for d in args.ceiling.split(",")]
        print(json.dumps(_time_ceilings(d_models, args.full, args.threads, args.dtype)))
        return
    from bench.results import markdown_table

    print(markdown_table(figures(full=False)))


if __name__ == "__main__":
    main(sys.argv[1:])
