"""The KFP 2.5.0 backend harness (tests/doubles/kfp/backend.py) on tiny compiled pipelines.

Every pipeline here is compiled to YAML by kfp's Compiler and run from that YAML only: each task
is a fresh `python3 -m kfp.dsl.executor_main` process in its own folder, and parameters and
artifacts travel through the GCS emulator. No TensorFlow.
"""

import json
import time
import uuid
from pathlib import Path

import pytest
import yaml
from google.protobuf import json_format
from kfp import compiler, dsl, kubernetes
from kfp.dsl import Dataset, Input, Output
from kfp.pipeline_spec import pipeline_spec_pb2 as pb

from tests.doubles.kfp.backend import CACHED, FAILED, SKIPPED, SUCCEEDED, KfpBackend
from tests.doubles.kfp.cache import cache_key, fingerprint
from tests.doubles.kfp.ir import PipelineRejected
from tests.doubles.kfp.launcher import VENV_BIN

IMAGE = "python:3.11-slim"  # never pulled: the task runs in this repo's environment


# ---- components: self-contained, their source is embedded in the YAML -------------------------


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def produce(message: str, out: Output[Dataset]) -> str:
    import os

    with open(out.path, "w") as f:
        f.write(message)
    for leftover in ("left-behind.txt", os.path.expanduser("~/left-behind.txt")):
        open(leftover, "w").close()
    out.metadata.update({"words": len(message.split()), "shouted": True})
    return message.upper()


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def consume(data: Input[Dataset], shout: str, times: int = 2) -> str:
    import json
    import os

    leaked = os.path.exists("left-behind.txt") or os.path.exists(
        os.path.expanduser("~/left-behind.txt")
    )
    with open(data.path) as f:
        text = f.read()
    return json.dumps(
        {"text": text * times, "shout": shout, "leaked": leaked, "metadata": data.metadata}
    )


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def echo(values: list) -> list:
    return values


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def count_words(text: str, count: dsl.OutputPath(int)):
    with open(count, "w") as f:  # an output_file, which the launcher reads back
        f.write(f" {len(text.split())}\n")


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def move(where: str, root: str, out: Output[Dataset]):
    """Points `out` `inside` or `outside` the run's root, to an object written `direct` to GCS,
    or to a folder under `root`, as a step that keeps data under the pipeline root would."""
    import os

    from google.cloud import storage

    parent = out.uri.rsplit("/", 1)[0]
    if where == "root":
        out.uri = f"{root}/datasets/v1"
        os.makedirs(out.uri)
        with open(f"{out.uri}/data.txt", "w") as f:
            f.write("examples")
        return
    if where == "direct":  # written straight to GCS, nothing under the local path
        client = storage.Client()  # STORAGE_EMULATOR_HOST: the emulator, anonymously
        bucket, _, key = parent[len("gs://") :].partition("/")
        client.bucket(bucket).blob(f"{key}/direct/data.txt").upload_from_string("direct bytes")
        out.uri = f"{parent}/direct"
        return
    out.uri = (
        f"{parent}/moved"
        if where == "inside"
        else "gs://" + out.uri[5:].split("/")[0] + "/elsewhere"
    )
    with open(out.path, "w") as f:  # the new local path, which the launcher uploads from
        f.write(f"{where} bytes")


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def read(data: Input[Dataset]) -> str:
    import os

    path = os.path.join(data.path, "data.txt") if os.path.isdir(data.path) else data.path
    with open(path) as f:
        return f"{data.uri} {f.read()}"


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def flaky(marker: str, wait: bool) -> str:
    """Fails its first attempt (it leaves a marker object); `wait` makes the first attempt hang."""
    import time

    from google.cloud import storage

    bucket, _, key = marker[len("gs://") :].partition("/")
    blob = storage.Client().bucket(bucket).blob(key)
    if blob.exists():
        return "a later attempt"
    blob.upload_from_string("first attempt")
    print("first attempt is running", flush=True)
    if wait:
        time.sleep(120)
    raise RuntimeError("first attempt fails on purpose")


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def sleeper(seconds: int):
    import signal
    import time

    signal.signal(signal.SIGTERM, lambda *_: print("got SIGTERM, ignoring it", flush=True))
    print("sleeping", flush=True)
    time.sleep(seconds)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def exits(code: int):
    import sys

    sys.exit(code)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def cleanup(note: str) -> str:
    return f"cleaned up after {note}"


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def env_probe() -> str:
    import json
    import os
    import shutil

    names = ["RUN_ID", "NAMESPACE", "TOKEN", "MODE", "EXTRA", "LEAK", "KFP_POD_NAME", "KFP_POD_UID"]
    names += ["METADATA_GRPC_SERVICE_HOST", "METADATA_GRPC_SERVICE_PORT", "HOME"]
    found = {name: os.environ.get(name) for name in names}
    found["python3"] = shutil.which("python3")
    found["cwd"] = os.getcwd()
    return json.dumps(found)


