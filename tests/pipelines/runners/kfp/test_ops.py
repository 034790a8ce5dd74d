"""`gptpipe kfp ...` against a wire-level double of KFP's v2beta1 API, through the real
kfp.Client: upload, run and --wait, schedule, runs, auth and retries. No TensorFlow."""

from __future__ import annotations

import json
import time
import types
from pathlib import Path
from typing import Any

import kfp.client.client
import kfp_server_api
import pytest

from contracts.errors import UserError
from contracts.params import EvalPolicy, TrainJob
from pipelines import compiler
from pipelines.cli import main as cli
from pipelines.pipeline import Target
from pipelines.runners.kfp import auth as kfp_auth
from pipelines.runners.kfp import client as kfp_client
from pipelines.runners.kfp import ops
from pipelines.runners.kfp import schedule as kfp_schedule
from tests.doubles.kfp import api_server as kfp_api_double
from tests.doubles.kfp import run_details
from tests.doubles.kfp.api_server import KfpApiDouble, RunScript
from trainer.config import resolve_config

LOCK = Path(__file__).parents[3] / "data" / "digests.json"
ROOT = "gs://bucket/gptpipe"
NEEDED = ["--param", "corpus=gs://bucket/corpus/", "--param", "serving_dir=gs://bucket/serving"]


@pytest.fixture(scope="session")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = Target(compiler.load_images(LOCK), pipeline_root=ROOT)
    out = tmp_path_factory.mktemp("kfp") / "gptpipe.yaml"
    return compiler.compile_pipeline(out, target, resolve_config("tiny"))


