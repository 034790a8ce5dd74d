"""A run's capacity plan on a GPU type: whether it fits, the micro-batch that fits, its time.

Pure functions (no TensorFlow) over trainer/run_plan.py (the run's shape), trainer/memory.py
(bytes per replica) and trainer/flops.py (FLOPs per token, the chip's peak): what
`gptpipe plan` prints, and the check the train step and `gptpipe kfp run`/`schedule` make before
any worker starts (`check_fits`). Memory is the GPU's less HEADROOM. A local run's CPU workers
share one machine's memory instead (`check_fits_host`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from contracts.errors import UserError
from trainer import memory, shapes
from trainer.config import Config, ConfigError, precision_policy
from trainer.flops import flops_per_token, peak_flops
from trainer.gpus import GIB, Gpu
from trainer.run_plan import RunPlan, plan_run

DEFAULT_MFU = 0.4  # model FLOPs utilisation the time estimates assume (--mfu)


class PlanRefused(UserError):
    """A run that cannot fit its GPUs' memory: one line, naming what to change."""


@dataclass(frozen=True)
class CapacityPlan:
    """One run on `gpu`: its shape, its memory per GPU, and its time at `mfu`."""

    run: RunPlan  # micro-batch, accumulation, steps, warmup, peak LR
    gpu: Gpu  # the GPU type every replica runs on
    policy: str  # the Keras policy train.precision picks on it
    memory: memory.MemoryEstimate  # bytes per GPU at the run's micro-batch
    usable_bytes: int  # the GPU's memory less HEADROOM
    largest_micro_batch: int  # the largest that fits and divides the replica's share; 0: none
    recompute_micro_batch: int  # the same with train.recompute=blocks
    mfu: float  # the utilisation the time figures assume
    tokens_per_second: float | None  # all replicas together; None without the chip's peak

    @property
    def fits(self) -> bool:
        """Whether the run's micro-batch fits."""
        return self.memory.total <= self.usable_bytes

    @property
    def gpu_hours(self) -> float | None:
        """GPU-hours of the whole run (None without a peak, or while a budget sets the steps)."""
        if self.tokens_per_second is None or not self.run.train_tokens:
            return None
        return self.run.train_tokens / self.tokens_per_second * self.run.replicas / 3600

    def to_dict(self) -> dict[str, Any]:
        """The plan as one JSON object (`gptpipe plan --json`)."""
        r = self.run
        return {
            "gpu": self.gpu.name,
            "gpu_memory_bytes": self.gpu.memory_bytes,
            "usable_memory_bytes": self.usable_bytes,
            "gpus": r.replicas,
            "policy": self.policy,
            "micro_batch": r.micro_batch,
            "accumulation_steps": r.accumulation,
            "global_batch_tokens": r.global_batch_tokens,
            "steps": r.steps,
            "warmup_steps": r.warmup_steps,
            "train_tokens": r.train_tokens,
            "peak_learning_rate": r.peak_learning_rate,
            "memory_per_gpu_bytes": self.memory.total,
            "memory": self.memory.to_dict(),
            "memory_with_recompute_bytes": self.memory.total_with(True),
            "memory_without_recompute_bytes": self.memory.total_with(False),
            "fits": self.fits,
            "largest_micro_batch": self.largest_micro_batch,
            "largest_micro_batch_with_recompute": self.recompute_micro_batch,
            "mfu": self.mfu,
            "tokens_per_second": self.tokens_per_second,
            "gpu_hours": self.gpu_hours,
        }


def plan_capacity(
    cfg: Config, replicas: int, gpu: Gpu, mfu: float = DEFAULT_MFU, choose_micro: bool = False
) -> CapacityPlan:
    """The plan of `cfg` on `replicas` GPUs of type `gpu`: at the config's micro-batch
    (train.batch_size), or with `choose_micro` at the largest that fits. ConfigError (one line)
    when the global batch does not split into the replicas (run_plan.split_global_batch)."""
    if not 0 < mfu <= 1:
        raise UserError(f"--mfu {mfu}: give a utilisation in (0, 1], e.g. 0.4")
    if not choose_micro:
        plan_run(cfg, replicas)  # a batch that does not split, named with its own micro-batch
    policy = precision_policy(cfg.train.precision, "gpu", gpu.capability)
    recompute = cfg.train.recompute == "blocks"
    usable = int(gpu.memory_bytes * (1 - memory.HEADROOM))
    largest = largest_micro_batch(cfg, replicas, policy, recompute, usable)
    if choose_micro and largest:
        cfg = with_micro_batch(cfg, largest)
    run = plan_run(cfg, replicas)
    peak = peak_flops(gpu.name)
    return CapacityPlan(
        run=run,
        gpu=gpu,
        policy=policy,
        memory=estimate(cfg, run, policy, recompute),
        usable_bytes=usable,
        largest_micro_batch=largest,
        recompute_micro_batch=largest_micro_batch(cfg, replicas, policy, True, usable),
        mfu=mfu,
        tokens_per_second=mfu * peak * replicas / flops_per_token(cfg.model) if peak else None,
    )