# ---- pipelines -----------------------------------------------------------------------------------


@dsl.pipeline(name="handoff")
def handoff_pipeline(message: str = "hello world"):
    produced = produce(message=message)
    consume(data=produced.outputs["out"], shout=produced.outputs["Output"])
    count_words(text=message)
    echo(
        values=[
            dsl.PIPELINE_ROOT_PLACEHOLDER,
            dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
        ]
    )


@dsl.pipeline(name="placeholders")
def placeholder_pipeline():
    for name, value in {
        "root": dsl.PIPELINE_ROOT_PLACEHOLDER,
        "job-uuid": dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        "job-resource": dsl.PIPELINE_JOB_RESOURCE_NAME_PLACEHOLDER,
        "task-name": dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
        "created": dsl.PIPELINE_JOB_CREATE_TIME_UTC_PLACEHOLDER,  # resolved from 2.16 on only
        "prefixed": f"run-{dsl.PIPELINE_JOB_ID_PLACEHOLDER}",  # not the whole constant: literal
    }.items():
        cleanup(note=value).set_display_name(name)


@dsl.pipeline(name="moves")
def move_pipeline(where: str):
    moved = move(where=where, root=dsl.PIPELINE_ROOT_PLACEHOLDER)
    read(data=moved.outputs["out"])


@dsl.pipeline(name="cached")
def cache_pipeline(message: str):
    made = produce(message=message)
    read(data=made.outputs["out"]).set_caching_options(enable_caching=False)


@dsl.pipeline(name="retried")
def retry_pipeline(marker: str, wait: bool = False):
    flaky(marker=marker, wait=wait).set_retry(num_retries=2, backoff_duration="0s")


@dsl.pipeline(name="exit-handler")
def exit_pipeline(marker: str):
    with dsl.ExitHandler(cleanup(note="the group")):
        first = flaky(marker=marker, wait=False).set_retry(num_retries=2, backoff_duration="0s")
        cleanup(note=first.output)


@dsl.pipeline(name="failing-exit")
def failing_exit_pipeline(marker: str):
    with dsl.ExitHandler(flaky(marker=marker, wait=False)):
        cleanup(note="the group")


@dsl.pipeline(name="exit-code")
def exit_code_pipeline():
    exits(code=3)


@dsl.pipeline(name="cancelled")
def cancel_pipeline():
    with dsl.ExitHandler(cleanup(note="cancel")):
        sleeper(seconds=120)


@dsl.pipeline(name="timeout")
def timeout_pipeline():
    kubernetes.set_timeout(sleeper(seconds=120), 1)


@dsl.pipeline(name="env")
def env_pipeline():
    task = env_probe().set_caching_options(enable_caching=False)
    kubernetes.use_field_path_as_env(task, "RUN_ID", "metadata.labels['pipeline/runid']")
    kubernetes.use_field_path_as_env(task, "NAMESPACE", "metadata.namespace")
    kubernetes.use_secret_as_env(task, "creds", {"token": "TOKEN"})
    kubernetes.use_config_map_as_env(task, "settings", {"mode": "MODE"})


