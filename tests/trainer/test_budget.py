"""train.max_minutes: the run's length planned from the measured step time."""

import json

import pytest

from contracts.artifacts import TIME_BUDGET_PLAN, TRAIN_HISTORY
from tests.tiny import TINY_OVERRIDES
from trainer import task
from trainer.budget import SAFETY, TimeBudget, agreed_copies, planned_steps, with_kept_plan
from trainer.config import resolve_config
from trainer.run_plan import plan_run


def test_planned_steps_fill_the_budget_left_up_to_the_cap():
    assert planned_steps(20, 2.0, 100.0, 0) == 20 + int(100 * SAFETY * 2)
    assert planned_steps(20, 2.0, 100.0, 50) == 50  # the config's length caps it
    assert planned_steps(20, 2.0, -5.0, 0) == 20  # over budget already: stop now


class _Fit:
    """Drives a TimeBudget as fit does, with a clock of `seconds_per_step`."""

    def __init__(self, cb: TimeBudget, seconds_per_step: float) -> None:
        self.cb, self.seconds = cb, seconds_per_step
        cb.clock = lambda: self.cb.step * self.seconds
        cb.model = type("M", (), {"stop_training": False, "optimizer": None})()
        cb.first_step = 0

    def run(self, most: int) -> int:
        self.cb.on_train_begin()
        while not self.cb.model.stop_training and self.cb.step < most:
            self.cb.on_train_batch_end(self.cb.step)
        return self.cb.step


def _budget(tmp_path, agree=lambda x: x, copies=1, warmup=4, cap=0, lengths=None):
    lengths = [] if lengths is None else lengths
    return TimeBudget(60.0, cap, warmup, lengths.append, agree, copies, str(tmp_path), True)


def test_the_plan_is_made_after_measuring_and_stops_there(tmp_path):
    lengths: list[int] = []
    fit = _Fit(_budget(tmp_path, lengths=lengths), seconds_per_step=0.5)
    done = fit.run(10_000)
    # Measured over steps 1..21: 2 steps/s; 60 - 10.5 s left.
    expected = 21 + int((60 - 10.5) * SAFETY * 2)
    assert lengths == [expected] and done == expected
    saved = json.loads((tmp_path / TIME_BUDGET_PLAN).read_text())
    assert saved == {"steps": expected, "final": True}


def test_a_long_warmup_plans_again_when_it_ends(tmp_path):
    lengths: list[int] = []
    fit = _Fit(_budget(tmp_path, warmup=50, lengths=lengths), seconds_per_step=0.5)
    fit.run(10_000)
    assert len(lengths) == 2 and abs(lengths[0] - lengths[1]) <= 1  # a steady step: one plan
    assert json.loads((tmp_path / TIME_BUDGET_PLAN).read_text())["final"] is True


def test_workers_agree_on_the_mean_of_their_plans(tmp_path):
    lengths: list[int] = []
    other = 100  # the other worker's plan
    cb = _budget(tmp_path, agree=lambda mine: mine + other, copies=2, lengths=lengths)
    _Fit(cb, seconds_per_step=0.5).run(10_000)
    mine = 21 + int((60 - 10.5) * SAFETY * 2)
    assert lengths == [round((mine + other) / 2)]


def test_two_workers_of_two_replicas_agree_on_the_mean_too(tmp_path):
    # trainer.preemption's agreement runs its all-reduce on every local replica, so with 2
    # workers of 2 GPUs it adds each worker's plan twice.
    lengths: list[int] = []
    other = 100
    copies = agreed_copies(workers=2, replicas=4)
    cb = _budget(tmp_path, agree=lambda mine: 2 * mine + 2 * other, copies=copies, lengths=lengths)
    _Fit(cb, seconds_per_step=0.5).run(10_000)
    mine = 21 + int((60 - 10.5) * SAFETY * 2)
    assert copies == 4 and lengths == [round((mine + other) / 2)]
    assert agreed_copies(workers=1, replicas=8) == 1  # one worker's agreement is its value


def test_a_restart_runs_to_the_kept_final_plan_from_the_start(tmp_path):
    plan = plan_run(resolve_config("tiny", ["train.train_steps=0", "train.max_minutes=1"]), 1)
    assert with_kept_plan(plan, str(tmp_path)) == plan  # nothing kept
    (tmp_path / TIME_BUDGET_PLAN).write_text(json.dumps({"steps": 33, "final": False}))
    assert with_kept_plan(plan, str(tmp_path)) == plan  # not final: planned again
    (tmp_path / TIME_BUDGET_PLAN).write_text(json.dumps({"steps": 33, "final": True}))
    assert with_kept_plan(plan, str(tmp_path)).steps == 33
    (tmp_path / TIME_BUDGET_PLAN).write_text('{"steps": 3')  # its writer killed midway
    assert with_kept_plan(plan, str(tmp_path)) == plan


def test_a_restart_takes_the_final_plan_as_it_stands(tmp_path):
    (tmp_path / TIME_BUDGET_PLAN).write_text(json.dumps({"steps": 33, "final": True}))
    lengths: list[int] = []
    done = _Fit(_budget(tmp_path, lengths=lengths), seconds_per_step=5.0).run(33)
    assert lengths == [33] and done == 33  # no new plan from a slower step time


@pytest.mark.slow
def test_a_run_of_the_budget_alone_trains_the_planned_steps_and_decays(
    tmp_path, examples, monkeypatch
):
    cfg = resolve_config("tiny", (*TINY_OVERRIDES, "train.train_steps=0", "train.max_minutes=0.5"))

    class Stepped(TimeBudget):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs, clock=lambda: 0.5 * self.step)

    monkeypatch.setattr(task, "TimeBudget", Stepped)
    model_dir, work_dir = tmp_path / "model", tmp_path / "work"
    metrics = task.train(str(examples), str(model_dir), str(work_dir), cfg)
    expected = 21 + int((30 - 10.5) * SAFETY * 2)
    assert metrics.steps == expected
    assert json.loads((work_dir / TIME_BUDGET_PLAN).read_text())["steps"] == expected
    history = json.loads((model_dir / "Format-Serving" / TRAIN_HISTORY).read_text())
    last = history["points"][-1]
    assert last["step"] == expected
    floor = cfg.train.learning_rate * cfg.train.min_lr_ratio  # the decay reached its end
    assert last["learning_rate"] == pytest.approx(floor, rel=0.02)  # not the peak, 10x
