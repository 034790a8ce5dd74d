"""The lineage layer on a real SQLite ML Metadata store, checked through the raw MLMD API."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from ml_metadata.proto import metadata_store_pb2 as mlmd

from components import lineage
from components.lineage import ArtifactRecord
from contracts.errors import UserError
from pipelines.cli import lineage as lineage_cmd
from tests.components.lineage.fake_runs import DATASET, PIPELINE, fake_run


@pytest.fixture
def store_uri(tmp_path: Path) -> str:
    return str(tmp_path / "mlmd" / "metadata.sqlite")


def test_raw_mlmd_walk_from_pushed_model_reaches_examples_and_train(store_uri, tmp_path):
    run = fake_run(store_uri, tmp_path, "run-1")
    store = lineage.open_store(store_uri)
    assert Path(store_uri).is_file()

    def producer(artifact_id: int) -> mlmd.Execution:
        (event,) = [
            e
            for e in store.get_events_by_artifact_ids([artifact_id])
            if e.type == mlmd.Event.OUTPUT
        ]
        return store.get_executions_by_id([event.execution_id])[0]

    def inputs(execution_id: int) -> dict[str, mlmd.Artifact]:
        events = [
            e
            for e in store.get_events_by_execution_ids([execution_id])
            if e.type == mlmd.Event.INPUT
        ]
        found = store.get_artifacts_by_id([e.artifact_id for e in events])
        by_id = {a.id: a for a in found}
        return {e.path.steps[0].key: by_id[e.artifact_id] for e in events}

    (pushed,) = store.get_artifacts_by_uri(run["pushed"])
    assert pushed.state == mlmd.Artifact.LIVE
    push = producer(pushed.id)
    assert store.get_execution_types_by_id([push.type_id])[0].name == "gptpipe.Push"
    push_inputs = inputs(push.id)
    assert set(push_inputs) == {"model", "model_blessing"}
    train = producer(push_inputs["model"].id)
    assert train.id == run["ids"]["train"]
    assert train.last_known_state == mlmd.Execution.COMPLETE
    assert train.custom_properties["learning_rate"].double_value == pytest.approx(3e-4)
    assert train.custom_properties["steps"].int_value == 20
    assert json.loads(train.custom_properties["overrides"].string_value) == ["model.n_layer=1"]
    examples = inputs(train.id)["examples"]
    assert examples.uri == run["examples"]
    assert examples.custom_properties["dataset_version"].string_value == DATASET
    assert json.loads(examples.properties["split_names"].string_value) == ["train", "eval"]
    assert producer(examples.id).id == run["ids"]["tokenize"]
    # The Examples was reused by URI: one artifact, not one per consuming step.
    assert len(store.get_artifacts_by_uri(run["examples"])) == 1


def test_execution_records_times_environment_and_contexts(store_uri, tmp_path):
    run = fake_run(store_uri, tmp_path, "run-1")
    store = lineage.open_store(store_uri)
    (tokenize,) = store.get_executions_by_id([run["ids"]["tokenize"]])
    props = tokenize.custom_properties
    assert props["start_time_ms"].int_value == 1_000_000
    assert props["end_time_ms"].int_value == 1_002_500
    assert props["environment_digest"].string_value == lineage.environment_digest()
    assert props["image_digest"].string_value == "sha256:" + "a" * 64
    contexts = store.get_contexts_by_execution(tokenize.id)
    types = {c.type_id: c for c in contexts}
    names = {store.get_context_types_by_id([tid])[0].name: c.name for tid, c in types.items()}
    assert names == {"pipeline": PIPELINE, "pipeline_run": "run-1", "dataset_version": DATASET}
    # Outputs are attributed to the run context too, so KFP-style run queries find them.
    run_ctx = store.get_context_by_type_and_name("pipeline_run", "run-1")
    uris = {a.uri for a in store.get_artifacts_by_context(run_ctx.id)}
    assert {run["examples"], run["model"], run["pushed"]} <= uris


def test_types_use_tfx_names_and_properties(store_uri, tmp_path):
    fake_run(store_uri, tmp_path, "run-1")
    store = lineage.open_store(store_uri)
    artifact_types = {t.name: t for t in store.get_artifact_types()}
    assert set(artifact_types) == {
        "Examples",
        "Model",
        "ModelEvaluation",
        "ModelBlessing",
        "PushedModel",
    }
    assert dict(artifact_types["Examples"].properties) == {
        "span": mlmd.INT,
        "split_names": mlmd.STRING,
        "version": mlmd.INT,
    }
    assert {t.name for t in store.get_execution_types()} == {
        "gptpipe.Tokenize",
        "gptpipe.Train",
        "gptpipe.Evaluate",
        "gptpipe.Push",
    }
    assert {t.name for t in store.get_context_types()} == {
        "pipeline",
        "pipeline_run",
        "dataset_version",
    }


def test_run_summary_and_trace(store_uri, tmp_path):
    run = fake_run(store_uri, tmp_path, "run-1")
    summary = lineage.run_summary(store_uri, "run-1")
    json.dumps(summary)  # plain values only
    assert summary["dataset_version"] == DATASET
    assert summary["pipeline_name"] == PIPELINE
    assert [e["step"] for e in summary["executions"]] == ["tokenize", "train", "evaluate", "push"]
    evaluate = summary["steps"]["evaluate"]
    assert evaluate["state"] == "COMPLETE"
    assert evaluate["outputs"]["evaluation"][0]["properties"]["eval_loss"] == pytest.approx(2.4)
    blessing = evaluate["outputs"]["blessing"][0]["properties"]
    assert blessing["blessed"] == 1 and blessing["baseline_model"] == ""
    pushed = summary["steps"]["push"]["outputs"]["pushed_model"][0]["properties"]
    assert pushed["pushed_version"] == "1"
    assert pushed["pushed_destination"] == str(tmp_path / "serving")

    traced = lineage_cmd.trace(store_uri, run["pushed"])
    json.dumps(traced)
    assert traced["model"]["uri"] == run["model"]
    assert traced["train"]["properties"]["learning_rate"] == pytest.approx(3e-4)
    assert traced["examples"]["uri"] == run["examples"]
    assert traced["dataset_version"] == DATASET
    assert traced["tokenize"]["id"] == run["ids"]["tokenize"]
    assert traced["blessing"]["properties"]["blessed"] == 1
    assert traced["evaluate"]["step"] == "evaluate"
    assert [e["properties"]["eval_loss"] for e in traced["evaluations"]] == [pytest.approx(2.4)]


def test_query_helpers(store_uri, tmp_path):
    run = fake_run(store_uri, tmp_path, "run-1")
    model = lineage.find_artifact(store_uri, run["model"])
    assert model is not None and model["type_name"] == "Model"
    assert lineage.find_artifact(store_uri, run["model"], "Examples") is None
    assert lineage.find_artifact(store_uri, str(tmp_path / "nowhere")) is None
    train = lineage.producer_of(store_uri, model)
    assert train is not None and train["step"] == "train"
    assert train["type_name"] == "gptpipe.Train"
    assert lineage.inputs_of(store_uri, train)["examples"][0]["uri"] == run["examples"]
    assert lineage.outputs_of(store_uri, train)["model"][0]["id"] == model["id"]


def test_two_runs_share_dataset_context(store_uri, tmp_path):
    first = fake_run(store_uri, tmp_path, "run-1")
    second = fake_run(store_uri, tmp_path, "run-2", baseline=first["model"])
    store = lineage.open_store(store_uri)
    assert len(store.get_contexts_by_type("dataset_version")) == 1
    assert len(store.get_contexts_by_type("pipeline")) == 1
    assert len(store.get_contexts_by_type("pipeline_run")) == 2
    # Each tokenize wrote a new Examples at the same URI; run 2's train read the latest.
    examples = store.get_artifacts_by_uri(first["examples"])
    assert len(examples) == 2
    train = lineage.run_summary(store_uri, "run-2")["steps"]["train"]
    assert lineage.inputs_of(store_uri, train)["examples"][0]["id"] == max(a.id for a in examples)

    models = lineage.models_for_dataset(store_uri, DATASET)
    assert [m["model"]["uri"] for m in models] == [first["model"], second["model"]]
    assert [m["execution"]["properties"]["run_id"] for m in models] == ["run-1", "run-2"]
    assert lineage.models_for_dataset(store_uri, "e" * 64) == []
    # Run 2's evaluate read the baseline by URI: the stored Model, not a copy.
    evaluate = lineage.run_summary(store_uri, "run-2")["steps"]["evaluate"]
    baseline = lineage.inputs_of(store_uri, evaluate)["baseline_model"][0]
    assert baseline["id"] == models[0]["model"]["id"]


def test_input_reuse_takes_latest_of_same_type(store_uri, tmp_path):
    uri = str(tmp_path / "model")
    for run_id in ("a", "b"):
        lineage.record_execution(
            store_uri,
            step="train",
            pipeline_name=PIPELINE,
            run_id=run_id,
            parameters={},
            inputs={},
            outputs={"model": [ArtifactRecord("Model", uri)]},
        )
    execution_id = lineage.record_execution(
        store_uri,
        step="evaluate",
        pipeline_name=PIPELINE,
        run_id="c",
        parameters={},
        inputs={
            "model": [ArtifactRecord("Model", uri)],
            "other": [ArtifactRecord("Examples", uri)],
        },
        outputs={},
    )
    latest = lineage.find_artifact(store_uri, uri, "Model")
    store = lineage.open_store(store_uri)
    used = {e.artifact_id for e in store.get_events_by_execution_ids([execution_id])}
    examples = lineage.find_artifact(store_uri, uri, "Examples")
    assert latest is not None and examples is not None
    assert used == {latest["id"], examples["id"]}
    assert lineage.producer_of(store_uri, examples) is None  # created as an external input


def test_failed_state_and_errors(store_uri, tmp_path):
    common: dict[str, Any] = dict(pipeline_name=PIPELINE, run_id="r", inputs={}, outputs={})
    execution_id = lineage.record_execution(
        store_uri, step="train", parameters={}, state="FAILED", **common
    )
    (execution,) = lineage.open_store(store_uri).get_executions_by_id([execution_id])
    assert execution.last_known_state == mlmd.Execution.FAILED
    assert lineage.run_summary(store_uri, "r")["steps"]["train"]["state"] == "FAILED"

    with pytest.raises(ValueError, match="state"):
        lineage.record_execution(store_uri, step="train", parameters={}, state="DONE", **common)
    with pytest.raises(ValueError, match="run_id"):
        lineage.record_execution(store_uri, step="train", parameters={"run_id": "x"}, **common)
    with pytest.raises(ValueError, match="artifact type"):
        lineage.record_execution(
            store_uri,
            step="train",
            parameters={},
            pipeline_name=PIPELINE,
            run_id="r",
            inputs={},
            outputs={"model": [ArtifactRecord("SavedModel", "/x")]},
        )
    with pytest.raises(ValueError, match="span"):
        lineage.record_execution(
            store_uri,
            step="tokenize",
            parameters={},
            pipeline_name=PIPELINE,
            run_id="r",
            inputs={},
            outputs={"examples": [ArtifactRecord("Examples", "/x", {"span": "zero"})]},
        )
    with pytest.raises(UserError, match="already belongs"):
        lineage.record_execution(
            store_uri,
            step="train",
            parameters={},
            pipeline_name="other",
            run_id="r",
            inputs={},
            outputs={},
        )
    with pytest.raises(UserError, match="no run"):
        lineage.run_summary(store_uri, "missing")
    with pytest.raises(UserError, match="no PushedModel"):
        lineage_cmd.trace(store_uri, str(tmp_path / "missing"))


def test_environment_digest_is_stable_hex():
    digest = lineage.environment_digest()
    assert re.fullmatch(r"[0-9a-f]{64}", digest)
    assert lineage.environment_digest() == digest


@pytest.mark.parametrize(
    ("address", "host", "port"),
    [
        ("metadata-grpc-service.kubeflow:8080", "metadata-grpc-service.kubeflow", 8080),
        ("grpc://localhost:9090", "localhost", 9090),
        ("10.0.0.7:8080", "10.0.0.7", 8080),
    ],
)
def test_grpc_addresses(address, host, port):
    config = lineage.store_config(address)
    assert isinstance(config, mlmd.MetadataStoreClientConfig)
    assert (config.host, config.port) == (host, port)
    lineage.open_store(address)  # builds a channel; nothing is contacted yet


def test_sqlite_addresses(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = lineage.store_config("runs/metadata.sqlite")
    assert isinstance(config, mlmd.ConnectionConfig)
    assert config.sqlite.filename_uri == str(tmp_path / "runs" / "metadata.sqlite")
    assert config.sqlite.connection_mode == mlmd.SqliteMetadataSourceConfig.READWRITE_OPENCREATE
    for bad in ("", "gs://bucket/metadata.sqlite", "mysql://db:3306"):
        with pytest.raises(UserError):
            lineage.store_config(bad)


def test_non_finite_numbers_are_stored_as_strings(tmp_path):
    store = str(tmp_path / "m.sqlite")
    lineage.record_execution(
        store,
        step="evaluate",
        pipeline_name="p",
        run_id="r",
        parameters={},
        inputs={},
        outputs={
            "evaluation": [
                lineage.ArtifactRecord(
                    "ModelEvaluation", "/e", {"perplexity": float("inf"), "loss": float("nan")}
                )
            ]
        },
    )
    evaluation = lineage.find_artifact(store, "/e")
    assert evaluation["properties"] == {"perplexity": "inf", "loss": "nan"}


def test_steps_kfp_skipped_are_recorded_cached_in_the_run_that_used_them(store_uri, tmp_path):
    old = fake_run(store_uri, tmp_path / "r0", "run-0")
    run = fake_run(store_uri, tmp_path / "r1", "run-1")
    # run-2: KFP served tokenize and train from its cache, so only evaluate ran (twice: a retry).
    for _ in range(2):
        lineage.record_execution(
            store_uri,
            step="evaluate",
            pipeline_name=PIPELINE,
            run_id="run-2",
            parameters={},
            inputs={
                "examples": [ArtifactRecord("Examples", run["examples"])],
                "model": [ArtifactRecord("Model", run["model"])],
                "baseline_model": [ArtifactRecord("Model", old["model"])],
            },
            outputs={},
            upstream={"examples", "model"},
            dataset_version=DATASET,
        )
    executions = lineage.run_summary(store_uri, "run-2")["executions"]
    states = [(e["step"], e["state"]) for e in executions]
    assert sorted(states) == [
        ("evaluate", "COMPLETE"),
        ("evaluate", "COMPLETE"),
        ("tokenize", "CACHED"),
        ("train", "CACHED"),
    ]
    store = lineage.open_store(store_uri)
    run_ctx = store.get_context_by_type_and_name("pipeline_run", "run-2")
    (train,) = [
        e
        for e in store.get_executions_by_context(run_ctx.id)
        if e.last_known_state == mlmd.Execution.CACHED
        and e.custom_properties["step"].string_value == "train"
    ]
    props = train.custom_properties
    assert props["cached_from_run_id"].string_value == "run-1"
    assert props["cached_from_execution_id"].int_value == run["ids"]["train"]
    assert props["run_id"].string_value == "run-2"
    assert props["steps"].int_value == 20  # the original's parameters, copied
    (output,) = [e for e in store.get_events_by_execution_ids([train.id])]
    assert output.type == mlmd.Event.OUTPUT
    assert store.get_artifacts_by_id([output.artifact_id])[0].uri == run["model"]
    (tokenize,) = [
        e
        for e in store.get_executions_by_context(run_ctx.id)
        if e.custom_properties["step"].string_value == "tokenize"
    ]
    assert tokenize.custom_properties["image_digest"].string_value == "sha256:" + "a" * 64
    # The original producer stays the producer; a cached model is not a new model.
    chain = lineage_cmd.trace(store_uri, run["pushed"])
    assert (chain["train"]["state"], chain["train"]["properties"]["run_id"]) == (
        "COMPLETE",
        "run-1",
    )
    models = [m["model"]["uri"] for m in lineage.models_for_dataset(store_uri, DATASET)]
    assert models == [old["model"], run["model"]]


def test_parameters_round_trip_and_latest_pushed_model(store_uri, tmp_path):
    assert lineage.latest_pushed_model(store_uri) is None
    fake_run(store_uri, tmp_path / "a", "run-1")
    second = fake_run(store_uri, tmp_path / "b", "run-2")
    assert lineage.latest_pushed_model(store_uri) == second["pushed"]
    train = lineage_cmd.trace(store_uri, second["pushed"])["train"]
    assert lineage.parameters_of(train) == {
        "learning_rate": 3e-4,
        "steps": 20,
        "overrides": ["model.n_layer=1"],
    }


def test_a_step_is_recorded_running_at_once_and_a_killed_one_is_closed_later(store_uri, tmp_path):
    seen = {}
    with lineage.step(store_uri, "train", PIPELINE, "run-9", {"workers": 2}) as rec:
        # While the block runs, the execution is already there: a SIGKILL here leaves it.
        (running,) = lineage.run_summary(store_uri, "run-9")["executions"]
        seen["state"] = running["state"]
        rec.set(job_name="j")
    assert seen["state"] == "RUNNING"
    (done,) = lineage.run_summary(store_uri, "run-9")["executions"]
    assert (done["id"], done["state"]) == (running["id"], "COMPLETE")  # the same execution

    # A killed step cannot complete its execution: the run's exit handler closes it.
    lineage.record_execution(
        store_uri,
        step="evaluate",
        pipeline_name=PIPELINE,
        run_id="run-9",
        parameters={},
        inputs={},
        outputs={},
        state="RUNNING",
    )
    assert lineage.close_unfinished(store_uri, "run-9", "the pod was killed") == ["evaluate"]
    assert lineage.failure_of(store_uri, "run-9") == ("evaluate", "the pod was killed")
    assert lineage.close_unfinished(store_uri, "run-9", "again") == []


def test_the_failure_of_a_run_is_a_steps_last_attempt_not_one_a_retry_replaced(store_uri):
    def attempt(step: str, state: str, error: str = "") -> None:
        lineage.record_execution(
            store_uri,
            step=step,
            pipeline_name=PIPELINE,
            run_id="run-r",
            parameters={},
            inputs={},
            outputs={},
            properties={"error": error} if error else {},
            state=state,
        )
        time.sleep(0.002)  # each attempt starts after the one before (start_time_ms)

    attempt("train", "FAILED", "worker-0 exited with code 137")  # KFP retried it
    attempt("train", "COMPLETE")
    assert lineage.failure_of(store_uri, "run-r") is None
    attempt("evaluate", "FAILED", "the model in service is damaged")
    assert lineage.failure_of(store_uri, "run-r") == ("evaluate", "the model in service is damaged")


def test_an_unreachable_store_fails_the_step_before_its_work(tmp_path, capsys):
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    worked = []
    with (
        pytest.raises(SystemExit) as exited,
        lineage.step(f"127.0.0.1:{port}", "tokenize", PIPELINE, "run-1", {}),
    ):
        worked.append(True)
    assert exited.value.code == 2 and worked == []
    err = capsys.readouterr().err
    assert err.startswith("gptpipe tokenize: error:") and f"127.0.0.1:{port}" in err
    assert err.count("\n") == 1  # one line, no traceback
