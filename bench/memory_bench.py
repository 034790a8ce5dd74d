"""The memory rule against the CPU train step: its peak bytes in use against trainer/memory.py.

    python -m bench.memory_bench                 # the three shapes, one process each
    python -m bench.memory_bench --rss           # the same, as the process's peak RSS
    python -m bench.memory_bench --probe '{"batch": 8, "overrides": [...]}'   # one shape

Each shape runs in a fresh process (float32, CPU, one replica): the trainer's model, optimizer
and train step as trainer/task.py's `compiled_model` builds them, fed a repeated batch of random
tokens by `fit`, STEPS steps. What it measures is the peak of the bytes TensorFlow's allocator
has handed out, less those in use before the first step (the weights): the process runs with
TF_CPU_ALLOCATOR_USE_BFC=true, so the CPU allocator is the BFC allocator GPUs use, which counts
them (tf.config.experimental.get_memory_info). That is what the estimate models, tensors. The
process's peak RSS (`--rss`: VmHWM, after `5` to /proc/self/clear_refs, under glibc's malloc as
a plain run has it) is larger: glibc keeps freed blocks in per-thread arenas rather than return
them, and oneDNN and XLA's CPU runtime allocate outside TensorFlow's allocator; neither exists
on a GPU. The estimate it is compared with is trainer/memory.py's peak less the weights; there
is no headroom on CPU (no CUDA context). The figures go to docs/training.md ("Memory per GPU");
`figures` holds the three shapes to 15%, tests/trainer/test_memory_measured.py one of them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

from bench.proc_memory import reset_peak, status_kib
from bench.results import Figure, Target

TIER = "quick"
STEPS = 3
WITHIN = Target("<=", 0.15)  # the plan's activations within 15% of the measured
# Three shapes whose steps take a few seconds on 2 cores and allocate hundreds of MB, so that
# the step graph's own memory (tens of MB) is a small part: attention-heavy, MLP-heavy, and
# logits-heavy (a large vocabulary), the last with rotary positions and dropout.
SHAPES: dict[str, dict[str, Any]] = {
    "attention": {
        "batch": 8,
        "overrides": [
            "model.seq_len=512",
            "model.n_layer=4",
            "model.n_head=8",
            "model.d_model=256",
            "model.d_ff=1024",
            "model.vocab_size=2048",
        ],
    },
    "mlp": {
        "batch": 16,
        "overrides": [
            "model.seq_len=128",
            "model.n_layer=6",
            "model.n_head=4",
            "model.d_model=384",
            "model.d_ff=1536",
            "model.vocab_size=2048",
        ],
    },
    "logits": {
        "batch": 8,
        "overrides": [
            "model.seq_len=256",
            "model.n_layer=2",
            "model.n_head=4",
            "model.d_model=256",
            "model.d_ff=1024",
            "model.vocab_size=16384",
            "model.position=rotary",
            "model.dropout=0.1",
        ],
    },
}


def probe(batch: int, overrides: list[str], rss: bool = False) -> dict[str, Any]:
    """Train STEPS steps of the shape in this process; the peak increase and the estimate: of
    the allocator's bytes in use, or with `rss` of the process's resident set."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import gc

    import numpy as np
    import tensorflow as tf

    from trainer import memory, precision, run_plan, task
    from trainer.config import resolve_config

    settings = [f"train.batch_size={batch}", "train.precision=float32", "train.train_steps=10"]
    cfg = resolve_config("tiny", [*overrides, *settings, "train.warmup_steps=1"])
    policy, jit = precision.set_precision_and_choose_xla(cfg, 1, 1)
    plan = run_plan.plan_run(cfg, 1)
    compiled = task.compiled_model(tf.distribute.get_strategy(), cfg, plan, policy, jit)
    ids = np.random.default_rng(0).integers(0, cfg.model.vocab_size, (batch, cfg.model.seq_len))
    data = tf.data.Dataset.from_tensors((ids.astype("int32"), ids.astype("int32"))).repeat()
    gc.collect()
    if rss:
        reset_peak()  # VmHWM from the current RSS
        before = status_kib("VmRSS")
    else:
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        tf.config.experimental.reset_memory_stats("CPU:0")
    compiled.trainee.fit(data, steps_per_epoch=STEPS, epochs=1, verbose=0)
    if rss:
        measured = (status_kib("VmHWM") - before) * 1024
    else:
        measured = tf.config.experimental.get_memory_info("CPU:0")["peak"] - before
    est = memory.estimate(
        cfg.model, batch, policy, weight_decay=cfg.train.weight_decay > 0, recompute=False
    )
    return {
        "policy": policy,
        "measured_bytes": measured,
        "estimated_bytes": est.total - est.weights,
        "estimate": est.to_dict(),
    }


def measure(name: str, batch: int | None = None, rss: bool = False) -> dict[str, Any]:
    """SHAPES[name] (at `batch`, if given) measured in a fresh process (the policy and the
    allocator are global): the allocator's peak, or with `rss` the resident set's."""
    shape = {**SHAPES[name], **({"batch": batch} if batch else {}), "rss": rss}
    env = {k: v for k, v in os.environ.items() if k != "TF_CPU_ALLOCATOR_USE_BFC"}
    if not rss:
        env["TF_CPU_ALLOCATOR_USE_BFC"] = "true"  # read once, when TensorFlow starts
    done = subprocess.run(
        [sys.executable, "-m", "bench.memory_bench", "--probe", json.dumps(shape)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def compare(name: str, rss: bool = False) -> tuple[int, int]:
    """(measured, estimated) bytes that SHAPES[name]'s batch adds over one sequence: the step
    graph's own memory, the optimizer's slots and the weights' copies are the same at both and
    cancel, leaving the activations of the extra sequences."""
    full, one = measure(name, rss=rss), measure(name, batch=1, rss=rss)
    return (
        full["measured_bytes"] - one["measured_bytes"],
        full["estimated_bytes"] - one["estimated_bytes"],
    )


def figures(full: bool) -> list[Figure]:
    """For each shape, how far trainer/memory.py's activations are from the allocator's."""
    found = []
    for name in SHAPES:
        measured, estimated = compare(name)
        found.append(
            Figure(
                name=f"memory plan: |estimate / measured - 1| of activations, {name} shape "
                f"(batch {SHAPES[name]['batch']} over 1, CPU allocator peak)",
                value=abs(estimated / measured - 1),
                target=WITHIN,
                inputs={"shape": SHAPES[name], "measured": measured, "estimated": estimated},
            )
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--probe", default=None, help="one shape as JSON: batch and overrides")
    parser.add_argument("--rss", action="store_true", help="measure the peak RSS instead")
    args = parser.parse_args()
    if args.probe is not None:
        shape = json.loads(args.probe)
        print(json.dumps(probe(shape["batch"], shape["overrides"], shape.get("rss", False))))
        return
    what = "peak RSS" if args.rss else "allocator peak"
    for name in SHAPES:
        measured, estimated = compare(name, args.rss)
        print(
            f"{name}: batch {SHAPES[name]['batch']} over 1, {what}: measured "
            f"{measured / 2**20:.0f} MiB, estimated {estimated / 2**20:.0f} MiB "
            f"(x{estimated / measured:.2f})"
        )


if __name__ == "__main__":
    main()
