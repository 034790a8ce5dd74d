"""A restart that finds no backup says so and counts what it lost (trainer/restarts.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from contracts.artifacts import RESTARTS_FILE
from trainer import restarts
from trainer.history import TrainHistory

BACKUP_EVERY = 20
RUN_STEPS = 40


def _trained_to(work: Path, step: int, seconds: float) -> None:
    """The curve an attempt that trained to `step` keeps in the work folder."""
    curve = TrainHistory("CPU", 1, 8, wall_s=seconds)
    curve.points = [{"step": s, "loss": 3.0} for s in range(10, step + 1, 10)]
    curve.save(str(work))


def _begin(work: Path, resume_step: int = 0) -> restarts.Restarts:
    return restarts.begin(str(work), str(work / "backup"), resume_step, BACKUP_EVERY, RUN_STEPS)


def test_a_first_attempt_and_a_resumed_one_are_only_counted(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, "trainer"):
        assert _begin(tmp_path) == restarts.Restarts(attempts=1)
        _trained_to(tmp_path, 30, 12.0)
        assert _begin(tmp_path, resume_step=20) == restarts.Restarts(attempts=2)
    assert not caplog.records
    assert json.loads((tmp_path / RESTARTS_FILE).read_text())["attempts"] == 2


def test_a_restart_from_step_1_says_so_and_counts_the_lost_steps(tmp_path, caplog):
    _begin(tmp_path)
    _trained_to(tmp_path, 20, 7.5)  # validated (and backed up) at step 20, then lost
    with caplog.at_level(logging.WARNING, "trainer"):
        now = _begin(tmp_path)
    assert now == restarts.Restarts(attempts=2, lost_steps=20, lost_seconds=7.5, counted_wall_s=7.5)
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith(f"restarting from step 1: no backup could be read in {tmp_path}/")
    assert "the job trained to step 20, past a backup, but none is there" in said
    assert said.endswith(
        f"20 steps lost, 20 in all (about 8 s of training), of the {RUN_STEPS} that restarts "
        "may lose (the run's length)"
    )


def test_one_that_stopped_before_its_first_backup_loses_nothing_counted(tmp_path, caplog):
    _begin(tmp_path)
    with caplog.at_level(logging.WARNING, "trainer"):
        assert _begin(tmp_path).lost_steps == 0
    (said,) = [r.getMessage() for r in caplog.records]
    assert f"the last attempt stopped before its first, due at step {BACKUP_EVERY}" in said


def test_restarts_may_lose_one_runs_length_and_no_more(tmp_path):
    _begin(tmp_path)
    _trained_to(tmp_path, 20, 5.0)
    _begin(tmp_path)  # 20 lost
    _trained_to(tmp_path, 20, 10.0)
    assert _begin(tmp_path).lost_steps == RUN_STEPS  # 40 lost: the budget, not past it
    _trained_to(tmp_path, 30, 15.0)
    with pytest.raises(restarts.LostTooMuch) as raised:
        _begin(tmp_path)
    message = str(raised.value)
    assert message.startswith(
        f"restarts lost 70 steps of training, more than the run's own {RUN_STEPS}"
    )
    assert f"no backup could be read in {tmp_path / 'backup'}" in message
    assert restarts.read(str(tmp_path)).lost_steps == RUN_STEPS  # the refused one noted nothing


def test_a_curve_not_saved_since_the_last_count_is_not_counted_again(tmp_path, caplog):
    """Attempt 1 trains to 30 and dies; attempt 2 starts from step 1 and dies before its first
    validation (the curve still says 30); attempt 3 counts no more steps, and the seconds of
    only what the curve added."""
    _begin(tmp_path)
    _trained_to(tmp_path, 30, 12.0)
    assert _begin(tmp_path).lost_steps == 30
    with caplog.at_level(logging.WARNING, "trainer"):
        third = _begin(tmp_path)
    assert (third.lost_steps, third.lost_seconds) == (30, 12.0)
    assert "0 steps lost, 30 in all (about 0 s of training)" in caplog.records[-1].getMessage()
    _trained_to(tmp_path, 10, 16.0)  # attempt 3 validated at 10 (the curve trimmed to it)
    fourth = _begin(tmp_path)
    assert (fourth.lost_steps, fourth.lost_seconds) == (40, 16.0)


def test_a_run_of_unknown_length_is_never_refused(tmp_path):
    restarts.begin(str(tmp_path), str(tmp_path / "backup"), 0, BACKUP_EVERY, 0)
    _trained_to(tmp_path, 1000, 60.0)
    now = restarts.begin(str(tmp_path), str(tmp_path / "backup"), 0, BACKUP_EVERY, 0)
    assert now.lost_steps == 1000