PIPELINES = [handoff_pipeline, placeholder_pipeline, move_pipeline, cache_pipeline, retry_pipeline]
PIPELINES += [exit_pipeline, failing_exit_pipeline, exit_code_pipeline, cancel_pipeline]
PIPELINES += [timeout_pipeline, env_pipeline]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, Path]:
    """Each pipeline's YAML, by pipeline name."""
    folder = tmp_path_factory.mktemp("compiled")
    for pipeline in PIPELINES:
        compiler.Compiler().compile(pipeline, str(folder / f"{pipeline.name}.yaml"))
    return {pipeline.name: folder / f"{pipeline.name}.yaml" for pipeline in PIPELINES}


@pytest.fixture
def backend(gcs, tmp_path) -> KfpBackend:
    return KfpBackend(
        pipeline_root=gcs.uri("root"),
        env={"STORAGE_EMULATOR_HOST": gcs.endpoint},
        gcs_client=gcs.client,
        work_dir=tmp_path / "pods",
        grace_seconds=1.0,
    )


# ---- tests ---------------------------------------------------------------------------------------


def test_parameters_and_artifacts_pass_only_through_the_pipeline_root(backend, compiled, gcs):
    result = backend.run(compiled["handoff"], {"message": "two words"})
    assert result.state == SUCCEEDED, result.error
    assert result.run_root == gcs.uri("root", "handoff", result.run_id)
    out = result.tasks["produce"].output_artifacts["out"]
    assert out.uri.startswith(f"{result.run_root}/produce/")
    assert gcs.get(out.uri[len(gcs.uri()) + 1 :]) == b"two words"
    assert result.tasks["produce"].output_parameters == {"Output": "TWO WORDS"}
    assert result.tasks["count-words"].output_parameters == {"count": 2}
    consumed = json.loads(result.tasks["consume"].output_parameters["Output"])
    # The default of `times` is filled by the launcher; nothing the producer left in its own
    # working folder or HOME is visible to the consumer.
    assert consumed["text"] == "two wordstwo words" and consumed["shout"] == "TWO WORDS"
    assert consumed["leaked"] is False
    # The consumer sees the artifact as ML Metadata stored it: bools become 1, and the launcher
    # adds display_name and store_session_info.
    assert consumed["metadata"]["shouted"] == 1 and consumed["metadata"]["words"] == 2
    assert consumed["metadata"]["display_name"] == "out"
    logs = result.tasks["produce"].output_artifacts["executor-logs"].uri
    assert b"Wrote executor output file" in gcs.get(logs[len(gcs.uri()) + 1 :])
    # Placeholders inside a list constant stay as they are: the driver resolves whole strings.
    assert result.tasks["echo"].output_parameters["Output"] == [
        "{{$.pipeline_root}}",
        "{{$.pipeline_job_uuid}}",
        "{{$.pipeline_task_name}}",
    ]


def test_only_the_driver_placeholders_resolve(backend, compiled):
    run_id = str(uuid.uuid4())
    result = backend.run(compiled["placeholders"], run_id=run_id)
    assert result.state == SUCCEEDED, result.error
    got = {t.executor_input["inputs"]["parameterValues"]["note"] for t in result.tasks.values()}
    assert got == {
        "{{$.pipeline_root}}",  # literal on a cluster: a path relative to the pod's working folder
        run_id,
        result.run_name,
        "task-name",  # taskInfo.name: the display name, not the task's key
        "{{$.pipeline_job_create_time_utc}}",
        "run-{{$.pipeline_job_uuid}}",
    }
    assert result.run_name.startswith("placeholders-")


