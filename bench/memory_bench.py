"""The memory rule against the CPU train step: peak RSS of a few steps against trainer/memory.py.

    python -m bench.memory_bench                       # the three shapes, one process each
    python -m bench.memory_bench --probe '{"batch": 8, "overrides": [...]}'   # one shape

Each shape runs in a fresh process (float32, CPU, one replica): the trainer's model, optimizer
and train step as trainer/task.py's `compiled_model` builds them, fed a repeated batch of random
tokens by `fit`. It resets the process's peak RSS (Linux: `5` to /proc/self/clear_refs) just
before the first step, runs STEPS steps, and reads the peak (VmHWM): the increase is what the
steps allocated on top of the weights (tracing and optimizing the step's graph included). The
estimate it is compared with is trainer/memory.py's peak less the weights, which exist before
the first step; there is no headroom on CPU (no CUDA context, no GPU allocator). The figures go
to docs/training.md ("Memory per GPU"); tests/trainer/test_memory_measured.py asserts them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

STEPS = 3
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


def _rss_kib(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/self/status")


def probe(batch: int, overrides: list[str]) -> dict[str, Any]:
    """Train STEPS steps of the shape in this process; the peak RSS increase and the estimate."""
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
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # resets VmHWM to the current RSS
    before = _rss_kib("VmRSS")
    compiled.trainee.fit(data, steps_per_epoch=STEPS, epochs=1, verbose=0)
    measured = (_rss_kib("VmHWM") - before) * 1024
    est = memory.estimate(cfg.model, batch, policy, recompute=False)
    return {
        "policy": policy,
        "measured_bytes": measured,
        "estimated_bytes": est.total - est.weights,
        "estimate": est.to_dict(),
    }


def measure(name: str, batch: int | None = None) -> dict[str, Any]:
    """SHAPES[name] (at `batch`, if given) measured in a fresh process (the policy and the
    allocator are global)."""
    shape = {**SHAPES[name], **({"batch": batch} if batch else {})}
    done = subprocess.run(
        [sys.executable, "-m", "bench.memory_bench", "--probe", json.dumps(shape)],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def compare(name: str) -> tuple[int, int]:
    """(measured, estimated) bytes that SHAPES[name]'s batch adds over one sequence: the step
    graph's own memory, the optimizer's slots and the gradients are the same at both and
    cancel, leaving the activations of the extra sequences."""
    full, one = measure(name), measure(name, batch=1)
    return (
        full["measured_bytes"] - one["measured_bytes"],
        full["estimated_bytes"] - one["estimated_bytes"],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--probe", default=None, help="one shape as JSON: batch and overrides")
    args = parser.parse_args()
    if args.probe is not None:
        shape = json.loads(args.probe)
        print(json.dumps(probe(shape["batch"], shape["overrides"])))
        return
    for name in SHAPES:
        measured, estimated = compare(name)
        print(
            f"{name}: batch {SHAPES[name]['batch']} over 1: measured {measured / 2**20:.0f} MiB, "
            f"estimated {estimated / 2**20:.0f} MiB (x{estimated / measured:.2f})"
        )


if __name__ == "__main__":
    main()
