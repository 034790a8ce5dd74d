"""Activation recomputation (train.recompute=blocks): the train step's peak memory and time.

The shape: 4 layers, d_model 512, 8 heads, MLP 2048, seq_len 1024, batch 8, vocabulary 2048, no
dropout, in the policy `train.precision=auto` picks here, 2 threads. The model is the trainer's
own (`task.compiled_model`, its instrumented train step), trained by `train_on_batch` on one
random batch; its first step (tracing) is never measured.

- peak memory: each setting in a fresh process (`python -m bench.recompute_bench --memory
  SETTING`), none then blocks. What is measured: the process's peak RSS over one train step
  after the first (VmHWM of /proc/self/status, reset after the first step by writing 5 to
  /proc/self/clear_refs) minus its RSS just before the first step (the TensorFlow runtime, the
  model's weights, the batch). So it is what the train step adds: activations, gradients and
  workspace, plus what the first step left allocated (AdamW's slots, the traced graphs), alike
  for both. Ratio blocks / none; target <= 0.60 (40% less).
- step time: both settings' models in one process (`--time`), their steps interleaved (none,
  blocks, blocks, none, ...: a change in the machine's other load hits both alike), each step
  timed to its loss on the host. Ratio: blocks' fastest step over none's, as the other
  benchmarks keep each side's best run; target <= 1.35. The details add the ratio of each
  round, their median, and the ratio of the CPU seconds the steps took, which other load on
  the machine moves less than their wall-clock time.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

from bench import alternate, child, workloads
from bench.proc_memory import reset_peak, status_kib
from bench.results import Figure, Target

TIER = "quick"
SETTINGS = ("none", "blocks")  # train.recompute: the reference, then the one measured
TIME_ROUNDS = 4  # timed steps of each setting, interleaved
CHILD_TIMEOUT_S = 900
SHAPE = (
    "model.vocab_size=2048",
    "model.seq_len=1024",
    "model.n_layer=4",
    "model.n_head=8",
    "model.d_model=512",
    "model.d_ff=2048",
    "model.dropout=0.0",
    "train.batch_size=8",
    "train.warmup_steps=1",
)


class Trainee:
    """One setting's model as the trainer compiles it, and the batch it trains on."""

    def __init__(self, setting: str) -> None:
        import numpy as np
        import tensorflow as tf
        import tf_keras as keras

        from trainer import config as config_lib
        from trainer import precision, run_plan, task

        cfg = config_lib.resolve_config("tiny", SHAPE + (f"train.recompute={setting}",))
        self.policy = precision.host_policy(cfg.train.precision)
        keras.mixed_precision.set_global_policy(self.policy)
        jit = config_lib.use_jit_compile(cfg.train.jit_compile, "cpu", 1)
        plan = run_plan.plan_run(cfg, 1)
        self.model = task.compiled_model(tf.distribute.get_strategy(), cfg, plan, self.policy, jit)
        m = cfg.model
        rng = np.random.default_rng(0)
        ids = rng.integers(0, m.vocab_size, (cfg.train.batch_size, m.seq_len + 1), np.int32)
        self.x, self.y = ids[:, :-1], ids[:, 1:]

    def step(self) -> tuple[float, float]:
        """One train step: its wall-clock seconds, to the loss on the host, and the process's
        CPU seconds meanwhile."""
        started, cpu = time.perf_counter(), time.process_time()
        self.model.trainee.train_on_batch(self.x, self.y)
        return time.perf_counter() - started, time.process_time() - cpu


def _threads() -> None:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(workloads.THREADS)
    tf.config.threading.set_inter_op_parallelism_threads(workloads.THREADS)


def memory_child(setting: str) -> dict[str, Any]:
    """The peak memory of one train step with train.recompute=`setting` (module docstring)."""
    _threads()
    trainee = Trainee(setting)
    before = status_kib("VmRSS")
    first_s, _ = trainee.step()
    first_peak = status_kib("VmHWM")
    reset_peak()
    step_s, _ = trainee.step()
    return {
        "setting": setting,
        "policy": trainee.policy,
        "rss_before_first_step_KiB": before,
        "peak_above_KiB": status_kib("VmHWM") - before,
        "first_step_peak_above_KiB": first_peak - before,
        "first_step_s": round(first_s, 2),
        "step_s": round(step_s, 2),
    }


def time_child() -> dict[str, Any]:
    """Both settings' steps, interleaved in one process (module docstring)."""
    _threads()
    trainees = [Trainee(setting) for setting in SETTINGS]
    for trainee in trainees:
        trainee.step()  # tracing
    plain, blocks = alternate.abba(
        lambda _: trainees[0].step(), lambda _: trainees[1].step(), TIME_ROUNDS
    )
    return {
        "step_s": {"none": [w for w, _ in plain], "blocks": [w for w, _ in blocks]},
        "cpu_s": {"none": [c for _, c in plain], "blocks": [c for _, c in blocks]},
    }


def _run_child(*args: str) -> dict[str, Any]:
    """The JSON a fresh `python -m bench.recompute_bench ARGS` prints last."""
    return child.run("recompute_bench", *args, timeout_s=CHILD_TIMEOUT_S)


def measure_memory(setting: str) -> dict[str, Any]:
    """`memory_child(setting)`, in a fresh process."""
    return _run_child("--memory", setting)


def measure_time() -> dict[str, Any]:
    """`time_child()`, in a fresh process."""
    return _run_child("--time")


def figures(full: bool) -> list[Figure]:
    """Peak memory and step time of train.recompute=blocks over none (module docstring)."""
    from trainer.config import config_to_dict, resolve_config

    memory = {setting: measure_memory(setting) for setting in SETTINGS}
    peak = {setting: memory[setting]["peak_above_KiB"] for setting in SETTINGS}
    timed = measure_time()
    steps, cpu = timed["step_s"], timed["cpu_s"]
    ratios = [b / a for a, b in zip(steps["none"], steps["blocks"], strict=True)]
    inputs = {
        "config": config_to_dict(resolve_config("tiny", SHAPE)),
        "policy": memory["none"]["policy"],
        "threads": workloads.THREADS,
        "time_rounds": TIME_ROUNDS,
    }
    return [
        Figure(
            "train step peak memory, recompute=blocks / none (d512, seq 1024, batch 8)",
            peak["blocks"] / peak["none"],
            target=Target("<=", 0.60),
            inputs=inputs,
            details={"peak_above_KiB": peak, "runs": memory},
        ),
        Figure(
            "train step time, recompute=blocks / none (d512, seq 1024, batch 8)",
            min(steps["blocks"]) / min(steps["none"]),
            target=Target("<=", 1.35),
            inputs=inputs,
            details={
                "step_s": steps,
                "cpu_s": cpu,
                "round_ratios": ratios,
                "median_round_ratio": statistics.median(ratios),
                "cpu_ratio": sum(cpu["blocks"]) / sum(cpu["none"]),
            },
        ),
    ]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--memory"] and len(sys.argv) == 3:
        print(json.dumps(memory_child(sys.argv[2])))
    elif sys.argv[1:] == ["--time"]:
        print(json.dumps(time_child()))
    else:
        print(figures(full=False))
