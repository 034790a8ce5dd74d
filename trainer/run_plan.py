"""A run's shape on the replicas it has: micro-batch, accumulation, steps, warmup, peak LR.

Pure functions of the config and the replica count (no TensorFlow), after MaxText's
`calculate_global_batch_sizes`: the trainer prints their result at start, and `gptpipe plan`
and the train step derive the same before any worker starts. A run is described either in
steps of today's batch (`train.batch_size` x replicas sequences) or in tokens
(`train.global_batch_tokens`, `train.train_tokens`, `train.warmup_tokens`); in tokens one config
trains the same model on 8 replicas as on 100, each replica summing the gradients of as many
micro-batches of `train.batch_size` as its share of the global batch needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainer import shapes
from trainer.config import Config, ConfigError


@dataclass(frozen=True)
class RunPlan:
    """The derived shape of one run on `replicas` replicas."""

    replicas: int  # devices in sync, across all workers
    seq_len: int  # tokens per sequence (model.seq_len)
    micro_batch: int  # sequences per replica per forward and backward pass
    accumulation: int  # micro-batches whose gradients each replica sums per optimizer step
    steps: int  # optimizer steps; 0 while train.max_minutes decides them (budget.py)
    warmup_steps: int  # of them, the linear warmup
    peak_learning_rate: float  # the schedule's peak (peak_learning_rate)

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step across all replicas."""
        return self.replicas * self.micro_batch * self.accumulation

    @property
    def global_batch_tokens(self) -> int:
        """Tokens per optimizer step across all replicas."""
        return self.global_batch * self.seq_len

    @property
    def train_tokens(self) -> int:
        """Tokens the whole run trains on (0 while the budget decides the steps)."""
        return self.steps * self.global_batch_tokens

    def describe(self) -> str:
        """One line for the start of a run's log."""
        steps = f"{self.steps} steps" if self.steps else "steps from the time budget"
        return (
            f"{self.replicas} replicas x micro-batch {self.micro_batch} x accumulation "
            f"{self.accumulation} = global batch {self.global_batch} sequences "
            f"({self.global_batch_tokens:,} tokens); {steps}, warmup {self.warmup_steps}, "
            f"peak learning rate {self.peak_learning_rate:.3g}"
        )


def plan_run(cfg: Config, replicas: int) -> RunPlan:
    """The run `cfg` describes on `replicas` replicas; ConfigError (one line) when its global
    batch cannot be split evenly into them, or a tensor it makes would be past TensorFlow's
    int32 bound (trainer/shapes.py)."""
    t, seq_len = cfg.train, cfg.model.seq_len
    micro, accumulation = split_global_batch(cfg, replicas)
    shapes.check(cfg.model, t.batch_size, micro, accumulation, replicas)
    global_tokens = replicas * micro * accumulation * seq_len
    steps = t.train_steps or (math.ceil(t.train_tokens / global_tokens) if t.train_tokens else 0)
    warmup = math.ceil(t.warmup_tokens / global_tokens) if t.warmup_tokens else t.warmup_steps
    return RunPlan(
        replicas=replicas,
        seq_len=seq_len,
        micro_batch=micro,
        accumulation=accumulation,
        steps=steps,
        warmup_steps=min(warmup, steps) if steps else warmup,
        peak_learning_rate=peak_learning_rate(cfg, replicas * micro * accumulation),
    )


def split_global_batch(cfg: Config, replicas: int) -> tuple[int, int]:
    """(micro-batch, accumulation) per replica: train.batch_size and 1, or, with
    train.global_batch_tokens, the replica's share of it in micro-batches of train.batch_size
    (all of it in one pass when the share is smaller)."""
    t, seq_len = cfg.train, cfg.model.seq_len
    if replicas < 1:
        raise ConfigError(f"replicas must be at least 1, got {replicas}")
    if not t.global_batch_tokens:
        return t.batch_size, 1
    per_replica, left = divmod(t.global_batch_tokens, seq_len * replicas)
    micro = min(t.batch_size, per_replica) or t.batch_size
    if left or per_replica == 0 or per_replica % micro:
        step = seq_len * replicas * micro
        below = t.global_batch_tokens // step * step
        nearest = " or ".join(f"{n:,}" for n in (below, below + step) if n > 0)
        raise ConfigError(
            f"train.global_batch_tokens={t.global_batch_tokens:,} must be a multiple of "
            f"seq_len {seq_len} x {replicas} replicas x micro-batch {micro} "
            f"(train.batch_size) = {step:,}; nearest: {nearest}, or change train.batch_size"
        )
    return micro, per_replica // micro


def peak_learning_rate(cfg: Config, global_batch: int) -> float:
    """The schedule's peak at `global_batch` sequences, by train.lr_scaling: `linear` scales
    train.learning_rate by global_batch / train.reference_batch_size (Goyal et al. 2017's
    rule, the seeds'); `capped` does the same below the reference and stays at
    train.learning_rate above it; `none` is train.learning_rate at any batch."""
    t = cfg.train
    ratio = global_batch / t.reference_batch_size
    if t.lr_scaling == "none":
        return t.learning_rate
    if t.lr_scaling == "capped":
        ratio = min(ratio, 1.0)
    return t.learning_rate * ratio


def learning_rate_at(
    step: int, peak_lr: float, warmup_steps: int, total_steps: int, min_lr_ratio: float
) -> float:
    """LR at 0-based `step`: linear warmup to peak_lr, then cosine decay to min_lr_ratio * peak."""
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return peak_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine)
