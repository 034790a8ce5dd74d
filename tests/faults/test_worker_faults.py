"""Distributed training survives losing a worker: 2 real worker processes (MultiWorkerMirrored
over the RING collective on CPU) through the `local` launcher, with injected faults.

Faults come from the trainer's test-only flags (`--fault-at-step N --fault-worker I
--fault-signal KILL|TERM`): the worker signals itself after step N of a run that started at
step 0, so the restarted job runs clean. The tiny config trains 40 steps with a backup and a
validation every 20.
"""

import dataclasses
import io
import json
import math
import re
import sys
from pathlib import Path

import pytest

from components.jobs.errors import WorkerPermanentError
from components.jobs.launcher import LaunchResult
from components.jobs.local import LocalLauncher
from components.jobs.spec import JobSpec
from components.train import executor as train_step
from components.train.executor import trainer_command
from contracts.artifacts import TRAIN_HISTORY
from tests.tiny import TINY_OVERRIDES
from trainer.config import resolve_config
from trainer.preemption import backed_up_step

STEPS = 40  # TINY_OVERRIDES: train.train_steps
BACKUP_EVERY = 20  # TINY_OVERRIDES: train.checkpoint_every
FAULT_STEP = 25  # between two periodic backups


class Job:
    """One 2-worker job run to completion: its folders, launcher result and output."""

    def __init__(self, root: Path, examples: Path, *flags: str):
        self.root = root
        self.model = root / "model"
        self.work = root / "work"
        self.logs = root / "launcher-logs"
        cfg = resolve_config("tiny", TINY_OVERRIDES)
        command = trainer_command(
            sys.executable, str(examples), str(self.model), str(self.work), cfg
        )
        spec = JobSpec(
            name="fault-tolerance",
            command=[*command, *flags],
            workers=2,
            backoff_limit=1,
            active_deadline_seconds=240,
            env={"TF_CPP_MIN_LOG_LEVEL": "2"},
        )
        out = io.StringIO()
        self.result: LaunchResult = LocalLauncher(log_dir=self.logs, out=out).run(spec)
        self.out = out.getvalue()

    def log(self, worker: int, attempt: int | None = None) -> str:
        attempt = attempt or self.result.attempts
        return (self.logs / f"attempt-{attempt}" / f"worker-{worker}.log").read_text()

    def final_val_loss(self) -> float:
        found = re.findall(rf"step {STEPS} val_loss ([0-9.]+)", self.log(0))
        assert found, self.log(0)[-3000:]
        return float(found[-1])


def _done_metrics(log_text: str) -> dict:
    """The train metrics a worker logs (`done: {...}`) after training, but its own timing."""
    found = re.findall(r"trainer done: (\{.*\})", log_text)
    assert found, log_text[-3000:]
    metrics = json.loads(found[-1])
    del metrics["tokens_per_second"]  # each worker times its own steps
    return metrics


def _leftovers(job: Job) -> list[Path]:
    """Scratch and temp folders of non-chief workers or unfinished writes left under the job."""
    markers = ("scratch", "workertemp", "worker-tmp", ".tmp-")
    return [
        p.relative_to(job.root) for p in job.root.rglob("*") if any(m in p.name for m in markers)
    ]


def _resumed_at(log_text: str) -> int:
    found = re.findall(r"resumed at step (\d+) from the backup", log_text)
    return int(found[-1]) if found else 0


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, examples):
    return Job(tmp_path_factory.mktemp("uninterrupted"), examples)