def estimate(cfg: Config, run: RunPlan, policy: str, recompute: bool) -> memory.MemoryEstimate:
    """The memory of `cfg` at `run`'s micro-batch and accumulation (its gradient sums)."""
    return memory.estimate(
        cfg.model,
        run.micro_batch,
        policy,
        recompute,
        accumulation=run.accumulation,
        weight_decay=cfg.train.weight_decay > 0,
    )


def with_micro_batch(cfg: Config, micro: int) -> Config:
    """`cfg` with train.batch_size `micro`."""
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=micro))


def replica_share(cfg: Config, replicas: int) -> int:
    """Sequences per replica per optimizer step: the micro-batches it may split into divide
    it. Without train.global_batch_tokens the micro-batch (train.batch_size) defines the
    global batch, so it is the share."""
    if not cfg.train.global_batch_tokens:
        return cfg.train.batch_size
    step = cfg.model.seq_len * replicas
    tokens = cfg.train.global_batch_tokens
    if tokens % step:
        below = tokens // step * step
        nearest = " or ".join(f"{n:,}" for n in (below, below + step) if n > 0)
        raise ConfigError(
            f"train.global_batch_tokens={tokens:,} does not split into {replicas} replicas of "
            f"{cfg.model.seq_len}-token sequences: give a multiple of {step:,}, e.g. {nearest}"
        )
    return tokens // step


def largest_micro_batch(
    cfg: Config, replicas: int, policy: str, recompute: bool, usable: int
) -> int:
    """The largest micro-batch that fits `usable` bytes and divides the replica's share of the
    global batch (so that accumulation is whole), its gradient sums counted where it
    accumulates; 0 when not even one sequence fits. It is never past the int32 bound on a
    tensor's size (trainer/shapes.py), which no memory lifts."""
    share = replica_share(cfg, replicas)
    most = min(share, shapes.largest_micro_batch(cfg.model))
    for micro in sorted((d for d in range(1, most + 1) if share % d == 0), reverse=True):
        at = with_micro_batch(cfg, micro)
        if estimate(at, plan_run(at, replicas), policy, recompute).total <= usable:
            return micro
    return 0


def check_fits(plan: CapacityPlan) -> None:
    """PlanRefused, in one line naming the fix, when the run's micro-batch does not fit."""
    if plan.fits:
        return
    m = plan.memory
    need, have = m.total / GIB, plan.usable_bytes / GIB
    where = (
        f"micro-batch {plan.run.micro_batch} needs {need:.1f} GiB per GPU, more than the "
        f"{have:.1f} GiB usable of a {plan.gpu.label()} ({memory.HEADROOM:.0%} left free)"
    )
    fixes = []
    if plan.largest_micro_batch:
        fixes.append(f"set train.batch_size={plan.largest_micro_batch}")
    if not m.recompute and plan.recompute_micro_batch:
        smaller = plan.recompute_micro_batch < plan.run.micro_batch
        also = f" with train.batch_size={plan.recompute_micro_batch}" if smaller else ""
        fixes.append(f"set train.recompute=blocks{also}")
    if not fixes:
        state = m.state / GIB
        raise PlanRefused(
            f"{where}: weights, gradients and AdamW state alone take {state:.1f} GiB and every "
            "GPU holds all of them (more GPUs do not help); use GPUs with more memory or a "
            "smaller model"
        )
    raise PlanRefused(f"{where}: {' or '.join(fixes)}, or use GPUs with more memory")


