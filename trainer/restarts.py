"""Restarts that cannot resume from the backup: said, and counted in lost training.

A restarted attempt resumes from the backup (trainer/preemption.py) and loses at most the steps
since it, one backup interval; the launcher's `backoff_limit` bounds how often that happens.
An attempt that finds no backup starts again from step 1 and loses everything trained before,
and an attempt count says nothing of that cost: a job whose backups cannot be kept trains its
whole length again at every restart.

So the chief of every attempt notes its start in the work folder (`RESTARTS_FILE`). An attempt
that finds an earlier one noted but no backup says so in its log, with why, and counts as lost
the steps the job had trained (the curve the chief keeps, at each validation: as often as the
backup) and their time. The budget for training lost this way is the run's own length
(`train.train_steps`, or the steps `train.max_minutes` planned): restarts may at most double
the cost of the training. Past it, starting from step 1 again is refused with exit 3, a
failure no restart can mend (the backups cannot be written or kept), naming the backup folder.
"""

from __future__ import annotations

import json
import logging
import posixpath
from dataclasses import dataclass

import tensorflow as tf

from contracts import records
from contracts.artifacts import RESTARTS_FILE
from trainer.history import TrainHistory

log = logging.getLogger("trainer")


@dataclass(frozen=True)
class Restarts:
    """What the work folder's earlier attempts cost: `RESTARTS_FILE`, kept by the chief."""

    attempts: int = 0  # attempts started in this work folder
    lost_steps: int = 0  # steps trained, then lost to restarts that found no backup
    lost_seconds: float = 0.0  # the training time of those steps, as the curve measured it
    # the curve's training time when a restart from step 1 last counted it: what the curve
    # adds after that is the attempts since (a curve not saved since adds nothing)
    counted_wall_s: float = 0.0


class LostTooMuch(Exception):
    """Restarting from step 1 again would lose more training than the run's length."""


def read(work_dir: str) -> Restarts:
    """The record in `work_dir`; an empty one if there is none."""
    path = posixpath.join(work_dir, RESTARTS_FILE)
    if not tf.io.gfile.exists(path):
        return Restarts()
    with tf.io.gfile.GFile(path, "r") as f:
        return records.from_json(Restarts, f.read(), path)


def begin(
    work_dir: str, backup_dir: str, resume_step: int, backup_every: int, budget_steps: int
) -> Restarts:
    """Note this attempt's start (the chief calls it, before training); if it restarts from
    step 1 after an earlier attempt, say so and count what was lost. Raises `LostTooMuch` when
    the steps lost would exceed `budget_steps` (0: no budget known yet, nothing refused)."""
    before = read(work_dir)
    now = Restarts(
        before.attempts + 1, before.lost_steps, before.lost_seconds, before.counted_wall_s
    )
    if before.attempts and resume_step == 0:
        now = _restarted_from_scratch(work_dir, backup_dir, before, backup_every, budget_steps)
    tf.io.gfile.makedirs(work_dir)
    with tf.io.gfile.GFile(posixpath.join(work_dir, RESTARTS_FILE), "w") as f:
        f.write(json.dumps(records.to_dict(now)))
    return now


def _restarted_from_scratch(
    work_dir: str, backup_dir: str, before: Restarts, backup_every: int, budget_steps: int
) -> Restarts:
    curve = TrainHistory("", 0, 0)
    curve.load(work_dir)
    # The curve is kept at each validation, trimmed to the attempt's start: one not saved since
    # the last count (an attempt that died before its first validation) still holds the
    # steps counted then, which are not counted twice.
    fresh = curve.wall_s > before.counted_wall_s
    points = curve.points + curve.eval_points
    trained = max((p["step"] for p in points), default=0) if fresh else 0
    seconds = curve.wall_s - before.counted_wall_s
    lost_steps = before.lost_steps + trained
    why = _why(backup_dir, trained, backup_every)
    budget = f", of the {budget_steps} that restarts may lose (the run's length)"
    said = (
        f"restarting from step 1: no backup could be read in {backup_dir}: {why}; "
        f"{trained} steps lost, {lost_steps} in all (about {seconds:.0f} s of training)"
        + (budget if budget_steps else "")
    )
    if budget_steps and lost_steps > budget_steps:
        raise LostTooMuch(
            f"restarts lost {lost_steps} steps of training, more than the run's own "
            f"{budget_steps}: no backup could be read in {backup_dir} ({why}), and another "
            "restart from step 1 would not keep one either; make the work folder keep its "
            "backups (its space, its permissions, nothing removing them), then run again"
        )
    log.warning("%s", said)
    return Restarts(before.attempts + 1, lost_steps, before.lost_seconds + seconds, curve.wall_s)


def _why(backup_dir: str, trained: int, backup_every: int) -> str:
    """Why the backup folder holds nothing to resume from, as far as the work folder tells."""
    if trained >= backup_every:
        return (
            f"the job trained to step {trained}, past a backup, but none is there: it could "
            "not be written, or was removed"
        )
    return f"the last attempt stopped before its first, due at step {backup_every}"