@pytest.mark.slow
def test_two_workers_agree_on_the_loss_and_the_chief_exports_once(uninterrupted):
    job = uninterrupted
    assert (job.result.attempts, job.result.restarts) == (1, 0)
    # Every worker logs the metrics it computed; the chief alone writes them to the artifact.
    worker_metrics = [_done_metrics(job.log(i)) for i in (0, 1)]
    assert worker_metrics[0] == worker_metrics[1]
    assert (worker_metrics[0]["workers"], worker_metrics[0]["steps"]) == (2, STEPS)
    assert worker_metrics[0]["final_loss"] < math.log(320)  # it learned
    written = json.loads((job.model / "train_metrics.json").read_text())
    assert {k: v for k, v in written.items() if k != "tokens_per_second"} == worker_metrics[0]
    # One export, where it belongs, and no scratch or temp folder of any worker left anywhere.
    exports = sorted(p.relative_to(job.root) for p in job.root.rglob("saved_model.pb"))
    assert exports == [Path("model/Format-Serving/saved_model.pb")]
    assert _leftovers(job) == []
    assert sorted(p.name for p in (job.work / "logs").iterdir()) == ["train", "validation"]
    # Kept by the workers: the train step removes it once the whole job has succeeded.
    assert (job.work / "backup").is_dir()


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.fault("a worker SIGKILLed mid-training")
def test_sigkilled_worker_restarts_the_group_which_resumes_from_the_backup(
    tmp_path, examples, uninterrupted
):
    job = Job(tmp_path, examples, "--fault-at-step", str(FAULT_STEP), "--fault-signal", "KILL")
    assert (job.result.attempts, job.result.restarts) == (2, 1)
    assert "worker-1 exited with retryable code 137" in job.out
    assert f"fault injection: SIGKILL at step {FAULT_STEP}" in job.log(1, attempt=1)
    # The restarted group resumed from the last periodic backup, not from step 0...
    assert _resumed_at(job.log(0)) == _resumed_at(job.log(1)) == BACKUP_EVERY
    assert "fault injection" not in job.log(1)  # ...and ran clean to the configured step count
    assert f'"steps": {STEPS}' in (job.model / "train_metrics.json").read_text()
    # Steps 21-25 ran twice, from the backup's weights and on the same batches: the restarted
    # group's input started where the 20 steps before the backup left it (data.TrainOrder), so
    # steps 21-40 saw what an uninterrupted run sees, and the model ends up the same (the RING
    # all-reduce may sum in another order). When a resumed run re-read the first 20 steps'
    # batches instead, it landed 1.6-3.0% away.
    assert job.final_val_loss() == pytest.approx(uninterrupted.final_val_loss(), rel=0.002)


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.fault("SIGTERM to a worker mid-training")
def test_sigterm_backs_up_exits_retryably_and_the_job_resumes(tmp_path, examples):
    job = Job(tmp_path, examples, "--fault-at-step", str(FAULT_STEP), "--fault-signal", "TERM")
    first = [job.log(i, attempt=1) for i in (0, 1)]
    assert "received SIGTERM" in first[1]
    # Worker 0 got no signal but stopped too (the launcher may SIGTERM it afterwards).
    assert "received SIGTERM" not in first[0].split("preempted:")[0]
    # Both workers agreed to stop at the same step, saved there and exited with 128 + SIGTERM.
    for text in first:
        assert f"preempted: backed up at step {FAULT_STEP}; exiting 143" in text
    assert re.search(r"worker-\d exited with retryable code 143; restarting all workers", job.out)
    assert (job.result.attempts, job.result.restarts) == (2, 1)
    # The preemption backup (step 25), not the periodic one (step 20), is where the job resumed.
    assert _resumed_at(job.log(0)) == _resumed_at(job.log(1)) == FAULT_STEP
    assert f'"steps": {STEPS}' in (job.model / "train_metrics.json").read_text()
    assert _done_metrics(job.log(0)) == _done_metrics(job.log(1))
    assert _leftovers(job) == []
    # The curve holds the preempted attempt's steps up to its backup (its last validation was
    # at 20), then the resumed attempt's: one curve, in order.
    history = json.loads((job.model / "Format-Serving" / TRAIN_HISTORY).read_text())
    steps = [point["step"] for point in history["points"]]
    assert FAULT_STEP in steps and steps == sorted(set(steps)) and steps[-1] == STEPS
    # Backups after the resume stay at multiples of BACKUP_EVERY, the last at the last step
    # (what a restart after a failed export resumes from), not 20 steps after step 25.
    assert backed_up_step(str(job.work / "backup")) == STEPS


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.fault("SIGTERM to a worker at the last step")
def test_sigterm_at_the_last_step_lets_training_end_and_export(tmp_path, examples):
    """Training ends as it would have; the Model keeps its metrics. Backed up and restarted
    instead, the job would resume with nothing left to train and no metrics to report."""
    job = Job(tmp_path, examples, "--fault-at-step", str(STEPS), "--fault-signal", "TERM")
    assert (job.result.attempts, job.result.restarts) == (1, 0)
    assert "received SIGTERM" in job.log(1)
    assert "preempted:" not in job.log(0) + job.log(1)
    written = json.loads((job.model / "train_metrics.json").read_text())
    assert written["steps"] == STEPS and math.isfinite(written["final_loss"])
    assert written["tokens_per_second"] > 0
    assert job.final_val_loss() > 0  # the last validation ran
    assert (job.model / "Format-Serving" / "saved_model.pb").is_file()


