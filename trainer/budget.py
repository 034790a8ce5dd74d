"""A wall-clock budget for the training loop (`train.max_minutes`): the run's steps, and with
them the learning rate's decay, planned from the step time measured in its first steps.

Planned as bench/peer_gpt2.py plans the peer benchmark's run: MEASURE_STEPS steps after the
attempt's first (its tracing and compilation left out) it measures the steps per second and
sets the length to what fits SAFETY of the budget left, at most the config's own steps; once
warmup ends it plans again from every step since, and that plan is final. Every worker must stop
at the same step, so the length is agreed through the all-reduce (the mean of their plans: the
same number everywhere). The chief keeps the plan in the work folder, and an
attempt that resumes takes a final one as it stands: the schedule does not move under a
restarted run. One preempted before it planned starts the budget again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import posixpath
import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from contracts.artifacts import TIME_BUDGET_PLAN
from trainer.callbacks import StepCallback
from trainer.run_plan import RunPlan

log = logging.getLogger("trainer")

MEASURE_STEPS = 20  # steps timed before the first plan
SAFETY = 0.95  # of the time left, what the planned steps may take
UNPLANNED_STEPS = 10**9  # the length a run of the budget alone has until it is planned


def planned_steps(step: int, steps_per_s: float, left_s: float, cap: int) -> int:
    """The run's length at `step`: the steps that fit SAFETY of `left_s` at `steps_per_s`
    more, at most `cap` (the config's length; 0: none), and never before `step`."""
    fit = step + int(max(0.0, left_s) * SAFETY * steps_per_s)
    return max(step, min(fit, cap) if cap else fit)


def agreed_copies(workers: int, replicas: int) -> int:
    """How many times trainer.preemption's agreement counts each worker's value: once per
    replica in sync across several workers (its all-reduce runs on every local replica), and
    once for a single worker, whose agreement is the value itself."""
    return replicas if workers > 1 else 1


def with_kept_plan(plan: RunPlan, work_dir: str) -> RunPlan:
    """`plan` with the steps of a final plan an earlier attempt kept, so that a restart's
    schedule, monitor and fit have the run's length from the start (and one restored at
    the last step trains nothing)."""
    kept = read_plan(work_dir)
    if kept is None or not kept[1]:
        return plan
    return dataclasses.replace(plan, steps=kept[0])


def read_plan(work_dir: str) -> tuple[int, bool] | None:
    """(steps, final) of the plan an earlier attempt kept, or None; None too for a file a
    chief killed while writing it left unreadable (the budget is then planned again)."""
    path = posixpath.join(work_dir, TIME_BUDGET_PLAN)
    if not tf.io.gfile.exists(path):
        return None
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            kept = json.load(f)
        return int(kept["steps"]), bool(kept["final"])
    except (ValueError, KeyError, TypeError):
        log.warning("time budget: %s is unreadable; planning again", path)
        return None


class TimeBudget(StepCallback):
    """Plans the run's length from `budget_s` and the measured step time (the module's docstring).

    `set_length(steps)` applies a plan (the schedule's decay, the monitor's last step);
    `agree(value)` sums a float over all workers, each counted `copies` times (the preemption
    agreement's all-reduce adds each worker's value once per local replica: `agreed_copies`).
    """

    def __init__(
        self,
        budget_s: float,
        cap_steps: int,
        warmup_steps: int,
        set_length: Callable[[int], None],
        agree: Callable[[float], float],
        copies: int,
        work_dir: str,
        is_chief: bool,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__()
        self.budget_s = budget_s
        self.cap_steps = cap_steps
        self.warmup_steps = warmup_steps
        self.set_length = set_length
        self.agree = agree
        self.copies = copies
        self.work_dir = work_dir
        self.is_chief = is_chief
        self.clock = clock or time.perf_counter  # seconds
        self.final = False
        self.steps: int | None = None  # the length planned, once it is
        self._began = 0.0  # this attempt's start
        self._mark: tuple[int, float] | None = None  # (step, time) the measuring starts from

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._began = self.clock()
        kept = read_plan(self.work_dir)
        if kept is not None:
            self.steps, self.final = kept
            self.set_length(self.steps)
            log.info("time budget: %d steps, as planned before", self.steps)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        super().on_train_batch_end(batch, logs)
        if self.steps is not None and self.step >= self.steps:
            self.model.stop_training = True
        if self.final:
            return
        if self._mark is None:  # the attempt's first step, with its tracing, is left out
            self._mark = (self.step, self.clock())
            return
        if self.step - self._mark[0] < MEASURE_STEPS:
            return
        if self.steps is None or self.step >= self.warmup_steps:
            self._plan(final=self.step >= self.warmup_steps)

    def _plan(self, final: bool) -> None:
        start_step, start_s = self._mark or (self.step, self._began)
        now = self.clock()
        steps_per_s = (self.step - start_step) / max(now - start_s, 1e-9)
        mine = planned_steps(
            self.step, steps_per_s, self.budget_s - (now - self._began), self.cap_steps
        )
        steps = round(self.agree(float(mine)) / self.copies)
        self.steps, self.final = steps, final
        self.set_length(steps)
        log.info(
            "time budget: %.1f steps/s, %d steps in %.1f minutes%s",
            steps_per_s,
            steps,
            self.budget_s / 60,
            "" if final else " (planned again when warmup ends)",
        )
        if self.is_chief:
            tf.io.gfile.makedirs(self.work_dir)
            with tf.io.gfile.GFile(posixpath.join(self.work_dir, TIME_BUDGET_PLAN), "w") as f:
                json.dump({"steps": steps, "final": final}, f)
        if self.step >= steps:
            self.model.stop_training = True