def test_a_changed_output_uri_is_merged_and_uploaded_from_its_new_path(backend, compiled, gcs):
    inside = backend.run(compiled["moves"], {"where": "inside"})
    assert inside.state == SUCCEEDED, inside.error
    moved = inside.tasks["move"].output_artifacts["out"].uri
    assert moved.endswith("/moved") and moved.startswith(inside.run_root)
    assert inside.tasks["read"].output_parameters["Output"] == f"{moved} inside bytes"

    direct = backend.run(compiled["moves"], {"where": "direct"})  # no local folder: allowed
    assert direct.state == SUCCEEDED, direct.error
    assert "does not exist" in direct.tasks["move"].log
    assert direct.tasks["read"].output_parameters["Output"].endswith("/direct direct bytes")


def test_a_uri_outside_the_runs_root_fails_the_task_after_its_code_succeeded(backend, compiled):
    result = backend.run(compiled["moves"], {"where": "outside"})
    assert result.state == FAILED
    assert result.tasks["move"].state == FAILED and result.tasks["read"].state == SKIPPED
    assert "does not have expected bucket prefix" in result.tasks["move"].error
    assert result.error.startswith("task 'move' failed")


def test_the_pipeline_root_placeholder_as_a_work_folder_loses_the_data(backend, compiled):
    # "{{$.pipeline_root}}" arrives literally: the step writes a folder of that name inside its
    # pod, the launcher cannot upload a URI without a storage scheme, and the consumer fails.
    result = backend.run(compiled["moves"], {"where": "root"})
    assert result.tasks["move"].state == SUCCEEDED
    assert result.tasks["move"].output_artifacts["out"].uri == "{{$.pipeline_root}}/datasets/v1"
    assert "has no recognized storage URI" in result.tasks["move"].log
    assert result.state == FAILED and result.tasks["read"].state == FAILED
    assert "No such file or directory" in result.tasks["read"].log


def test_cache_hits_with_unchanged_inputs_and_misses_when_a_parameter_changes(backend, compiled):
    first = backend.run(compiled["cached"], {"message": "a"})
    second = backend.run(compiled["cached"], {"message": "a"})
    third = backend.run(compiled["cached"], {"message": "b"})
    assert [r.state for r in (first, second, third)] == [SUCCEEDED] * 3
    made = [r.tasks["produce"] for r in (first, second, third)]
    assert [t.state for t in made] == [SUCCEEDED, CACHED, SUCCEEDED]
    assert made[1].cached_from_run == first.run_id and not made[1].attempts
    assert made[1].output_parameters == {"Output": "A"}
    assert made[1].output_artifacts["out"].uri == made[0].output_artifacts["out"].uri
    assert made[0].fingerprint == made[1].fingerprint != made[2].fingerprint
    # The uncached consumer of run 2 reads the artifact run 1 wrote.
    assert second.tasks["read"].output_parameters["Output"].startswith(f"{first.run_root}/produce/")


def _one(name: str, kind: dict, uri: str, metadata: dict) -> dict:
    return {"artifacts": [{"name": name, "type": kind, "uri": uri, "metadata": metadata}]}


