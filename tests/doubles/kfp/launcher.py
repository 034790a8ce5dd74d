"""The KFP v2 launcher inside one executor pod, for tests/doubles/kfp/backend.py.

Follows KFP backend 2.5.0, backend/src/v2/component/launcher_v2.go (Execute, executeV2,
execute, getPlaceholders, addDefaultParams, downloadArtifacts, prepareOutputFolders, getLogWriter,
getExecutorOutputFile, collectOutputParameters, uploadOutputArtifacts, mergeRuntimeArtifacts)
and backend/src/v2/metadata/converter.go (TextToPbValue); bytes move through objectstore.py.

A pod is a folder, `Sandbox`: the user command runs as a fresh process group with that folder's
`workdir/` as its working directory, `home/` as HOME and `tmp/` as TMPDIR, and nothing else of
the test's environment. Two absolute paths of a real pod are mapped into it:
- `/gcs/` (the emptyDir the launcher downloads to and uploads from): `<pod>/gcs/`; the SDK is
  pointed there by a generated `sitecustomize.py` that sets
  `kfp.dsl.types.artifact_types._GCS_LOCAL_MOUNT_PREFIX` when the SDK imports it;
- `/tmp/` (the executor output file and output parameter files): `<pod>/tmp/`; the executor
  input the process gets names the mapped paths.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.cloud import storage as gcs_lib
from google.protobuf import json_format, struct_pb2
from kfp.pipeline_spec import pipeline_spec_pb2 as pb

from tests.doubles.kfp.cache import CacheStore, ExecutionRecord
from tests.doubles.kfp.driver import LOGS_ARTIFACT, ContainerPlan, Pod
from tests.doubles.kfp.gojson import (
    encoding_json_dumps,
    format_float_f,
    message_to_py,
    protojson_dumps,
    value_to_py,
)
from tests.doubles.kfp.ir import PT
from tests.doubles.kfp.objectstore import BucketConfig, download, local_path_for_uri, upload
from tests.processes import signal_group, wait_unreaped

# The images' python3: this repository's environment (.venv, else the one running the tests).
_REPO_VENV = Path(__file__).resolve().parents[3] / ".venv" / "bin"
VENV_BIN = _REPO_VENV if (_REPO_VENV / "python3").exists() else Path(sys.executable).parent

_SITECUSTOMIZE = '''"""Written by tests/doubles/kfp/launcher.py: this pod's /gcs/ mount, for KFP."""
import importlib.abc
import sys

GCS_MOUNT = {mount!r}  # stands for the pod's /gcs/ (argocompiler/container.go gcsScratchLocation)


