"""`gptpipe plan`: a run's shape, memory per GPU and time on N GPUs of a type, before it starts.

The figures are trainer/capacity.py's (memory: trainer/memory.py; docs/training.md, "Memory per
GPU"); the train step and `gptpipe kfp run`/`schedule` make the same check before any worker
starts. A run that cannot fit is refused in one line naming what to change.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from contracts.errors import UserError
from pipelines.cli.options import config_options, resolved_config


def add_parser(sub: Any) -> None:
    """Add `plan` to the `gptpipe` command's subparsers."""
    plan = sub.add_parser(
        "plan", help="micro-batch, memory per GPU, learning rate and time of a run on N GPUs"
    )
    config_options(plan)
    plan.add_argument("--gpus", type=int, required=True, help="GPUs (replicas) in the run")
    which = plan.add_mutually_exclusive_group(required=True)
    which.add_argument("--gpu", default=None, help="GPU type: h200, h100, a100-80gb, l4, t4, ...")
    which.add_argument(
        "--gpu-memory", default=None, metavar="SIZE", help="an unknown GPU's memory: 16GB, 24GiB"
    )
    plan.add_argument(
        "--train-tokens", type=float, default=None, help="tokens to train on (train.train_tokens)"
    )
    plan.add_argument(
        "--mfu", type=float, default=None, help="model FLOPs utilisation for the times (0.4)"
    )
    plan.add_argument("--json", action="store_true", help="print one JSON object")
    plan.set_defaults(func=_cmd_plan)


def _cmd_plan(args: argparse.Namespace) -> int:
    from trainer import capacity, gpus

    if args.gpus < 1:
        raise UserError(f"--gpus {args.gpus}: give 1 or more")
    if args.train_tokens is not None:
        if not args.train_tokens >= 1:
            raise UserError(f"--train-tokens {args.train_tokens}: give a positive count, e.g. 30e9")
        args.overrides = [*args.overrides, f"train.train_tokens={int(args.train_tokens)}"]
    cfg = resolved_config(args)
    gpu = gpus.gpu(args.gpu) if args.gpu else gpus.unknown_gpu(args.gpu_memory)
    mfu = capacity.DEFAULT_MFU if args.mfu is None else args.mfu
    plan = capacity.plan_capacity(cfg, args.gpus, gpu, mfu, choose_micro=True)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print(describe(plan))
    capacity.check_fits(plan)
    return 0


def describe(plan: Any) -> str:
    """The plan for people: the run's shape, memory per GPU by term, and its time."""
    from trainer import capacity
    from trainer.gpus import GIB

    r, m = plan.run, plan.memory

    def gib(n: int) -> str:
        return f"{n / GIB:6.1f} GiB"

    act = "with recomputation" if m.recompute else "without recomputation"
    lines = [
        f"{r.replicas} x {plan.gpu.label()}, {plan.policy}",
        r.describe(),
        f"micro-batch {r.micro_batch} is the largest that fits: set train.batch_size="
        f"{r.micro_batch}"
        if plan.largest_micro_batch == r.micro_batch
        else f"largest micro-batch that fits: {plan.largest_micro_batch or 'none'}",
        "memory per GPU:",
        f"  weights (float32)           {gib(m.weights)}",
        f"  gradients (float32)         {gib(m.gradients)}",
        f"  optimizer state (AdamW m,v) {gib(m.optimizer_state)}",
        f"  weight copies (as read)     {gib(m.weight_copies)}",
        f"  gradient sums (float32)     {gib(m.gradient_sums)}",
        f"  activations                 {gib(m.activations)} without recomputation",
        f"{'':30}{gib(m.activations_recomputed)} with train.recompute=blocks",
        f"  peak, {act}: {m.total / GIB:.1f} GiB of {plan.usable_bytes / GIB:.1f} GiB usable "
        f"({'fits' if plan.fits else 'does not fit'}; without: {m.total_with(False) / GIB:.1f}, "
        f"with: {m.total_with(True) / GIB:.1f})",
    ]
    wall = capacity.wall_seconds(plan)
    if plan.tokens_per_second is None:
        lines.append(f"time: no peak FLOP/s known for {plan.gpu.name}")
    else:
        lines.append(
            f"at {plan.mfu:.0%} MFU: {plan.tokens_per_second:,.0f} tokens/s"
            + (
                f", {capacity.hours(wall)} wall, {plan.gpu_hours:,.0f} GPU-hours"
                if wall is not None
                else ""
            )
        )
    return "\n".join(lines)