def test_cache_key_and_fingerprint_match_kfps_own_test_vectors():
    # backend/src/v2/cacheutils/cache_test.go (2.5.0): TestGenerateCacheKey's inputs give
    # TestGenerateFingerPrint's key, whose fingerprint that test pins; and its second key.
    model = "title: kfp.Model\ntype: object\nproperties:\n  framework:\n    type: string\n"
    model += "  framework_version:\n    type: string\n"
    dataset = "title: kfp.Dataset\ntype: object\nproperties:\n  payload_format:\n"
    dataset += "    type: string\n  container_format:\n    type: string\n"
    root = "gs://my-bucket/some-prefix/pipeline/task"
    inputs = {
        "parameterValues": {"message": "Some string value", "num_steps": 5},
        "artifacts": {
            "dataset_one": _one("1", {"instanceSchema": dataset}, "gs://some-bucket/one", {}),
            "dataset_two": _one("2", {"schemaTitle": "kfp.Model"}, "gs://some-bucket/two", {}),
        },
    }
    outputs = {
        "parameters": {
            "output_parameter_one": {"outputFile": "/tmp/outputs/output_parameter_one/data"},
            "output_parameter_two": {"outputFile": "/tmp/outputs/output_parameter_two/data"},
        },
        "artifacts": {
            "model": _one("model", {"instanceSchema": model}, f"{root}/model", {"name": "model"}),
            "metrics": _one(
                "metrics", {"schemaTitle": "kfp.Metrics"}, f"{root}/metrics", {"name": "metrics"}
            ),
        },
        "outputFile": "/tmp/kfp_outputs/output_metadata.json",
    }
    key = cache_key(
        json_format.ParseDict(inputs, pb.ExecutorInput.Inputs()),
        json_format.ParseDict(outputs, pb.ExecutorInput.Outputs()),
        {"output_parameter_one": "STRING", "output_parameter_two": "INT"},
        ["sh", "ec", "test"],
        "python:3.9",
    )
    assert fingerprint(key) == "4e8a5d7d70997b0a35429fcd481af8fcd5b9f58ef4391bdb6ad900fd1c63622b"
    other = {
        "inputArtifactNames": {"dataset": {"artifactNames": ["10"]}},
        "outputParametersSpec": {"output_parameter": "DOUBLE"},
        "containerSpec": {"cmdArgs": ["sh", "ec", "run"], "image": "python:3.9"},
    }
    assert fingerprint(other) == "0a4cc1f15cdfad5170e1358518f7128c5278500a670db1b9a3f3d83b93db396e"


def test_retry_policy_retries_a_failed_pod_and_a_killed_one(backend, compiled, gcs):
    result = backend.run(compiled["retried"], {"marker": gcs.uri("markers", "a")})
    assert result.state == SUCCEEDED, result.error
    attempts = result.tasks["flaky"].attempts
    assert [a.exit_code for a in attempts] == [1, 0]
    assert (
        attempts[0].pod_name != attempts[1].pod_name and attempts[0].pod_uid != attempts[1].pod_uid
    )
    assert "first attempt fails on purpose" in attempts[0].log

    handle = backend.start(compiled["retried"], {"marker": gcs.uri("markers", "b"), "wait": True})
    handle.wait_for_log("flaky", "first attempt is running")
    handle.kill_task("flaky")
    killed = handle.wait(60)
    assert killed.state == SUCCEEDED, killed.error
    assert [a.exit_code for a in killed.tasks["flaky"].attempts] == [137, 0]


def test_exit_handler_runs_after_a_failure_and_group_retries_are_ignored(backend, compiled, gcs):
    result = backend.run(compiled["exit-handler"], {"marker": gcs.uri("markers", "exit")})
    assert result.state == FAILED
    # 2.5.0's Argo compiler looks retry policies up in the root DAG only: inside the group, none.
    assert len(result.tasks["flaky"].attempts) == 1 and result.tasks["flaky"].state == FAILED
    assert result.tasks["cleanup-2"].state == SKIPPED
    assert result.tasks["exit-handler-1"].state == FAILED
    assert result.tasks["cleanup"].state == SUCCEEDED
    assert result.tasks["cleanup"].output_parameters == {"Output": "cleaned up after the group"}
    assert (
        "task 'flaky' failed" in result.error and "first attempt fails on purpose" in result.error
    )


def test_a_failed_exit_task_does_not_fail_the_run(backend, compiled, gcs):
    """The exit task is an Argo exit lifecycle hook: its failure is its own task's state, and
    the run's is the group's (argo 3.5 dag.go assessDAGPhase; KFP PR #11470)."""
    result = backend.run(compiled["failing-exit"], {"marker": gcs.uri("markers", "failing-exit")})
    assert result.state == SUCCEEDED, result.error
    assert result.tasks["cleanup"].state == SUCCEEDED
    assert result.tasks["flaky"].state == FAILED  # the exit task, not retried


def test_a_failed_command_makes_the_pod_exit_1_whatever_its_code(backend, compiled):
    """The launcher is the container's main process and exits through glog.Exit (1)."""
    result = backend.run(compiled["exit-code"])
    assert result.state == FAILED
    (attempt,) = result.tasks["exits"].attempts
    assert attempt.exit_code == 1 and "exit status 3" in attempt.log


