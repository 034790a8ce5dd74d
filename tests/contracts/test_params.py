"""contracts.params: each step's parameters, checked where they are made and read back."""

import pytest

from contracts.errors import UserError
from contracts.params import (
    EvalPolicy,
    TokenizeParams,
    TrainJob,
    apply_overrides,
    override,
    params_class,
)


@pytest.mark.parametrize("cls", [TokenizeParams, TrainJob, EvalPolicy])
def test_the_defaults_round_trip_through_json_as_a_pipeline_carries_them(cls):
    made = cls()
    assert cls.from_dict(made.to_dict()) == made
    assert params_class(cls.NAME) is cls


def test_a_struct_carries_ints_as_floats_and_they_read_back_as_ints():
    """KFP passes a dict parameter as a protobuf Struct: every number is a double."""
    job = TrainJob.from_dict({**TrainJob().to_dict(), "workers": 8.0, "deadline_seconds": 60.0})
    assert (job.workers, job.deadline_seconds) == (8, 60)
    assert isinstance(job.workers, int)


@pytest.mark.parametrize(
    ("cls", "field", "value", "message"),
    [
        (EvalPolicy, "max_nats_per_char", float("nan"), r"max_nats_per_char=nan: takes a finite"),
        (EvalPolicy, "max_nats_per_char", 0.0, r"eval_policy.max_nats_per_char=0.0: the blessing"),
        (EvalPolicy, "tolerance", 5, r"eval_policy.tolerance=5.0: the regression allowed"),
        (EvalPolicy, "tolerance", float("inf"), r"eval_policy.tolerance=inf: takes a finite"),
        (TokenizeParams, "eval_fraction", 0.7, r"tokenize.eval_fraction=0.7: use a share in"),
        (TokenizeParams, "eval_fraction", 0, r"tokenize.eval_fraction=0.0: use a share in"),
        (TrainJob, "workers", 0, r"^train_job.workers=0: use 1 or more$"),
        (TrainJob, "gpus_per_worker", -1, r"^train_job.gpus_per_worker=-1: use 0 or more$"),
        (TrainJob, "deadline_seconds", -5, r"^train_job.deadline_seconds=-5: use 0 or more$"),
        (TrainJob, "memory", "lots", r"^train_job.memory='lots': use a Kubernetes quantity"),
        (TrainJob, "launcher", "slurm", r"^train_job.launcher='slurm': use one of tfjob, local"),
        (TrainJob, "service_account", "Not_A_Name", r"train_job.service_account='Not_A_Name'"),
        (TrainJob, "node_selector", {"pool": 1}, r"^train_job.node_selector.pool=1: takes a str"),
        (TrainJob, "tolerations", ["gpu"], r"^train_job.tolerations\[0\]=\"gpu\": takes an obj"),
        (TrainJob, "tolerations", [{"kee": "x"}], r"^train_job.tolerations=.*: use objects with"),
        (TrainJob, "workers", "two", r'^train_job.workers="two": takes a whole number$'),
    ],
)
def test_a_bad_value_is_one_line_naming_the_field_as_it_is_set(cls, field, value, message):
    with pytest.raises(UserError, match=message):
        cls.from_dict({field: value})


def test_an_unknown_field_names_the_nearest_one():
    with pytest.raises(UserError, match=r"did you mean train_job.workers\?"):
        override(TrainJob(), "worker", 3)


def test_overrides_set_fields_typed_as_the_field_is():
    """A str field takes the text as typed (cpu=8 is "8"); others parse as JSON."""
    found = apply_overrides(
        {"train_job": TrainJob(), "tokenize": TokenizeParams()},
        [
            "train_job.cpu=8",
            "train_job.workers=3",
            'train_job.node_selector={"pool": "gpu"}',
            "tokenize.tokenizer=12",
        ],
    )
    job, tok = found["train_job"], found["tokenize"]
    assert isinstance(job, TrainJob) and isinstance(tok, TokenizeParams)
    assert (job.cpu, job.workers, dict(job.node_selector)) == ("8", 3, {"pool": "gpu"})
    assert tok.tokenizer == "12"


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("workers=3", r"--param 'workers=3' is not OBJECT.FIELD=VALUE"),
        ("train_job.workers", r"is not OBJECT.FIELD=VALUE"),
        (
            "train.workers=3",
            r"no step's parameters are called 'train' \(did you mean train_job\?\)",
        ),
    ],
)
def test_an_override_that_names_no_field_is_refused(item, message):
    with pytest.raises(UserError, match=message):
        apply_overrides({"train_job": TrainJob()}, [item])


def test_the_job_fields_fill_a_job_spec_by_its_own_names():
    from components.jobs.spec import JobSpec

    job = TrainJob(workers=3, cpu="2", memory="1Gi", deadline_seconds=0)
    spec = JobSpec(name="train-x", command=("python",), **job.job_fields())
    assert (spec.workers, spec.cpu, spec.memory) == (3, "2", "1Gi")
    assert spec.active_deadline_seconds is None  # 0: no deadline


def test_a_quoted_string_is_its_content_in_a_str_field_and_stays_text_where_json_is_not():
    found = apply_overrides(
        {"tokenize": TokenizeParams(), "train_job": TrainJob()},
        ['tokenize.tokenizer="gs://b/t.model"', 'train_job.cpu="8"', "train_job.memory=8Gi"],
    )
    assert found["tokenize"].tokenizer == "gs://b/t.model"  # type: ignore[attr-defined]
    assert (found["train_job"].cpu, found["train_job"].memory) == ("8", "8Gi")  # type: ignore


def test_a_local_job_runs_at_most_two_workers_a_cpu_and_a_tfjob_is_not_bounded_here():
    TrainJob(launcher="local", workers=4).check_local(cpus=2)
    TrainJob(launcher="local", workers=2).check_local(cpus=1)  # the default, on one CPU
    with pytest.raises(UserError) as refused:
        TrainJob(launcher="local", workers=5).check_local(cpus=2)
    assert str(refused.value) == (
        "train_job.workers=5: this machine runs at most 4 local workers (2 for each of its 2 "
        "CPUs); pass --workers 4 or fewer"
    )
    TrainJob(launcher="tfjob", workers=500).check_local(cpus=2)  # pods, on the cluster's nodes
