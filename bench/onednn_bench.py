"""What oneDNN is worth to the trainer on this CPU: tokens/s with TF_ENABLE_ONEDNN_OPTS=1 over =0.

TensorFlow 2.19 reads TF_ENABLE_ONEDNN_OPTS once, when it is imported; unset, it turns oneDNN
on only on CPUs with AVX512-VNNI, AVX512-BF16, AVX-VNNI or AMX. The train step sets it to 1
for its workers (components/train/executor.py's WORKER_ENV) and the trainer image does too
(docs/training.md, "CPU: oneDNN"); this measures that choice on the host at hand. Each run is a
fresh process: the real trainer through the local launcher (bench/trainer_run.py) at issue 13's
shape (4 layers, d_model 512, seq_len 256, batch 8, vocabulary 2048) in float32, 2 threads,
its environment's TF_ENABLE_ONEDNN_OPTS 1 or 0, alternating 1, 0, 0, 1, each side's best run
counting; and a bare 2048 x 2048 float32 matmul (bench/mfu_bench.py's reference) both ways,
alternating too. The figures' details say whether this CPU has AVX-512, AVX512-BF16 and AMX.

    python -m bench onednn         # about 5 minutes on 2 cores; in the full tier
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import alternate, mfu_bench, trainer_run, workloads
from bench.results import Figure

TIER = "full"
RUNS = 2  # per side
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")


def cpu_flags(cpuinfo: str) -> list[str]:
    """Which of FLAGS the first `flags` line of /proc/cpuinfo's text lists."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            have = set(value.split())
            return [f for f in FLAGS if f in have]
    return []


def _trainer(steps: int, onednn: str, attempt: int) -> dict[str, Any]:
    overrides = workloads.peer_overrides(512, steps, "float32")
    env = {"TF_ENABLE_ONEDNN_OPTS": onednn}
    return trainer_run.run_trainer("tiny", overrides, attempt=200 + attempt, env=env)


def figures(full: bool) -> list[Figure]:
    steps = workloads.steps(workloads.PEER_STEPS[512], full)
    runs = 2 * RUNS if full else RUNS
    on, off = alternate.abba(
        lambda attempt: _trainer(steps, "1", attempt),
        lambda attempt: _trainer(steps, "0", attempt),
        runs,
    )
    mm_on, mm_off = alternate.abba(
        lambda _attempt: mfu_bench.matmul_reference(env={"TF_ENABLE_ONEDNN_OPTS": "1"}),
        lambda _attempt: mfu_bench.matmul_reference(env={"TF_ENABLE_ONEDNN_OPTS": "0"}),
        runs,
    )
    inputs = {
        "shape": "4L 8H d512 T256 B8 V2048, float32",
        "steps": steps,
        "threads": workloads.THREADS,
        "runs_per_side": runs,
        "cpu_flags": cpu_flags(Path("/proc/cpuinfo").read_text(encoding="utf-8")),
    }
    ours = [float(r["tokens_per_second"]) for r in on]
    theirs = [float(r["tokens_per_second"]) for r in off]
    return [
        Figure(
            name="trainer tokens/s, TF_ENABLE_ONEDNN_OPTS=1 / =0, 4L d512, float32",
            value=max(ours) / max(theirs),
            inputs=inputs,
            details={"onednn_tokens_per_s": ours, "eigen_tokens_per_s": theirs},
        ),
        Figure(
            name="matmul 2048x2048 float32 GFLOP/s, TF_ENABLE_ONEDNN_OPTS=1 / =0",
            value=max(mm_on) / max(mm_off),
            inputs=inputs,
            details={
                "onednn_gflops": [r / 1e9 for r in mm_on],
                "eigen_gflops": [r / 1e9 for r in mm_off],
            },
        ),
    ]


if __name__ == "__main__":
    from bench.results import markdown_table

    print(markdown_table(figures(full=False)))