def test_pod_environment_is_what_kfp_sets(gcs, compiled, tmp_path, monkeypatch):
    monkeypatch.setenv("LEAK", "from the test process")
    backend = KfpBackend(
        gcs.uri("root"),
        env={"STORAGE_EMULATOR_HOST": gcs.endpoint, "EXTRA": "given"},
        gcs_client=gcs.client,
        namespace="team-a",
        secrets={"creds": {"token": "s3cret"}},
        config_maps={"settings": {"mode": "fast"}},
        mlmd_address="mlmd.test:9090",
        work_dir=tmp_path / "pods",
    )
    result = backend.run(compiled["env"])
    assert result.state == SUCCEEDED, result.error
    env = json.loads(result.tasks["env-probe"].output_parameters["Output"])
    pod = result.tasks["env-probe"].attempts[0]
    assert env["RUN_ID"] == result.run_id and env["NAMESPACE"] == "team-a"
    assert (env["TOKEN"], env["MODE"], env["EXTRA"], env["LEAK"]) == (
        "s3cret",
        "fast",
        "given",
        None,
    )
    assert (env["KFP_POD_NAME"], env["KFP_POD_UID"]) == (pod.pod_name, pod.pod_uid)
    assert env["KFP_POD_NAME"].startswith(result.run_name)
    assert (env["METADATA_GRPC_SERVICE_HOST"], env["METADATA_GRPC_SERVICE_PORT"]) == (
        "mlmd.test",
        "9090",
    )
    assert env["python3"] == str(VENV_BIN / "python3")
    assert env["cwd"].startswith(str(tmp_path / "pods")) and env["HOME"].startswith(
        str(tmp_path / "pods")
    )

    missing = KfpBackend(gcs.uri("root"), gcs_client=gcs.client, work_dir=tmp_path / "other")
    failed = missing.run(compiled["env"])
    assert failed.state == FAILED and 'secret "creds" not found' in failed.tasks["env-probe"].error


def test_cancel_terminates_the_running_task_and_still_runs_the_exit_handler(backend, compiled):
    started = time.monotonic()
    handle = backend.start(compiled["cancelled"])
    handle.wait_for_log("sleeper", "sleeping")
    handle.cancel(grace_seconds=1)
    result = handle.wait(60)
    assert time.monotonic() - started < 60
    assert result.state == FAILED  # never CANCELED in KFP 2.5 (argo.py says why)
    sleeper_task = result.tasks["sleeper"]
    assert sleeper_task.state == FAILED and "deadline" in sleeper_task.error
    # SIGTERM reaches the whole process group; the component's `sh -ec` wrapper dies of it at
    # once, and with the container's main process gone the Python process is killed too: a
    # SIGTERM handler in a component gets no grace period.
    assert sleeper_task.attempts[-1].exit_code == 143
    assert time.monotonic() - started < 30
    assert result.tasks["cleanup"].state == SUCCEEDED


def test_a_pod_past_its_active_deadline_is_stopped(backend, compiled):
    started = time.monotonic()
    result = backend.run(compiled["timeout"], timeout=60)
    assert result.state == FAILED and time.monotonic() - started < 30
    assert result.tasks["sleeper"].attempts[-1].exit_code == 143
    assert result.tasks["sleeper"].error.startswith("DeadlineExceeded")


def test_the_api_servers_checks_reject_bad_yaml_and_bad_parameters(backend, compiled, tmp_path):
    docs = list(yaml.safe_load_all(compiled["handoff"].read_text()))
    docs[0]["root"]["dag"]["tasks"]["produce"]["notAField"] = 1
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump_all(docs))
    with pytest.raises(PipelineRejected, match="notAField"):
        backend.start(bad)
    with pytest.raises(PipelineRejected, match="not required by pipeline: extra"):
        backend.start(compiled["handoff"], {"extra": 1})
    with pytest.raises(PipelineRejected, match="requires type string"):
        backend.start(compiled["handoff"], {"message": 3})