class _SetMount(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "kfp.dsl.types.artifact_types":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            module._GCS_LOCAL_MOUNT_PREFIX = GCS_MOUNT

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _SetMount())
'''


class LauncherError(RuntimeError):
    """The launcher failed the task after the user command (or before it)."""


@dataclass
class Sandbox:
    """One pod's private disk."""

    root: Path

    @classmethod
    def create(cls, parent: Path, pod: Pod) -> Sandbox:
        root = parent / pod.name
        for sub in ("gcs", "tmp", "home", "workdir", "harness"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        (root / "harness" / "sitecustomize.py").write_text(
            _SITECUSTOMIZE.format(mount=str(root / "gcs") + "/"), encoding="utf-8"
        )
        return cls(root)

    def path(self, pod_path: str) -> str:
        """The local path for an absolute path inside the pod (/gcs/... or /tmp/...)."""
        for prefix in ("/gcs/", "/tmp/"):
            if pod_path.startswith(prefix):
                return str(self.root / prefix.strip("/") / pod_path[len(prefix) :])
        raise LauncherError(f"no local folder stands for the pod path {pod_path!r}")

    @property
    def log(self) -> Path:
        return self.root / "pod.log"


def placeholders(executor_input: pb.ExecutorInput, sandbox: Sandbox) -> dict[str, str]:
    """getPlaceholders, with /gcs/ and /tmp/ paths mapped into the sandbox."""
    found = {"{{$}}": protojson_dumps(message_to_py(executor_input))}
    for name, artifacts in executor_input.inputs.artifacts.items():
        if artifacts.artifacts:
            uri = artifacts.artifacts[0].uri
            found[f"{{{{$.inputs.artifacts['{name}'].uri}}}}"] = uri
            if local_path_for_uri(uri):
                found[f"{{{{$.inputs.artifacts['{name}'].path}}}}"] = sandbox.path(
                    local_path_for_uri(uri) or ""
                )
    for name, artifacts in executor_input.outputs.artifacts.items():
        if artifacts.artifacts:
            uri = artifacts.artifacts[0].uri
            local = local_path_for_uri(uri)
            if local is None:
                raise LauncherError(
                    f"resolve output artifact {name!r}'s local path: unsupported scheme {uri}"
                )
            found[f"{{{{$.outputs.artifacts['{name}'].uri}}}}"] = uri
            found[f"{{{{$.outputs.artifacts['{name}'].path}}}}"] = sandbox.path(local)
    for name, value in executor_input.inputs.parameter_values.items():
        kind = value.WhichOneof("kind")
        if kind == "number_value":
            text = format_float_f(value.number_value)
        elif kind in ("list_value", "struct_value"):
            text = encoding_json_dumps(value_to_py(value))
        elif kind == "bool_value":
            text = "true" if value.bool_value else "false"
        else:
            text = value.string_value
        found[f"{{{{$.inputs.parameters['{name}']}}}}"] = text
    for name, param in executor_input.outputs.parameters.items():
        found[f"{{{{$.outputs.parameters['{name}'].output_file}}}}"] = param.output_file
    return found


def with_defaults(
    executor_input: pb.ExecutorInput, component: pb.ComponentSpec
) -> pb.ExecutorInput:
    """addDefaultParams: the launcher, not the driver, fills in input defaults."""
    copy = pb.ExecutorInput()
    copy.CopyFrom(executor_input)
    for name, spec in component.input_definitions.parameters.items():
        if spec.HasField("default_value") and name not in copy.inputs.parameter_values:
            copy.inputs.parameter_values[name].CopyFrom(spec.default_value)
    return copy


def in_sandbox(executor_input: pb.ExecutorInput, sandbox: Sandbox) -> pb.ExecutorInput:
    """The executor input with its /tmp/ output files mapped into the pod's folder."""
    mapped = pb.ExecutorInput()
    mapped.CopyFrom(executor_input)
    mapped.outputs.output_file = sandbox.path(mapped.outputs.output_file)
    for param in mapped.outputs.parameters.values():
        param.output_file = sandbox.path(param.output_file)
    return mapped


@dataclass
class Launch:
    """How one attempt ended."""

    exit_code: int  # the pod's: the user command's, 1 for a launcher error, 137 for SIGKILL
    error: str = ""  # the launcher's error message, "" on success
    record: ExecutionRecord | None = None  # what the launcher published to MLMD on success


def run_user_command(
    argv: list[str],
    env: dict[str, str],
    sandbox: Sandbox,
    started: Callable[[subprocess.Popen[bytes]], None],
) -> int:
    """execute: the user command, its stdout and stderr to the pod log; returns its exit code."""
    with sandbox.log.open("ab") as log:
        process = subprocess.Popen(
            argv,
            cwd=sandbox.root / "workdir",
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a process group, so a signal reaches all of it
        )
        started(process)
        wait_unreaped(process)
    # The container ends with its main process: whatever it left running dies with it.
    signal_group(process, signal.SIGKILL)
    return process.wait()


def pod_environment(pod: Pod, sandbox: Sandbox, extra: dict[str, str]) -> dict[str, str]:
    """The container's environment: the image's basics, the test's extras, then KFP's."""
    env = {
        "PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(sandbox.root / "home"),
        "TMPDIR": str(sandbox.root / "tmp"),  # stands for the pod's own /tmp
        "LANG": "C.UTF-8",
        "HOSTNAME": pod.name,
        "PYTHONPATH": str(sandbox.root / "harness"),
    }
    merged = {**env, **extra, **pod.env}
    if "PYTHONPATH" in extra:
        merged["PYTHONPATH"] = f"{env['PYTHONPATH']}:{extra['PYTHONPATH']}"
    return merged


def launch(
    plan: ContainerPlan,
    pod: Pod,
    sandbox: Sandbox,
    context: dict[str, Any],
    started: Callable[[subprocess.Popen[bytes]], None],
) -> Launch:
    """Execute + executeV2 for one attempt. `context`: client, bucket, env, store, run_id."""
    client: gcs_lib.Client = context["client"]
    try:
        defaulted = in_sandbox(with_defaults(plan.executor_input, plan.component), sandbox)
        for name, artifacts in plan.executor_input.inputs.artifacts.items():
            uri = artifacts.artifacts[0].uri if artifacts.artifacts else ""
            local = local_path_for_uri(uri)
            if local is None:
                _note(
                    sandbox,
                    f"Input Artifact {name!r} does not have a recognized storage URI {uri!r}",
                )
                continue
            download(client, uri, sandbox.path(local))
        _prepare_output_folders(defaulted, sandbox)
        found = placeholders(defaulted, sandbox)
        argv = [
            _replace(a, found) for a in list(plan.container.command) + list(plan.container.args)
        ]
    except Exception as err:  # a launcher failure before the user command
        _note(sandbox, f"failed to execute component: {err}")
        return Launch(1, str(err))
    code = run_user_command(argv, pod_environment(pod, sandbox, context["env"]), sandbox, started)
    if code != 0:
        message = (
            f"exit status {code}" if code > 0 else f"signal: {signal.Signals(-code).name.lower()}"
        )
        _note(sandbox, f"failed to execute component: {message}")
        # cmd/launcher-v2/main.go: glog.Exit(err), so the pod exits 1 whatever the command's
        # code; a signal here stands for the container's own (the pod killed), as Kubernetes
        # reports it: 128 + the signal.
        return Launch(1 if code > 0 else 128 - code, message)
    try:
        output = _executor_output(defaulted.outputs.output_file)
        _collect_output_parameters(defaulted, output, plan.component)
        _copy_logs(defaulted, sandbox)
        record = _upload_outputs(plan, defaulted, output, sandbox, context)
    except Exception as err:
        _note(sandbox, f"failed to execute component: {err}")
        return Launch(1, str(err))
    return Launch(0, "", record)


def _replace(text: str, found: dict[str, str]) -> str:
    for placeholder, value in found.items():
        text = text.replace(placeholder, value)
    return text


def _note(sandbox: Sandbox, message: str) -> None:
    """A line of the launcher's own log (glog) in the pod log."""
    with sandbox.log.open("a", encoding="utf-8") as log:
        log.write(f"launcher: {message}\n")


def _prepare_output_folders(executor_input: pb.ExecutorInput, sandbox: Sandbox) -> None:
    for param in executor_input.outputs.parameters.values():
        Path(param.output_file).parent.mkdir(parents=True, exist_ok=True)
    for name, artifacts in executor_input.outputs.artifacts.items():
        for artifact in artifacts.artifacts:
            local = local_path_for_uri(artifact.uri)
            if local is None:
                raise LauncherError(
                    f"failed to generate local storage path for output artifact {name!r}"
                )
            Path(sandbox.path(local)).parent.mkdir(parents=True, exist_ok=True)


def _executor_output(path: str) -> pb.ExecutorOutput:
    """getExecutorOutputFile: absent means empty; present must parse strictly (protojson: no
    unknown fields, and no NaN or Infinity, which Python's json writes and Go rejects)."""
    output = pb.ExecutorOutput()
    if os.path.exists(path):
        text = Path(path).read_text(encoding="utf-8")
        try:
            json.loads(text, parse_constant=_reject_constant)
            json_format.Parse(text, output)
        except (ValueError, json_format.ParseError) as err:
            raise LauncherError(f"failed to unmarshall ExecutorOutput {path!r}: {err}") from err
    return output


def _reject_constant(name: str) -> None:
    raise ValueError(f"invalid value {name} (not JSON)")


def _collect_output_parameters(
    executor_input: pb.ExecutorInput, output: pb.ExecutorOutput, component: pb.ComponentSpec
) -> None:
    """collectOutputParameters: the executor output file first, else each output_file."""
    for name, param in executor_input.outputs.parameters.items():
        if name in output.parameter_values:
            continue
        spec = component.output_definitions.parameters.get(name)
        if spec is None:
            raise LauncherError(f"failed to find output parameter name={name!r} in component spec")
        try:
            text = Path(param.output_file).read_text(encoding="utf-8")
        except OSError as err:
            raise LauncherError(
                f"failed to read output parameter name={name!r} path={param.output_file!r}"
            ) from err
        output.parameter_values[name].CopyFrom(_text_to_value(text, spec.parameter_type, name))


def _text_to_value(text: str, ptype: int, name: str) -> struct_pb2.Value:
    """metadata/converter.go TextToPbValue."""
    kinds = PT
    try:
        if ptype == kinds.STRING:
            return struct_pb2.Value(string_value=text)
        if ptype == kinds.NUMBER_INTEGER:
            return struct_pb2.Value(number_value=float(int(text.strip(), 10)))
        if ptype == kinds.NUMBER_DOUBLE:
            return struct_pb2.Value(number_value=float(text.strip()))
        if ptype == kinds.BOOLEAN:
            return struct_pb2.Value(bool_value=_parse_bool(text.strip()))
        value = struct_pb2.Value()
        json_format.Parse(text, value)
        wanted = "list_value" if ptype == kinds.LIST else "struct_value"
        if value.WhichOneof("kind") != wanted:
            raise ValueError("unexpected type")
        return value
    except (ValueError, json_format.ParseError) as err:
        raise LauncherError(
            f"TextToPbValue(text={text!r}, type={kinds.Name(ptype)}) failed: {err}"
        ) from err


def _parse_bool(text: str) -> bool:
    """strconv.ParseBool."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError(f"strconv.ParseBool: parsing {text!r}: invalid syntax")


def _copy_logs(executor_input: pb.ExecutorInput, sandbox: Sandbox) -> None:
    """getLogWriter tees the command's output to the executor-logs artifact's local file."""
    logs = executor_input.outputs.artifacts.get(LOGS_ARTIFACT)
    local = local_path_for_uri(logs.artifacts[0].uri) if logs and logs.artifacts else None
    if local:
        lines = sandbox.log.read_bytes().splitlines(keepends=True)
        user = b"".join(line for line in lines if not line.startswith(b"launcher: "))
        Path(sandbox.path(local)).write_bytes(user)


def _upload_outputs(
    plan: ContainerPlan,
    executor_input: pb.ExecutorInput,
    output: pb.ExecutorOutput,
    sandbox: Sandbox,
    context: dict[str, Any],
) -> ExecutionRecord:
    """uploadOutputArtifacts: merge what the executor wrote, upload the local copy, record it."""
    store: CacheStore = context["store"]
    record = ExecutionRecord(plan.execution_id, plan.task_name, context["run_id"])
    record.output_parameters = dict(output.parameter_values)
    bucket: BucketConfig = context["bucket"]
    for name, artifacts in executor_input.outputs.artifacts.items():
        for artifact in artifacts.artifacts:
            if name in output.artifacts and output.artifacts[name].artifacts:
                _merge(output.artifacts[name].artifacts[0], artifact)
            local = local_path_for_uri(artifact.uri)
            if local is None:
                _note(
                    sandbox,
                    f"Output Artifact {name!r} has no recognized storage URI {artifact.uri!r}",
                )
            else:
                key = bucket.key_from_uri(artifact.uri)
                try:
                    upload(context["client"], bucket.bucket, sandbox.path(local), key)
                except FileNotFoundError:
                    _note(
                        sandbox, f"Local filepath {local!r} does not exist"
                    )  # allowed: ErrNotExist
            record.output_artifacts[name] = store.record_artifact(name, artifact)
    return record


def _merge(source: pb.RuntimeArtifact, target: pb.RuntimeArtifact) -> None:
    """mergeRuntimeArtifacts: a non-empty URI replaces; metadata keys are added or replaced."""
    if source.uri:
        target.uri = source.uri
    if source.HasField("metadata"):
        for key, value in source.metadata.fields.items():
            target.metadata.fields[key].CopyFrom(value)
