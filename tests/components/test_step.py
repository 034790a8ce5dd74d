"""components.step: the ritual every step runs once around its executor."""

import os
import signal

import pytest

from components import lineage, provenance, step
from components.jobs import cancel
from components.jobs.errors import LaunchCancelled
from contracts.params import TrainJob


class Artifact:
    """What KFP passes for an input or output artifact: a URI and metadata."""

    def __init__(self, uri: str) -> None:
        self.uri, self.metadata = uri, {}


def run_step(tmp_path, monkeypatch, train_job, execute):
    monkeypatch.setenv("KFP_RUN_ID", "run-1")
    store = str(tmp_path / "metadata.sqlite")
    inputs = {
        "examples_uri": "/examples",
        "dataset_version": "d" * 64,
        "train_job": train_job,
        "model": Artifact(str(tmp_path / "model")),
        "metadata": store,
        "pipeline_name": "gptpipe",
        "image": provenance.LOCAL_IMAGE,
    }
    result = step.run("train", execute, inputs)
    return result, lineage.run_summary(store, "run-1")["steps"]["train"]


def test_the_executor_gets_every_input_but_the_edges_and_lineage_records_the_parameters(
    tmp_path, monkeypatch
):
    seen = {}

    def execute(running, **inputs):
        seen.update(inputs, name=running.name, run_id=running.edge.run_id)
        return "done"

    result, execution = run_step(tmp_path, monkeypatch, {"workers": 3}, execute)
    assert result == "done" and execution["state"] == "COMPLETE"
    assert set(seen) == {"examples_uri", "dataset_version", "train_job", "model", "name", "run_id"}
    assert (seen["name"], seen["run_id"]) == ("train", "run-1")
    recorded = lineage.parameters_of(execution)
    # Not the edge's inputs, the artifacts, nor tokenize's outputs: the run's parameters.
    assert set(recorded) == {"train_job"}
    # A run that set one field is recorded with the whole object this version ran.
    assert recorded["train_job"] == TrainJob(workers=3).to_dict()


@pytest.mark.bad_input("a step parameter object with a field of the wrong type (a hand-edited run)")
def test_a_bad_parameter_object_fails_the_step_on_its_record(tmp_path, monkeypatch):
    def execute(running, **inputs):
        raise AssertionError("the executor must not run")

    with pytest.raises(SystemExit) as exited:
        run_step(tmp_path, monkeypatch, {"workers": "two"}, execute)
    assert exited.value.code == 2
    store = str(tmp_path / "metadata.sqlite")
    assert lineage.run_summary(store, "run-1")["steps"]["train"]["state"] == "FAILED"
    assert lineage.failure_of(store, "run-1")[1].startswith('train_job.workers="two"')


@pytest.mark.fault("a step is told to stop (SIGTERM) while its executor runs")
def test_a_step_told_to_stop_is_recorded_failed_and_gives_the_signal_back(tmp_path, monkeypatch):
    """The step is recorded FAILED with the cause, never left RUNNING.

    Evaluate and push have no launcher: the step itself turns SIGTERM into StepCancelled."""
    before = signal.getsignal(signal.SIGTERM)

    def execute(running, **inputs):
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()  # only the handler's exception ends it
        raise AssertionError("the signal did not reach the step")

    with pytest.raises(step.StepCancelled, match="received SIGTERM: the run was cancelled"):
        run_step(tmp_path, monkeypatch, {"workers": 1}, execute)
    store = str(tmp_path / "metadata.sqlite")
    assert lineage.run_summary(store, "run-1")["steps"]["train"]["state"] == "FAILED"
    assert "received SIGTERM" in lineage.failure_of(store, "run-1")[1]
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_launcher_inside_the_step_takes_the_signal_over_while_it_runs(tmp_path, monkeypatch):
    def execute(running, **inputs):
        with cancel.cancel_on_sigterm():
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pause()

    with pytest.raises(LaunchCancelled):
        run_step(tmp_path, monkeypatch, {"workers": 1}, execute)
