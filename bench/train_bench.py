"""Distributed overhead on CPU: 2 workers x 1 thread against 1 worker x 2 threads, and XLA.

Every run is the real trainer (`python -m trainer.task`) started by the `local` launcher
(bench/trainer_run.py), on the `tiny` preset over the bundled corpus tokenized by the tokenize
step, with the same global batch (GLOBAL_BATCH sequences of 64 tokens). tokens/s is the chief's
`tokens_per_second` in train_metrics.json: the steady-state steps, without start-up, tracing,
compiling and export. jit_compile stays `auto` (off on CPU), as users run it. The two
configurations alternate (2 workers, 1 worker, 1 worker, 2 workers) and each one's best run
counts, so that a change in the machine's other load hits both alike.

- distributed overhead: MultiWorkerMirrored (2 processes, RING all-reduce over loopback gRPC,
  1 intra-op and 1 inter-op thread each) over one process with 2+2 threads. Above 1 the
  distributed path is faster on the same cores; below 1 it pays for the all-reduce and the
  per-step preemption check. Target >= 0.9.
- full tier only: the XLA speed-up of one worker (jit_compile=on over off), and what
  jit_compile=on does under MultiWorkerMirrored on CPU: the trainer refuses it (exit 2),
  because XLA cannot compile the cross-worker all-reduce on CPU (docs/training.md).
"""

from __future__ import annotations

from bench import alternate, trainer_run, workloads
from bench.results import Figure, Target

TIER = "quick"
TARGET = Target(">=", 0.9)
GLOBAL_BATCH = 32  # sequences per step in every run
STEPS = 120  # long enough that the timed steps dominate the noise
ROUNDS = 2  # runs of each configuration, alternating: 2w, 1w, 1w, 2w; the best of each counts


def _overrides(workers: int, jit: str, steps: int) -> tuple[str, ...]:
    return workloads.steady_state(steps) + (
        f"train.batch_size={GLOBAL_BATCH // workers}",
        f"train.jit_compile={jit}",
    )


def _tokens_per_s(workers: int, jit: str, steps: int, attempt: int = 0) -> float:
    # Attempts of their own (from 100): not peer_bench's runs of the same configuration, which
    # ran minutes earlier, under other load.
    return trainer_run.tokens_per_second(
        "tiny",
        _overrides(workers, jit, steps),
        workers=workers,
        threads=workloads.THREADS,
        attempt=100 + attempt,
    )


def figures(full: bool) -> list[Figure]:
    from trainer.config import config_to_dict

    steps = workloads.steps(STEPS, full)
    twos, ones = alternate.abba(
        lambda attempt: _tokens_per_s(2, "auto", steps, attempt),
        lambda attempt: _tokens_per_s(1, "auto", steps, attempt),
        ROUNDS,
    )
    two, one = max(twos), max(ones)
    cfg = trainer_run.config("tiny", _overrides(1, "auto", steps))
    inputs = {
        "config": config_to_dict(cfg),
        "global_batch": GLOBAL_BATCH,
        "steps": steps,
        "timed_tokens_per_run": (steps - 1) * GLOBAL_BATCH * cfg.model.seq_len,
        "threads_total": workloads.THREADS,
    }
    found = [
        Figure(
            name="distributed overhead (2 workers x 1 thread / 1 worker x 2 threads), tiny",
            value=two / one,
            target=TARGET,
            inputs=inputs,
            details={"tokens_per_s_2w_1t": twos, "tokens_per_s_1w_2t": ones},
        )
    ]
    if full:
        found += _xla(steps, one, inputs)
    return found


def _xla(steps: int, one: float, inputs: dict) -> list[Figure]:
    from components.jobs.errors import LaunchError

    xla = _tokens_per_s(1, "on", steps)
    try:
        two_xla = f"{_tokens_per_s(2, 'on', steps):.0f} tokens/s"
    except LaunchError as e:
        two_xla = f"failed: {e.reason}, exit {e.exit_code}"
    return [
        Figure(
            name="XLA speed-up on CPU (jit_compile on / off), 1 worker x 2 threads, tiny",
            value=xla / one,
            inputs=inputs,
            details={"tokens_per_s_xla": xla, "tokens_per_s": one, "2_workers_xla": two_xla},
        )
    ]


if __name__ == "__main__":
    from bench.results import markdown_table

    print(markdown_table(figures(full=False)))
