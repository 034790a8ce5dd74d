"""The KFP REST double's namespaces and run parameters, over HTTP as a client sends them.

Each rule is KFP 2.5.0's: the scoping of lists (server/*_server.go list*, storage/*_store.go,
resource/resource_manager.go ReplaceNamespace), the check of a run's parameters on create
(template/v2_template.go validatePipelineJobInputs) and task details without an error
(server/api_converter.go toApiPipelineTaskDetail).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.doubles.kfp.api_server import KfpApiDouble, RunScript

TOKEN = "secret-token"
SPEC = {
    "pipelineInfo": {"name": "p"},
    "schemaVersion": "2.1.0",
    "root": {
        "inputDefinitions": {
            "parameters": {
                "corpus": {"parameterType": "STRING"},
                "steps": {"parameterType": "NUMBER_INTEGER", "defaultValue": 10},
                "train_job": {"parameterType": "STRUCT", "isOptional": True},
                "shuffle": {"parameterType": "BOOLEAN", "defaultValue": True},
            }
        }
    },
}


def call(double: KfpApiDouble, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One request to the double: its status and JSON answer."""
    request = urllib.request.Request(
        f"{double.host}/apis/v2beta1/{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def ok(double: KfpApiDouble, method: str, path: str, body: Any = None) -> Any:
    status, answer = call(double, method, path, body)
    assert status == 200, answer
    return answer


@pytest.fixture
def double() -> Iterator[KfpApiDouble]:
    with KfpApiDouble(token=TOKEN) as served:
        yield served


def names(answer: Any, key: str) -> list[str]:
    return sorted(item["display_name"] for item in answer.get(key, []))


def seed(double: KfpApiDouble) -> dict[str, str]:
    """Shared and per-namespace pipelines, an experiment and a run in each of two namespaces;
    the experiment ids by namespace."""
    ok(double, "POST", "pipelines", {"display_name": "shared"})
    experiments = {}
    for namespace in ("team-a", "team-b"):
        ok(double, "POST", "pipelines", {"display_name": f"p-{namespace}", "namespace": namespace})
        made = ok(
            double,
            "POST",
            "experiments",
            {"display_name": f"e-{namespace}", "namespace": namespace},
        )
        experiments[namespace] = made["experiment_id"]
        run = {
            "display_name": f"run-{namespace}",
            "experiment_id": made["experiment_id"],
            "pipeline_spec": SPEC,
            "runtime_config": {"parameters": {"corpus": "gs://b/c"}},
        }
        ok(double, "POST", "runs", run)
    return experiments


def test_a_multi_user_server_lists_exactly_the_namespace_asked_for(double):
    double.multi_user = True
    experiments = seed(double)
    # pipeline_store.go: Namespace = ns; the shared pipelines ("") are listed on their own.
    assert names(ok(double, "GET", "pipelines?namespace=team-a"), "pipelines") == ["p-team-a"]
    assert names(ok(double, "GET", "pipelines"), "pipelines") == ["shared"]
    assert names(ok(double, "GET", "experiments?namespace=team-b"), "experiments") == ["e-team-b"]
    assert names(ok(double, "GET", "runs?namespace=team-a"), "runs") == ["run-team-a"]
    by_experiment = ok(double, "GET", f"runs?experiment_id={experiments['team-b']}")
    assert names(by_experiment, "runs") == ["run-team-b"]
    assert "runs" not in ok(double, "GET", "runs?namespace=team-c")
    # canAccessRun, canAccessExperiment, canAccessJob: no namespace is a 400 in multi-user mode.
    for path, words in (
        ("runs", "A run cannot have an empty namespace in multi-user mode"),
        ("experiments", "An experiment cannot have an empty namespace in multi-user mode"),
        ("recurringruns", "a recurring run cannot have an empty namespace in multi-user mode"),
    ):
        status, answer = call(double, "GET", path)
        assert (status, answer["code"]) == (400, 3) and words in answer["message"], path


def test_a_single_user_server_ignores_the_namespace(double):
    """ReplaceNamespace: single-user mode stores and lists everything under ""."""
    seed(double)
    assert names(ok(double, "GET", "pipelines?namespace=team-a"), "pipelines") == [
        "p-team-a",
        "p-team-b",
        "shared",
    ]
    assert names(ok(double, "GET", "runs?namespace=team-a"), "runs") == ["run-team-a", "run-team-b"]
    assert all("namespace" not in e for e in ok(double, "GET", "experiments")["experiments"])


@pytest.mark.parametrize(
    ("parameters", "refused"),
    [
        ({"corpus": "gs://b/c", "train_job": {"workers": 2}, "steps": 3}, ""),
        ({}, "parameter corpus is not optional, yet has neither default value nor user provided"),
        (
            {"corpus": "gs://b/c", "steps": "3"},
            "input parameter steps requires type double or integer, but the parameter value is "
            "not of number value type",
        ),
        (
            {"corpus": "gs://b/c", "steps": True},
            "input parameter steps requires type double or integer",
        ),
        (
            {"corpus": 7},
            "input parameter corpus requires type string, but the input parameter is not of "
            "string value type",
        ),
        (
            {"corpus": "gs://b/c", "train_job": "{}"},
            "input parameter train_job requires type struct",
        ),
        (
            {"corpus": "gs://b/c", "workers": 2, "gpus": 1},
            "parameter(s) provided are not required by pipeline: gpus, workers",
        ),
    ],
)
def test_a_run_is_created_only_with_the_parameters_its_pipeline_takes(double, parameters, refused):
    experiment = ok(double, "POST", "experiments", {"display_name": "gptpipe"})["experiment_id"]
    run = {
        "display_name": "r",
        "experiment_id": experiment,
        "pipeline_spec": SPEC,
        "runtime_config": {"parameters": parameters},
    }
    status, answer = call(double, "POST", "runs", run)
    if not refused:
        assert status == 200 and answer["state"] == "PENDING"
        return
    assert (status, answer["code"]) == (400, 3)
    head = "Failed to create a new run: Failed to generate the ExecutionSpec: invalid pipeline "
    assert answer["message"].startswith(head + "job inputs: Invalid input error: " + refused)
    assert double.runs == {}


def test_a_recurring_run_is_checked_on_its_pipelines_newest_version(double):
    ok(double, "POST", "pipelines", {"display_name": "gptpipe"})
    (pipeline_id,) = double.pipelines
    double._add_version(pipeline_id, "v1", yaml.safe_dump(SPEC))
    job = {
        "display_name": "weekly",
        "pipeline_version_reference": {"pipeline_id": pipeline_id},
        "runtime_config": {"parameters": {"corpus": "gs://b/c", "seq_len": 8}},
        "trigger": {"cron_schedule": {"cron": "0 0 2 * * 0"}},
        "mode": "ENABLE",
    }
    status, answer = call(double, "POST", "recurringruns", job)
    assert (status, answer["code"]) == (400, 3)
    assert answer["message"].endswith("not required by pipeline: seq_len")
    job["runtime_config"]["parameters"].pop("seq_len")
    assert ok(double, "POST", "recurringruns", job)["status"] == "ENABLED"


def test_a_failed_runs_tasks_carry_no_error(double):
    experiment = ok(double, "POST", "experiments", {"display_name": "gptpipe"})["experiment_id"]
    double.run_scripts.append(RunScript("FAILED", failed_task="train", running_polls=0))
    run = {
        "display_name": "r",
        "experiment_id": experiment,
        "pipeline_spec": SPEC,
        "runtime_config": {"parameters": {"corpus": "gs://b/c"}},
    }
    run_id = ok(double, "POST", "runs", run)["run_id"]
    answer = ok(double, "GET", f"runs/{run_id}")
    assert answer["state"] == "FAILED"
    tasks = answer["run_details"]["task_details"]
    assert any(t["display_name"] == "train" and t["state"] == "FAILED" for t in tasks)
    assert not any("error" in t or "error" in h for t in tasks for h in t["state_history"])