@pytest.fixture
def double(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # kfp.Client reads ~/.config/kfp/context.json; KFP's variables would change the host or auth.
    monkeypatch.setattr(kfp.client.client.Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "ctx.json"))
    for name in (kfp_client.HOST_ENV, kfp_auth.TOKEN_PATH_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(kfp_client, "FIRST_BACKOFF_S", 0.01)
    with KfpApiDouble(token="secret-token") as served:
        yield served


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("secret-token\n")
    return path


def gptpipe(double: KfpApiDouble, token: Path | None, *args: str) -> int:
    auth = ["--token-file", str(token)] if token else []
    return cli.main(["kfp", args[0], "--host", double.host, *auth, *args[1:]])


def upload(double: KfpApiDouble, token: Path, compiled: Path, version: str = "git-aaa") -> int:
    return gptpipe(double, token, "upload", "--file", str(compiled), "--version", version)


# ---- upload --------------------------------------------------------------------------------


def test_upload_creates_the_pipeline_when_missing_then_adds_versions(
    double, token, compiled, capsys
):
    assert upload(double, token, compiled, "git-aaa") == 0
    assert "created pipeline gptpipe" in capsys.readouterr().out
    assert upload(double, token, compiled, "git-bbb") == 0
    out = capsys.readouterr().out
    assert "created pipeline" not in out and "uploaded version git-bbb" in out
    assert [p.display_name for p in double.pipelines.values()] == ["gptpipe"]
    assert sorted(v.display_name for v in double.versions.values()) == ["git-aaa", "git-bbb"]


def test_upload_of_an_existing_version_answers_409_and_exits_0(double, token, compiled, capsys):
    assert upload(double, token, compiled, "git-aaa") == 0
    assert upload(double, token, compiled, "git-aaa") == 0
    assert "version git-aaa of gptpipe already exists" in capsys.readouterr().out
    assert double.statuses("POST", "/apis/v2beta1/pipelines/upload_version") == [200, 409]
    assert len(double.versions) == 1


def test_upload_compiles_now_with_the_digest_lock(double, token, tmp_path):
    args = ["--pipeline-root", "gs://other/root", "--lock", str(LOCK), "--version", "v1"]
    assert gptpipe(double, token, "upload", *args) == 0
    (version,) = double.versions.values()
    spec = version.pipeline_spec["pipeline_spec"]  # with a platform spec: both, as KFP answers
    assert spec["defaultPipelineRoot"] == "gs://other/root"
    images = {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()}
    assert images and all("@sha256:" in image for image in images)


@pytest.mark.parametrize(
    "extra", [["--set", "train.train_steps=9"], ["--config", "gpt2-small"], ["--allow-unpinned"]]
)
def test_upload_of_a_file_refuses_compile_options_it_would_ignore(
    double, token, compiled, capsys, extra
):
    argv = ["upload", "--file", str(compiled), "--version", "git-aaa", *extra]
    assert gptpipe(double, token, *argv) == 2
    assert f"{extra[0]} would be ignored" in capsys.readouterr().err and double.requests == []


def test_mlmd_must_name_a_store_that_exists(double, token, compiled, capsys, tmp_path):
    upload(double, token, compiled)
    store = tmp_path / "metadata.sqlite"  # a typo, say: opening it would make an empty store
    assert gptpipe(double, token, "run", *NEEDED, "--wait", "--mlmd", str(store)) == 2
    assert "no such store; give the ML Metadata service as host:port" in capsys.readouterr().err
    assert gptpipe(double, token, "runs", "--mlmd", str(store)) == 2
    assert not store.exists() and double.runs == {}


def test_run_refuses_a_config_given_twice(double, token, compiled, capsys):
    upload(double, token, compiled)
    argv = ["run", *NEEDED, "--param", 'config={"model": {}}', "--config", "tiny"]
    assert gptpipe(double, token, *argv) == 2
    assert "--param config=... and --config both give the config" in capsys.readouterr().err


def test_upload_refuses_a_root_that_is_not_gcs_before_any_call(double, token, capsys):
    args = ["--pipeline-root", "/tmp/root", "--lock", str(LOCK), "--version", "v1"]
    code = gptpipe(double, token, "upload", *args)
    assert code == 2
    assert "is not gs://" in capsys.readouterr().err
    assert double.requests == []


def test_default_version_is_the_commit_and_refuses_a_dirty_checkout():
    assert ops.default_version("0123456789abcdef0123") == "git-0123456789ab"
    with pytest.raises(UserError, match="uncommitted changes"):
        ops.default_version("0123456789abcdef-dirty")
    with pytest.raises(UserError, match="--version"):
        ops.default_version("unknown")


# ---- run and --wait ------------------------------------------------------------------------


def test_run_wait_follows_a_run_to_success(double, token, compiled, capsys):
    upload(double, token, compiled)
    extra = ["--param", "train_job.workers=4", "--param", 'train_job.node_selector={"pool": "gpu"}']
    assert gptpipe(double, token, "run", *NEEDED, *extra, "--wait", "--poll", "0") == 0
    out = capsys.readouterr().out
    assert out.index(": RUNNING") < out.index(": SUCCEEDED")
    (run,) = double.runs.values()
    # KFP 2.5 ignores the YAML's defaultPipelineRoot: the compiled root travels with the run.
    assert run.runtime_config.pipeline_root == ROOT
    # Only the fields given travel (a schedule's firings take the newest version's defaults for
    # the rest); the step reads them as this object.
    assert run.runtime_config.parameters["train_job"] == {
        "workers": 4,
        "node_selector": {"pool": "gpu"},
    }
    job = TrainJob.from_dict(run.runtime_config.parameters["train_job"])
    assert job == TrainJob(workers=4, node_selector={"pool": "gpu"})  # the rest: the defaults
    assert run.runtime_config.parameters["corpus"] == "gs://bucket/corpus/"
    (version,) = double.versions.values()
    assert run.pipeline_version_reference.pipeline_version_id == version.pipeline_version_id


def test_run_wait_on_a_failed_run_names_the_task_and_where_to_look(double, token, compiled, capsys):
    """KFP 2.5 fills no error into a task (api_converter.go toApiPipelineTaskDetail): the line
    names the failed task and the node whose log tells why."""
    upload(double, token, compiled)
    double.run_scripts.append(RunScript("FAILED", failed_task="train"))
    assert gptpipe(double, token, "run", *NEEDED, "--wait", "--poll", "0") == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    (run,) = double.runs.values()
    assert "FAILED: task train failed: no error message in KFP's API: see the task's log in " in err
    assert f"the KFP UI (node {run.run_id[:8]}-" in err


def test_a_task_error_a_newer_server_fills_in_is_named():
    """KFP 2.5 leaves `error` empty; should a server fill it in, the task's own comes first,
    then its state history's, then the run's."""
    failed = kfp_server_api.GooglerpcStatus(code=2, message="worker 0: OOMKilled")

    def run_with(**task_fields: Any) -> Any:
        task = types.SimpleNamespace(
            task_id="t",
            display_name="train",
            state="FAILED",
            pod_name="p",
            child_tasks=None,
            parent_task_id=None,
            error=None,
            state_history=None,
        )
        task.__dict__.update(task_fields)
        details = types.SimpleNamespace(task_details=[task])
        return types.SimpleNamespace(run_details=details, error=None)

    history = [kfp_server_api.V2beta1RuntimeStatus(state="FAILED", error=failed)]
    for run in (run_with(error=failed), run_with(state_history=history)):
        assert ops.failed_tasks(run) == [ops.TaskFailure("train", "worker 0: OOMKilled")]


def test_a_store_that_cannot_be_read_still_tells_the_runs_failure(
    double, token, compiled, capsys, tmp_path
):
    upload(double, token, compiled)
    double.run_scripts.append(RunScript("FAILED", failed_task="train"))
    broken = tmp_path / "metadata.sqlite"
    broken.write_text("not a SQLite store")
    argv = ["run", *NEEDED, "--wait", "--poll", "0", "--mlmd", str(broken)]
    assert gptpipe(double, token, *argv) == 1
    err = capsys.readouterr().err
    assert "warning:" in err and "FAILED: task train failed: no error message in KFP's API" in err


def test_run_wait_names_only_the_failed_step_in_argos_chain_of_nodes(
    double, token, compiled, capsys
):
    """In KFP 2.5's task details the steps hang one off another (Argo's node children), so the
    failed run, root and exit-handler DAGs reach the failed step only through steps that
    succeeded: they are not failures of their own to name."""
    upload(double, token, compiled)
    double.run_scripts.append(RunScript("FAILED", failed_task="evaluate"))
    assert gptpipe(double, token, "run", *NEEDED, "--wait", "--poll", "0") == 1
    (run,) = double.runs.values()
    assert [f.task for f in ops.failed_tasks(run)] == ["evaluate"]
    assert "FAILED: task evaluate failed: no error message in KFP's API" in capsys.readouterr().err


def test_a_retried_task_is_named_once_and_a_retry_that_succeeded_not_at_all():
    """KFP 2.14+ honours the train step's retry policy: its executor is then an Argo Retry node
    over pods "executor(<n>)". A task that failed every attempt is one failure, with its last
    attempt's error; a failed attempt whose retry succeeded is none."""
    for script, expected in (
        (RunScript("FAILED", failed_task="train", attempts=3), ["train"]),
        (RunScript("FAILED", failed_task="evaluate", flaked_task="train"), ["evaluate"]),
        (RunScript("SUCCEEDED", flaked_task="train"), []),
    ):
        run = types.SimpleNamespace(run_id="0123456789abcdef", error=None)
        run.run_details = types.SimpleNamespace(task_details=run_details.tasks(run, script))
        assert [f.task for f in ops.failed_tasks(run)] == expected, script


@pytest.mark.parametrize("outcome", ["SUCCEEDED", "FAILED"])
def test_run_wait_warns_of_a_failed_exit_task_which_does_not_fail_the_run(
    double, token, compiled, capsys, outcome
):
    """Argo runs the exit task as an exit hook, whose failure leaves the run's state alone:
    the CLI says it failed and how to find the TFJobs it may have left holding GPUs."""
    upload(double, token, compiled)
    double.run_scripts.append(RunScript(outcome, failed_task="train", release_fails=True))
    code = gptpipe(double, token, "run", *NEEDED, "--wait", "--poll", "0")
    assert code == (0 if outcome == "SUCCEEDED" else 1)
    (run,) = double.runs.values()
    err = capsys.readouterr().err
    assert "its exit task release failed (no error message in KFP's API" in err
    assert f"kubectl get tfjobs -l gptpipe.dev/run-id={run.run_id}" in err
    if outcome == "FAILED":
        last = err.strip().splitlines()[-1]  # the step's failure is the run's, alone
        assert last.startswith(f"gptpipe: run {run.run_id} FAILED: task train failed:")
        assert "release" not in last


def test_run_wait_with_lineage_names_the_step_error_it_recorded(
    double, token, compiled, tmp_path, capsys
):
    from components import lineage

    upload(double, token, compiled)
    store = str(tmp_path / "metadata.sqlite")
    lineage.record_execution(
        store,
        step="train",
        pipeline_name="gptpipe",
        run_id="run-1",
        parameters={},
        inputs={},
        outputs={},
        properties={"error": "corpus gs://b/c is empty"},
        state="FAILED",
    )
    double.run_scripts.append(RunScript("FAILED", run_id="run-1"))
    assert gptpipe(double, token, "run", *NEEDED, "--wait", "--poll", "0", "--mlmd", store) == 1
    assert "task train failed: corpus gs://b/c is empty" in capsys.readouterr().err


def test_run_of_a_named_version_and_of_a_file(double, token, compiled, capsys):
    upload(double, token, compiled, "git-aaa")
    upload(double, token, compiled, "git-bbb")
    assert gptpipe(double, token, "run", *NEEDED, "--version", "git-aaa") == 0
    assert gptpipe(double, token, "run", *NEEDED, "--file", str(compiled)) == 0
    first, second = sorted(double.runs.values(), key=lambda r: r.created_at)
    aaa = next(v for v in double.versions.values() if v.display_name == "git-aaa")
    assert first.pipeline_version_reference.pipeline_version_id == aaa.pipeline_version_id
    assert second.pipeline_version_reference is None and second.pipeline_spec
    assert gptpipe(double, token, "run", *NEEDED, "--version", "git-ccc") == 2
    assert "no version git-ccc of pipeline gptpipe" in capsys.readouterr().err


def test_run_refuses_a_local_root_and_a_missing_parameter(double, token, compiled, capsys):
    upload(double, token, compiled)
    assert gptpipe(double, token, "run", *NEEDED, "--pipeline-root", "/data/root") == 2
    assert "is not gs://" in capsys.readouterr().err
    assert gptpipe(double, token, "run", "--param", "corpus=gs://b/c") == 2
    assert "needs a value for serving_dir" in capsys.readouterr().err
    assert gptpipe(double, token, "run", *NEEDED, "--param", "epochs=3") == 2
    assert "has no parameter epochs" in capsys.readouterr().err
    assert double.runs == {}


def test_run_config_is_resolved_here_into_the_config_parameter(double, token, compiled, capsys):
    from trainer.config import config_to_dict, resolve_config

    upload(double, token, compiled)
    argv = ("run", *NEEDED, "--config", "tiny", "--set", "train.train_steps=60")
    assert gptpipe(double, token, *argv) == 0
    (run,) = double.runs.values()
    expected = config_to_dict(resolve_config("tiny", ["train.train_steps=60"]))
    assert run.runtime_config.parameters["config"] == expected
    assert gptpipe(double, token, "run", *NEEDED, "--set", "train.train_steps=60") == 2
    assert "--set needs --config" in capsys.readouterr().err
    assert gptpipe(double, token, "run", *NEEDED, "--config", "huge") == 2
    assert "unknown preset 'huge'" in capsys.readouterr().err


def test_params_are_read_as_the_pipeline_declares_them():
    items = ["a=1", "b=true", "c=gs://x", 'd={"k": [1]}', "e=", "f=a=b", "g=8", 'h="8"', "i=1e3"]
    declared = {name: "" for name in "abcdef"}  # no type: JSON when it parses, else the text
    declared |= {"g": "STRING", "h": "STRING", "i": "STRING"}
    spec = {
        "root": {
            "inputDefinitions": {
                "parameters": {n: {"parameterType": t} for n, t in declared.items()}
            }
        }
    }
    source = ops.RunSource("file test.yaml", spec)
    params = ops.check_params(source, ops.parse_params(items))
    assert params == {
        **{"a": 1, "b": True, "c": "gs://x", "d": {"k": [1]}, "e": "", "f": "a=b"},
        # A string parameter gets the text typed (worker_cpu=8 is "8", and 1e3 stays 1e3),
        # or a quoted JSON string's content.
        **{"g": "8", "h": "8", "i": "1e3"},
    }
    assert all(type(v) in (int, bool, str, dict) for v in params.values())  # no ParamText left
    with pytest.raises(UserError, match="KEY=VALUE"):
        ops.parse_params(["novalue"])


def test_a_number_typed_for_a_string_parameter_reaches_the_run_as_the_string(
    double, token, compiled
):
    upload(double, token, compiled)
    extra = ["--param", "train_job.cpu=8", "--param", "train_job.workers=4"]
    assert gptpipe(double, token, "run", *NEEDED, *extra) == 0
    (run,) = double.runs.values()
    assert run.runtime_config.parameters["train_job"]["cpu"] == "8"  # a str field
    assert run.runtime_config.parameters["train_job"]["workers"] == 4  # an int one


def test_a_step_object_given_whole_and_a_field_of_it_fold_into_one(double, token, compiled):
    upload(double, token, compiled)
    whole = json.dumps({"max_nats_per_char": 3.0})
    extra = ["--param", f"eval_policy={whole}", "--param", "eval_policy.tolerance=0.2"]
    assert gptpipe(double, token, "run", *NEEDED, *extra) == 0
    (run,) = double.runs.values()
    policy = EvalPolicy.from_dict(run.runtime_config.parameters["eval_policy"])
    assert policy == EvalPolicy(max_nats_per_char=3.0, tolerance=0.2)


def test_a_field_given_by_its_old_flat_name_says_where_it_lives(double, token, compiled, capsys):
    upload(double, token, compiled)
    assert gptpipe(double, token, "run", *NEEDED, "--param", "workers=4") == 2
    assert "no parameter workers (did you mean train_job.workers?)" in capsys.readouterr().err
    assert double.runs == {}


# ---- schedule ------------------------------------------------------------------------------


def test_schedule_twice_leaves_one_recurring_run_on_the_pipeline(double, token, compiled, capsys):
    upload(double, token, compiled)
    args = ["--name", "nightly", "--cron", "0 0 2 * * *", *NEEDED]
    assert gptpipe(double, token, "schedule", *args) == 0
    assert gptpipe(double, token, "schedule", *args, "--no-catchup") == 0
    assert "replaced 1 recurring run(s) named nightly" in capsys.readouterr().out
    (job,) = double.recurring_runs.values()
    (pipeline,) = double.pipelines.values()
    # The pipeline and no version: each firing runs the newest version.
    assert job.pipeline_version_reference.pipeline_id == pipeline.pipeline_id
    assert not job.pipeline_version_reference.pipeline_version_id
    assert job.trigger.cron_schedule.cron == "0 0 2 * * *"
    assert job.max_concurrency == "1" and job.no_catchup is True and job.mode == "ENABLE"
    assert job.runtime_config.pipeline_root == ROOT


def test_a_failed_replacement_keeps_the_old_schedule(double, token, compiled, capsys):
    upload(double, token, compiled)
    args = ["--name", "weekly", "--cron", "0 0 2 * * 0", *NEEDED]
    assert gptpipe(double, token, "schedule", *args) == 0
    (before,) = double.recurring_runs
    double.fail_next(400, method="POST", path="/apis/v2beta1/recurringruns")
    assert gptpipe(double, token, "schedule", *args) != 0
    assert list(double.recurring_runs) == [before]  # created first, deleted after: still there


def test_a_five_field_cron_is_refused_with_the_six_field_form_before_any_call(
    double, token, capsys
):
    code = gptpipe(double, token, "schedule", "--name", "nightly", "--cron", "0 2 * * *", *NEEDED)
    assert code == 2
    assert "--cron '0 0 2 * * *'" in capsys.readouterr().err
    assert double.requests == []


@pytest.mark.parametrize(
    "cron", ["0 0 2 * * *", "0 30 */6 * * mon-fri", "0 0 0 1 jan,jul ?", "@daily", "@every 6h"]
)
def test_cron_accepted(cron):
    assert kfp_schedule.check_cron(cron) == cron


@pytest.mark.parametrize(
    ("cron", "why"),
    [
        ("0 0 24 * * *", "hour field '24' is out of range"),
        ("0 0 2 * * * *", "has 7 fields"),
        ("0 0 2 0 * *", "day of month field '0' is out of range"),
        ("0 0 2 * * 7", "day of week field '7' is out of range"),
        ("0 0 2 * foo *", "month field 'foo' has 'foo'"),
        ("0 0/0 2 * * *", "step '0'"),
        ("0 0 5-2 * * *", "backwards"),
    ],
)
def test_cron_refused(cron, why):
    with pytest.raises(UserError, match=why):
        kfp_schedule.check_cron(cron)


def test_another_pipelines_schedule_of_the_same_name_is_left_alone(double, token, compiled, capsys):
    upload(double, token, compiled)
    theirs = kfp_server_api.V2beta1RecurringRun(
        recurring_run_id="theirs",
        display_name="nightly",
        pipeline_version_reference=kfp_server_api.V2beta1PipelineVersionReference(
            pipeline_id="another-teams-pipeline"
        ),
        mode="ENABLE",
        status="ENABLED",
        created_at=double.tick(),
    )
    theirs.updated_at = theirs.created_at
    double.recurring_runs["theirs"] = theirs  # on a shared KFP
    args = ["--name", "nightly", "--cron", "0 0 2 * * *", *NEEDED]
    assert gptpipe(double, token, "schedule", *args) == 0
    assert gptpipe(double, token, "schedule", *args) == 0
    assert "replaced 1 recurring run(s) named nightly" in capsys.readouterr().out
    assert gptpipe(double, token, "unschedule", "--name", "nightly", "--disable") == 0
    assert gptpipe(double, token, "unschedule", "--name", "nightly") == 0
    assert list(double.recurring_runs) == ["theirs"] and theirs.mode == "ENABLE"


def test_unschedule_deletes_or_pauses(double, token, compiled, capsys):
    upload(double, token, compiled)
    gptpipe(double, token, "schedule", "--name", "nightly", "--cron", "0 0 2 * * *", *NEEDED)
    assert gptpipe(double, token, "unschedule", "--name", "nightly", "--disable") == 0
    (job,) = double.recurring_runs.values()
    assert job.mode == "DISABLE" and job.status == "DISABLED"
    assert gptpipe(double, token, "unschedule", "--name", "nightly") == 0
    assert double.recurring_runs == {}
    assert gptpipe(double, token, "unschedule", "--name", "nightly") == 0
    assert "no recurring run named nightly" in capsys.readouterr().out


# ---- runs ----------------------------------------------------------------------------------


def test_runs_lists_state_duration_version_and_what_lineage_recorded(
    double, token, compiled, tmp_path, capsys
):
    from components import lineage

    upload(double, token, compiled, "git-aaa")
    (version,) = double.versions.values()
    done = double.add_run("nightly-1", "SUCCEEDED", version.pipeline_version_id, 3725)
    double.add_run("nightly-2", "RUNNING", version.pipeline_version_id)
    store = str(tmp_path / "metadata.sqlite")
    with lineage.step(store, "tokenize", "gptpipe", done, {}) as rec:
        rec.dataset_version = "d" * 64
    with lineage.step(store, "push", "gptpipe", done, {}) as rec:
        rec.output(
            "pushed_model",
            "PushedModel",
            "gs://b/serving/7",
            {"pushed": 1, "pushed_destination": "gs://b/serving", "pushed_version": "7"},
        )
    capsys.readouterr()
    assert gptpipe(double, token, "runs", "--limit", "5", "--mlmd", store, "--json") == 0
    running, finished = json.loads(capsys.readouterr().out)
    assert (running["name"], running["state"], running["duration"]) == ("nightly-2", "RUNNING", "-")
    assert running["dataset_version"] == running["pushed_version"] == "-"
    assert finished["duration"] == "1h02m05s" and finished["version"] == "git-aaa"
    assert finished["dataset_version"] == "d" * 64
    assert finished["pushed_version"] == "gs://b/serving/7"
    assert gptpipe(double, token, "runs") == 0
    assert "nightly-1" in capsys.readouterr().out


# ---- auth, retries, connection -------------------------------------------------------------


def test_a_401_names_the_credential_tried_and_what_the_server_said(double, tmp_path, capsys):
    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-the-token")
    assert gptpipe(double, wrong, "runs") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert f"refused the token from --token-file ({wrong}): HTTP 401" in err
    assert "Failed to review the token provided" in err and "not-the-token" not in err


def test_a_401_with_the_token_from_the_environment_names_the_variable(
    double, tmp_path, monkeypatch, capsys
):
    wrong = tmp_path / "env-token"
    wrong.write_text("stale")
    monkeypatch.setenv(kfp_auth.TOKEN_PATH_ENV, str(wrong))
    assert gptpipe(double, None, "runs") == 2
    assert (
        f"refused the token from $KF_PIPELINES_SA_TOKEN_PATH ({wrong})" in capsys.readouterr().err
    )


def test_a_503_is_retried_then_the_call_succeeds(double, token, compiled):
    double.fail_next(503, times=2, path="/apis/v2beta1/pipelines")
    assert upload(double, token, compiled) == 0
    assert double.statuses("GET", "/apis/v2beta1/pipelines") == [503, 503, 200]
    assert len(double.versions) == 1


def test_a_4xx_is_not_retried_and_retries_are_bounded(double, token, capsys):
    double.fail_next(503, times=3, path="/apis/v2beta1/runs")
    assert gptpipe(double, token, "runs", "--retries", "2") == 2
    assert "answered list runs with HTTP 503" in capsys.readouterr().err
    assert double.statuses("GET", "/apis/v2beta1/runs") == [503, 503, 503]
    double.fail_next(400, times=1, path="/apis/v2beta1/runs")
    assert gptpipe(double, token, "runs") == 2
    assert double.statuses("GET", "/apis/v2beta1/runs")[3:] == [400]


def test_a_reset_while_creating_a_run_is_not_retried(double, token, compiled, capsys):
    upload(double, token, compiled)
    double.reset_next(method="POST", path="/apis/v2beta1/runs")
    assert gptpipe(double, token, "run", *NEEDED) == 2
    err = capsys.readouterr().err
    assert "start a run of" in err and "may have happened" in err and "before running" in err
    assert "then run the command again" not in err
    assert double.statuses("POST", "/apis/v2beta1/runs") == [-1]


@pytest.mark.slow
@pytest.mark.bad_input("a train step setting the job would refuse after tokenize (--param)")
@pytest.mark.parametrize(
    "param, says",
    [
        ("train_job.workers=0", "--param train_job.workers=0: use 1 or more"),
        ("train_job.gpus_per_worker=-1", "--param train_job.gpus_per_worker=-1: use 0 or more"),
        ("train_job.memory=lots", "--param train_job.memory='lots': use a Kubernetes quantity"),
        ("train_job.deadline_seconds=-5", "--param train_job.deadline_seconds=-5: use 0 or more"),
        ("train_job.launcher=slurm", "--param train_job.launcher='slurm': use one of"),
        ('train_job.tolerations=["gpu"]', '--param train_job.tolerations[0]="gpu": takes an'),
        ('train_job.node_selector={"pool": 1}', "--param train_job.node_selector.pool=1: takes"),
        ('train_job={"workers": 0}', "--param train_job.workers=0: use 1 or more"),
    ],
)
def test_a_job_setting_the_train_step_would_refuse_is_refused_before_the_run(
    double, token, compiled, capsys, param, says
):
    upload(double, token, compiled)
    assert gptpipe(double, token, "run", *NEEDED, "--param", param) == 2
    assert says in capsys.readouterr().err
    assert double.runs == {}


@pytest.mark.parametrize("poll", ["-1", "nan"])
def test_a_bad_poll_interval_is_refused_before_any_call(double, token, capsys, poll):
    assert gptpipe(double, token, "run", *NEEDED, "--wait", "--poll", poll) == 2
    assert f"--poll {float(poll)}" in capsys.readouterr().err and double.requests == []


def test_a_server_error_while_creating_a_run_says_it_may_have_started(
    double, token, compiled, capsys
):
    upload(double, token, compiled)
    double.fail_next(500, method="POST", path="/apis/v2beta1/runs")
    assert gptpipe(double, token, "run", *NEEDED) == 2
    err = capsys.readouterr().err
    assert "may have happened" in err and "HTTP 500" in err and "run the command again" not in err
    assert double.statuses("POST", "/apis/v2beta1/runs") == [500]  # not retried


def test_losing_the_server_while_waiting_says_the_run_goes_on(double, token, compiled, capsys):
    upload(double, token, compiled)
    double.fail_next(503, times=5, method="GET", path="/apis/v2beta1/runs/")
    argv = ["run", *NEEDED, "--wait", "--poll", "0", "--retries", "0"]
    assert gptpipe(double, token, *argv) == 2
    (run_id,) = double.runs
    err = capsys.readouterr().err
    assert f"run {run_id} started and goes on" in err and len(double.runs) == 1


def test_a_silent_connection_ends_in_an_error_not_a_hang(double, token, capsys, monkeypatch):
    monkeypatch.setattr(kfp_client, "READ_TIMEOUT_S", 0.3)
    double.stall_next(times=8, path="/apis/v2beta1/runs")  # urllib3 tries a GET 4 times
    started = time.monotonic()
    assert gptpipe(double, token, "runs", "--retries", "0") == 2
    assert time.monotonic() - started < kfp_api_double.STALL_S * 4  # no wait for an answer
    err = capsys.readouterr().err
    assert "cannot reach KFP" in err and "timed out" in err.lower()
    double._faults.clear()
    assert gptpipe(double, token, "runs", "--retries", "0") == 0  # the next request is served


def test_a_refused_connection_is_one_line_and_non_zero(double, token, capsys):
    double.refuse()
    assert gptpipe(double, token, "runs", "--retries", "1") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert f"cannot reach KFP at {double.host}" in err and "connection refused" in err


def test_a_multi_user_kfp_needs_a_namespace(double, token, capsys):
    double.multi_user = True
    assert gptpipe(double, token, "runs") == 2
    assert "multi-user: pass --namespace" in capsys.readouterr().err
    assert gptpipe(double, token, "runs", "--namespace", "team-a") == 0


def test_the_token_comes_from_the_file_then_the_environment_then_the_pod(tmp_path):
    files = {}
    for name in ("option", "env", "kfp-projected", "service-account"):
        files[name] = tmp_path / name
        files[name].write_text(f"{name}-token")
    pod = (("kfp", files["kfp-projected"]), ("sa", files["service-account"]))
    assert kfp_auth.choose(files["option"], str(files["env"]), pod).path == files["option"]
    assert kfp_auth.choose(None, str(files["env"]), pod).source == "$KF_PIPELINES_SA_TOKEN_PATH"
    assert kfp_auth.choose(None, "", pod).path == files["kfp-projected"]
    files["kfp-projected"].unlink()
    assert kfp_auth.choose(None, "", pod).path == files["service-account"]
    files["service-account"].unlink()
    assert kfp_auth.choose(None, "", pod).path is None
    with pytest.raises(UserError, match="cannot read the KFP token file"):
        kfp_auth.choose(None, str(tmp_path / "missing"), pod)
    files["option"].write_text("\n")
    with pytest.raises(UserError, match="is empty"):
        kfp_auth.choose(files["option"], "", pod)


def test_a_403_names_the_credential_and_is_not_retried(double, token, capsys):
    double.fail_next(403, times=1, path="/apis/v2beta1/runs")
    assert gptpipe(double, token, "runs", "--namespace", "team-a") == 2
    err = capsys.readouterr().err
    assert f"refused the token from --token-file ({token}): HTTP 403" in err
    assert "--namespace" in err
    assert double.statuses("GET", "/apis/v2beta1/runs") == [403]


@pytest.mark.bad_input("a kfp run or schedule of gpt2-xl on T4 nodes")
def test_a_run_the_train_step_would_refuse_for_memory_is_not_started():
    from trainer.config import config_to_dict, resolve_config

    t4 = {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}
    params = {
        "config": config_to_dict(resolve_config("gpt2-xl")),
        "train_job": {"workers": 8, "node_selector": t4},
    }
    with pytest.raises(UserError, match="train step would refuse this run: .* T4"):
        ops.check_train_plan(params, {})
    compiled = {"config": {"defaultValue": params["config"]}, "train_job": {"defaultValue": {}}}
    ops.check_train_plan({}, compiled)  # no GPU label: the batch splits, memory unknown


@pytest.mark.bad_input("a kfp run whose micro-batch overflows TensorFlow's int32 shapes")
def test_a_run_whose_tensors_overflow_int32_is_not_started_and_its_workers_are_not_capped():
    from trainer.config import config_to_dict, resolve_config

    big = config_to_dict(resolve_config("tiny", ["train.batch_size=50000000"]))
    with pytest.raises(UserError, match="train step would refuse this run: .* int32 limit"):
        ops.check_train_plan({"config": big, "train_job": {"workers": 64}}, {})
    small = config_to_dict(resolve_config("tiny"))
    # A TFJob's workers are pods on the cluster's nodes: no local CPU cap applies.
    ops.check_train_plan({"config": small, "train_job": {"workers": 512}}, {})