def check_fits_host(cfg: Config, workers: int, memory_bytes: int) -> None:
    """PlanRefused, in one line naming the fix, when `workers` CPU workers on one machine (one
    replica each, every one holding the whole model: trainer/memory.py) obviously cannot train
    `cfg` in `memory_bytes`, the machine's memory.

    "Obviously": where train.precision is auto the estimate is the smaller of the CPU's two
    policies (bfloat16, on a CPU that has it), and it is held against all of the memory, no
    headroom left: a run this refuses cannot run, one it lets through may still run out.
    """
    run = plan_run(cfg, workers)
    policy = precision_policy(cfg.train.precision, "cpu", cpu_bf16=True)
    recompute = cfg.train.recompute == "blocks"
    need = estimate(cfg, run, policy, recompute).total
    if need * workers <= memory_bytes:
        return
    each = "its worker needs" if workers == 1 else f"each of its {workers} workers needs"
    where = (
        f"train.batch_size={cfg.train.batch_size} on this machine: {each} about {size(need)} "
        f"(the model, AdamW's state and a micro-batch of {run.micro_batch:,} sequences' "
        f"activations: trainer/memory.py), {size(need * workers)} in all, more than its "
        f"{size(memory_bytes)} of memory"
    )
    raise PlanRefused(f"{where}: {host_fixes(cfg, run, policy, memory_bytes)}")


def host_fixes(cfg: Config, run: RunPlan, policy: str, memory_bytes: int) -> str:
    """What fits a run of `run.replicas` CPU workers into `memory_bytes` (check_fits_host)."""
    workers, recompute = run.replicas, cfg.train.recompute == "blocks"
    each = memory_bytes // workers
    # A smaller micro-batch keeps the global batch by accumulating (gradient sums included).
    kept = dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, global_batch_tokens=run.global_batch_tokens)
    )
    global_tokens = f"train.global_batch_tokens={run.global_batch_tokens}"
    keep = [] if cfg.train.global_batch_tokens else [global_tokens]
    fixes = []
    largest = largest_micro_batch(kept, workers, policy, recompute, each)
    if largest:
        fixes.append(_settings([f"train.batch_size={largest}", *keep]))
    rebuilt = 0 if recompute else largest_micro_batch(kept, workers, policy, True, each)
    if rebuilt >= run.micro_batch:
        fixes.append(_settings(["train.recompute=blocks"]))
    elif rebuilt > largest:
        fixes.append(_settings(["train.recompute=blocks", f"train.batch_size={rebuilt}", *keep]))
    fewer = next(
        (n for n in range(workers - 1, 0, -1) if _fits_host(cfg, n, policy, memory_bytes)), 0
    )
    if fewer:
        fixes.append(f"use {fewer} worker{'s' if fewer > 1 else ''}")
    if fixes:
        return ", or ".join(fixes)
    state = estimate(cfg, run, policy, recompute).state
    return (
        f"the weights, gradients and AdamW state alone take {size(state)} a worker; "
        "train a smaller model, or on a machine with more memory"
    )


def _settings(settings: list[str]) -> str:
    """`set a`, `set a and b`, `set a, b and c`."""
    *first, last = settings
    return f"set {', '.join(first)} and {last}" if first else f"set {last}"


def _fits_host(cfg: Config, workers: int, policy: str, memory_bytes: int) -> bool:
    """Whether `workers` CPU workers hold `cfg` in `memory_bytes` (False for a global batch
    that does not split into them)."""
    try:
        run = plan_run(cfg, workers)
    except ConfigError:
        return False
    recompute = cfg.train.recompute == "blocks"
    return estimate(cfg, run, policy, recompute).total * workers <= memory_bytes


def size(n_bytes: float) -> str:
    """Bytes for people: "6.2 GiB", or "512 MiB" under a GiB."""
    return f"{n_bytes / GIB:.1f} GiB" if n_bytes >= GIB else f"{n_bytes / (1 << 20):.0f} MiB"


def hours(seconds: float) -> str:
    """A duration for people: "3.2 h" or "2.1 days"."""
    h = seconds / 3600
    return f"{h / 24:.1f} days" if h >= 48 else f"{h:.1f} h"


def wall_seconds(plan: CapacityPlan) -> float | None:
    """The run's wall time at the plan's throughput (None where it has none)."""
    if plan.tokens_per_second is None or not plan.run.train_tokens:
        return None
    return plan.run.train_tokens / plan.tokens_per_second