@pytest.mark.slow
@pytest.mark.fault("the disk fills as the chief writes the Model, or its backup (ENOSPC)")
@pytest.mark.parametrize("where", ["export", "backup"])
def test_a_full_disk_fails_the_job_once_naming_the_path(tmp_path, examples, where):
    """The job fails without a restart, its one error line naming the path and the fix.

    A restart would train again before failing the same way. Worker 1, which loses the chief,
    exits 143; the launcher blames the chief whichever exit it saw first."""
    model, work, logs = tmp_path / "model", tmp_path / "work", tmp_path / "launcher-logs"
    at = ["--fault-at-export"] if where == "export" else ["--fault-at-step", str(BACKUP_EVERY)]
    cfg = resolve_config("tiny", TINY_OVERRIDES)
    spec = train_step.job_spec(
        str(examples), str(model), str(work), cfg, launcher="local", run_id="full", workers=2
    )
    flags = ["--fault-no-space", "--fault-worker", "0", *at]
    spec = dataclasses.replace(spec, command=[*spec.command, *flags], backoff_limit=3)
    launcher = LocalLauncher(log_dir=logs, out=io.StringIO(), kill_grace_seconds=2)
    with pytest.raises(WorkerPermanentError) as raised:
        train_step.run(spec, cfg, str(model), str(work), launcher)
    e = raised.value
    assert (e.replica, e.exit_code) == ("worker-0", 3)
    path = model / "Format-Serving" if where == "export" else work / "backup" / "chief"
    assert str(e).startswith(
        f"job {spec.name} failed: worker-0 exited with code 3: no space left on device at {path}/"
    ), str(e)
    assert "\n" not in str(e) and str(e).endswith("or give the run a root with room")
    assert [p.name for p in logs.iterdir()] == ["attempt-1"]  # no restart
    assert "Traceback" not in (logs / "attempt-1" / "worker-0.log").read_text()
    assert not model.exists()


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.fault("every attempt loses its backup, then its worker (SIGKILL at step 30)")
def test_restarts_that_cannot_resume_say_so_and_stop_once_they_lost_a_runs_length(
    tmp_path, examples
):
    """Each restart says it starts from step 1; the one past the run's length fails the job.

    Each restart finds no backup, says so and trains from step 1 again, losing the 20 steps the
    job had validated: the third would take the loss past the run's own 40 steps, so it stops
    at once (exit 3), well within backoff_limit."""
    model, work, logs = tmp_path / "model", tmp_path / "work", tmp_path / "launcher-logs"
    cfg = resolve_config("tiny", TINY_OVERRIDES)
    spec = train_step.job_spec(
        str(examples), str(model), str(work), cfg, launcher="local", run_id="lost", workers=1
    )
    flags = ["--fault-at-step", "30", "--fault-worker", "0", "--fault-lose-backup"]
    spec = dataclasses.replace(spec, command=[*spec.command, *flags], backoff_limit=10)
    out = io.StringIO()
    with pytest.raises(WorkerPermanentError) as raised:
        LocalLauncher(log_dir=logs, out=out).run(spec)
    assert sorted(p.name for p in logs.iterdir()) == [f"attempt-{n}" for n in (1, 2, 3, 4)]
    said = f"restarting from step 1: no backup could be read in {work / 'backup'}: "
    for attempt, lost in ((2, 20), (3, 40)):
        text = (logs / f"attempt-{attempt}" / "worker-0.log").read_text()
        assert said in text and f"20 steps lost, {lost} in all (about " in text, text[-3000:]
    assert "restarting from step 1" in out.getvalue()  # worker 0's lines are the run's
    assert str(raised.value).startswith(
        f"job {spec.name} failed: worker-0 exited with code 3: restarts lost 60 steps of "
        f"training, more than the run's own {STEPS}: no backup could be read in {work}/backup"
    ), str(raised.value)
