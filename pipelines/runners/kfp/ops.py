"""Operating gptpipe on a KFP cluster: upload a version, start a run and follow it.

Every call goes through `client.Api.call` (retries, one-line errors). Recurring runs live in
`schedule`, the table of recent runs in `runs` (both beside this module).
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from components.jobs.naming import run_label
from components.jobs.tfjob.manifest import LABEL_RUN_ID
from contracts import records
from contracts.errors import UserError
from contracts.params import STEP_PARAMS, TrainJob, field_value, override, params_class
from pipelines.compiler import check_pipeline_root
from pipelines.pipeline import PIPELINE_NAME
from pipelines.runners.kfp.client import Api, KfpError
from trainer.config import ConfigError, config_from_dict

DEFAULT_EXPERIMENT = "gptpipe"
SHORT_SHA = 12  # hex digits of the commit in a default version name: git-<12 hex>
# RuntimeState values (backend/api/v2beta1/run.proto) after which a run changes no more.
FINAL_STATES = frozenset({"SUCCEEDED", "SKIPPED", "FAILED", "CANCELED"})
SUCCESS_STATES = frozenset({"SUCCEEDED", "SKIPPED"})
_EQUALS = 1  # filter.proto Predicate.Operation EQUALS, as kfp.Client sends it
# A parameter's type in the PipelineSpec -> the JSON values it takes, and how to ask for one.
_PARAMETER_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "STRING": ((str,), "a string"),
    "NUMBER_INTEGER": ((int,), "an integer"),
    "NUMBER_DOUBLE": ((int, float), "a number"),
    "BOOLEAN": ((bool,), "true or false"),
    "STRUCT": ((dict,), "a JSON object"),
    "LIST": ((list,), "a JSON list"),
}


def default_version(code_version: str) -> str:
    """`git-<short sha>` for this checkout's commit; refused when it is dirty or unknown."""
    if code_version.endswith("-dirty"):
        raise UserError(
            "the checkout has uncommitted changes, so git-<sha> would not name what is "
            "uploaded: commit them, or name the version with --version"
        )
    if not code_version or code_version == "unknown":
        raise UserError("no git commit found to name the version: pass --version NAME")
    return f"git-{code_version[:SHORT_SHA]}"


def name_filter(name: str) -> str:
    """A list filter (filter.proto) on `display_name`, the way kfp.Client writes one."""
    return json.dumps(
        {"predicates": [{"operation": _EQUALS, "key": "display_name", "stringValue": name}]}
    )


# ---- the pipeline and its versions ---------------------------------------------------------


def find_pipeline(api: Api, name: str = PIPELINE_NAME) -> str | None:
    """The id of the pipeline called `name` (in the namespace on a multi-user KFP), or None."""
    found = api.call(
        f"list pipelines named {name}",
        lambda: api.client.list_pipelines(filter=name_filter(name), namespace=api.namespace),
    )
    pipelines = found.pipelines or []
    if len(pipelines) > 1:
        raise UserError(f"KFP at {api.where.host} has {len(pipelines)} pipelines named {name}")
    return str(pipelines[0].pipeline_id) if pipelines else None


def ensure_pipeline(api: Api, name: str = PIPELINE_NAME) -> tuple[str, bool]:
    """The pipeline's id, creating it (with no version yet) when missing; and whether it was."""
    found = find_pipeline(api, name)
    if found:
        return found, False
    models = api.client.api_models
    body = models.V2beta1Pipeline(
        display_name=name,
        description="Tokenize, train, evaluate and push a GPT.",
        namespace=api.namespace or None,
    )
    try:
        created = api.call(
            f"create pipeline {name}",
            lambda: api.client.pipelines.pipeline_service_create_pipeline(body=body),
            creates=True,
        )
    except KfpError as err:
        if err.status != 409:  # another upload created it first
            raise
        return ensure_pipeline(api, name)
    return str(created.pipeline_id), True


@dataclass(frozen=True)
class Uploaded:
    """What `upload` did."""

    pipeline_id: str
    version: str  # the version's name
    version_id: str  # "" when the version already existed
    created_pipeline: bool  # the pipeline itself was new


def upload(api: Api, package: Path, version: str) -> Uploaded:
    """Upload `package` as version `version` of the gptpipe pipeline, creating it if missing.

    A version of that name already there (KFP answers 409) is not an error: re-running the
    upload of one commit changes nothing.
    """
    pipeline_id, created = ensure_pipeline(api)
    try:
        found = api.call(
            f"upload version {version}",
            lambda: api.client.upload_pipeline_version(
                str(package), pipeline_version_name=version, pipeline_id=pipeline_id
            ),
        )
    except KfpError as err:
        if err.status != 409:
            raise
        return Uploaded(pipeline_id, version, "", created)
    return Uploaded(pipeline_id, version, str(found.pipeline_version_id), created)


def find_version(api: Api, pipeline_id: str, name: str | None) -> Any:
    """The version called `name`, or the newest one; refused when there is none."""
    what = f"version {name}" if name else "the latest version"
    found = api.call(
        f"find {what} of {PIPELINE_NAME}",
        lambda: api.client.list_pipeline_versions(
            pipeline_id,
            page_size=1,
            sort_by="created_at desc",
            filter=name_filter(name) if name else None,
        ),
    )
    versions = found.pipeline_versions or []
    if not versions:
        raise UserError(
            f"no {what} of pipeline {PIPELINE_NAME} on {api.where.host}: upload it with "
            f"`gptpipe kfp upload{' --version ' + name if name else ''}`"
        )
    return versions[0]


# ---- what a run runs: its spec, root and parameters ----------------------------------------


@dataclass(frozen=True)
class RunSource:
    """A run's pipeline: an uploaded version, or a compiled YAML file run as it is."""

    label: str  # for messages: "version git-abc123", "file gptpipe.yaml"
    spec: Mapping[str, Any]  # the PipelineSpec, for its root and parameters
    pipeline_id: str = ""
    version_id: str = ""
    package: Path | None = None


def source_from_file(path: Path) -> RunSource:
    """A compiled pipeline YAML as a run source."""
    try:
        docs = list(yaml.safe_load_all(path.read_text()))
    except (OSError, yaml.YAMLError) as err:
        raise UserError(f"cannot read the pipeline YAML {path}: {err}") from None
    if not docs or not isinstance(docs[0], dict) or "root" not in docs[0]:
        raise UserError(f"{path} is not a compiled pipeline: write it with `gptpipe compile`")
    return RunSource(f"file {path}", docs[0], package=path)


def source_from_server(api: Api, version: str | None) -> RunSource:
    """An uploaded version (the newest when `version` is None) as a run source."""
    pipeline_id = find_pipeline(api)
    if pipeline_id is None:
        raise UserError(
            f"no pipeline {PIPELINE_NAME} on {api.where.host}: run `gptpipe kfp upload` first"
        )
    found = find_version(api, pipeline_id, version)
    spec = found.pipeline_spec or {}
    # A YAML with a platform spec comes back as {"pipeline_spec", "platform_spec"}
    # (yamlStringToPipelineSpecStruct, backend/src/apiserver/server/api_util.go).
    spec = spec.get("pipeline_spec", spec)
    return RunSource(
        f"version {found.display_name}", spec, pipeline_id, str(found.pipeline_version_id)
    )


def pipeline_root(source: RunSource, given: str | None) -> str:
    """The root to pass with the run: `given`, else the one the YAML was compiled with.

    KFP 2.5's API server ignores a compiled defaultPipelineRoot, so the root travels in the
    run's runtime config; it must be gs:// like `gptpipe compile` requires.
    """
    root = given if given is not None else str(source.spec.get("defaultPipelineRoot", ""))
    check_pipeline_root(root)
    return root


class ParamText(str):
    """A --param value as typed, before the pipeline's declared type of it says what it is."""


def parse_params(items: Sequence[str]) -> dict[str, Any]:
    """`key=value` pairs, each value the text as typed (`ParamText`): `check_params` reads it
    as the type the pipeline declares (`typed_value`)."""
    params: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--param {item!r} is not KEY=VALUE, e.g. --param corpus=gs://b/c/")
        params[key.strip()] = ParamText(text)
    return params


def typed_value(parameter_type: str, value: Any) -> Any:
    """A --param's text (`ParamText`) as the declared `parameter_type` reads it; other values
    as they are. A STRING parameter takes the text itself (`model_name=8` is "8", not the
    number KFP would then refuse, or pass to a step that fails on it), or the content of a
    quoted JSON string; any other type, or none declared, the text as JSON when it parses,
    else the text (which the type check then names)."""
    if not isinstance(value, ParamText):
        return value
    text = str(value)
    try:
        decoded = json.loads(text)
    except ValueError:
        return text
    if parameter_type == "STRING" and not isinstance(decoded, str):
        return text
    return decoded


def check_params(source: RunSource, params: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters as `source` declares their types (`typed_value`). Refuses parameters
    the pipeline lacks, missing ones that have no default, and values of the wrong JSON type
    or out of range: KFP would take them, and the run would fail hours in."""
    declared = source.spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    params = fold_fields(params, declared)
    unknown = sorted(set(params) - set(declared))
    if unknown:
        raise UserError(
            f"{source.label} has no parameter {', '.join(unknown)}{_field_hint(unknown[0])}: "
            f"its parameters are {', '.join(sorted(declared))}"
        )
    missing = [
        name
        for name, spec in sorted(declared.items())
        if name not in params and "defaultValue" not in spec and not spec.get("isOptional")
    ]
    if missing:
        example = " ".join(f"--param {name}=..." for name in missing)
        raise UserError(f"{source.label} needs a value for {', '.join(missing)}: pass {example}")
    typed = {}
    for name, given in params.items():
        parameter_type = declared[name].get("parameterType", "")
        value = typed[name] = typed_value(parameter_type, given)
        kinds, wanted = _PARAMETER_TYPES.get(parameter_type, ((), ""))
        # bool is an int to Python, but JSON's true is no number.
        if kinds and (not isinstance(value, kinds) or isinstance(value, bool) != (bool in kinds)):
            raise UserError(f"--param {name}={json.dumps(value)}: {name} takes {wanted}")
    check_values(typed)
    check_train_plan(typed, declared)
    return typed


def check_train_plan(params: Mapping[str, Any], declared: Mapping[str, Any]) -> None:
    """The train step's own check of the run's plan (`executor.check_plan`: the global batch
    on the replicas, the micro-batch in the GPUs' memory), with the config and train job the
    run will have (given, else compiled in), so that a run it would refuse is not started."""
    from components.train.executor import check_plan

    def value(name: str) -> Any:
        return params.get(name, declared.get(name, {}).get("defaultValue"))

    config, train_job = value("config"), value("train_job")
    if not isinstance(config, dict):
        return
    try:
        check_plan(config_from_dict(config), TrainJob.from_dict(train_job or {}))
    except UserError as err:
        raise UserError(f"the train step would refuse this run: {err}") from None


def fold_fields(params: Mapping[str, Any], declared: Mapping[str, Any]) -> dict[str, Any]:
    """`params` with each `<object>.<field>=VALUE` (a step parameter object's field, e.g.
    `train_job.workers=8`) folded into its object given whole, else into an object of the
    fields given alone. A field of type str takes the text as typed.

    Only what was given travels: the step fills the other fields with its own version's
    defaults (`from_dict`) and records the whole object. So a schedule, whose firings run the
    newest version, changes just the fields it names, and an older or newer version is not sent
    a field it lacks. Each field is checked here as this version reads it.
    """
    folded = {key: value for key, value in params.items() if "." not in key}
    for key, given in params.items():
        name, _, field_name = key.partition(".")
        cls = params_class(name) if field_name else None
        if cls is None:
            if field_name:
                folded[key] = given  # named as unknown by the caller
            continue
        value = field_value(cls, field_name, given) if isinstance(given, ParamText) else given
        base = typed_value("STRUCT", folded.get(name, {}))
        try:
            checked = override(cls.from_dict(base), field_name, value)
        except UserError as err:
            raise UserError(f"--param {err}") from None
        folded[name] = {**base, field_name: records.to_dict(checked)[field_name]}
    return folded


def _field_hint(name: str) -> str:
    """' (did you mean train_job.workers?)' for a step parameter object's field given alone."""
    for cls in STEP_PARAMS:
        if name in {f.name for f in dataclasses.fields(cls)}:  # type: ignore[arg-type]
            return f" (did you mean {cls.NAME}.{name}?)"
    return ""


def check_values(params: Mapping[str, Any]) -> None:
    """Refuse values a run would fail on late, or misuse silently: each step parameter object
    (`contracts.params`: the blessing thresholds, where a NaN would bless every model; the
    train job's launcher, workers, resources, node selector and tolerations, which would fail
    only after tokenize), and a `config` given whole, which no `--config` resolved and
    checked."""
    for name, value in params.items():
        cls = params_class(name)
        if cls is not None:
            try:
                cls.from_dict(value)
            except UserError as err:
                raise UserError(f"--param {err}") from None
    if isinstance(params.get("config"), dict):
        try:
            config_from_dict(params["config"])
        except ConfigError as err:
            raise UserError(
                f"--param {err}; or leave the parameter out and pass --config and --set"
            ) from None


# ---- runs ----------------------------------------------------------------------------------


def experiment_id(api: Api, name: str) -> str:
    """The id of experiment `name`, created when missing (kfp.Client's get-or-create)."""
    found = api.call(
        f"find or create experiment {name}",
        lambda: api.client.create_experiment(name, namespace=api.namespace or None),
    )
    return str(found.experiment_id)


def start_run(
    api: Api,
    source: RunSource,
    experiment: str,
    params: Mapping[str, Any],
    root: str,
    run_name: str,
) -> Any:
    """Start one run of `source` and return it (a V2beta1Run)."""
    params = check_params(source, params)
    exp_id = experiment_id(api, experiment)
    package = str(source.package) if source.package else None
    return api.call(
        f"start a run of {source.label}",
        lambda: api.client.run_pipeline(
            experiment_id=exp_id,
            job_name=run_name,
            pipeline_package_path=package,
            params=dict(params),
            pipeline_id=source.pipeline_id or None,
            version_id=source.version_id or None,
            pipeline_root=root or None,
        ),
        creates=True,
    )


def wait(
    api: Api,
    run_id: str,
    poll_s: float,
    on_state: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> Any:
    """Follow a run until it ends and return it; `on_state` hears each new state."""
    seen = ""
    while True:
        try:
            run = api.call(f"get run {run_id}", lambda: api.client.get_run(run_id))
        except KfpError as err:  # the run started and goes on without us
            raise KfpError(
                f"{err}; run {run_id} started and goes on: follow it in the KFP UI or with "
                "`gptpipe kfp runs` rather than starting it again",
                err.status,
            ) from None
        state = str(run.state or "RUNTIME_STATE_UNSPECIFIED")
        if state != seen:
            on_state(state)
            seen = state
        if state in FINAL_STATES:
            return run
        sleep(poll_s)


def run_jobs_selector(run_id: str) -> str:
    """The label selector of a run's TFJobs (and their pods)."""
    return f"{LABEL_RUN_ID}={run_label(run_id)}"


@dataclass(frozen=True)
class TaskFailure:
    """A failed task of a run and what the API says about why."""

    task: str  # the task's display name, e.g. "train"
    error: str  # its error message, or where to look when the API has none


def failed_tasks(run: Any) -> list[TaskFailure]:
    """The innermost FAILED tasks of a run, from `run_details.task_details`, with their errors.

    KFP 2.5 gives one task per Argo node, linked by `child_tasks` as Argo links its nodes
    (apiserver/server/api_converter.go toModelTask): a task that failed shows up as the DAG
    node named after it and, inside, its pod node named "executor"
    (backend/src/v2/compiler/argocompiler/container.go), and the steps of a DAG form a chain
    (each hangs off the pod before it), so a failed DAG reaches its failed step through tasks
    that succeeded. The innermost failures are those from which no other failed task can be
    reached; an "executor" takes the name of the task it sits in. KFP 2.5 leaves a task's
    `error` empty (`toApiPipelineTaskDetail`), so the state history, then the run's own
    error, then the node to look up stand in.
    """
    details = getattr(run.run_details, "task_details", None) or []
    by_pod = {str(t.pod_name): t for t in details if t.pod_name}
    children: dict[int, list[Any]] = {id(t): [] for t in details}
    parent: dict[int, Any] = {}
    by_id = {str(t.task_id): t for t in details if t.task_id}
    for task in details:
        linked = [by_pod.get(str(c.pod_name)) for c in task.child_tasks or []]
        if task.parent_task_id and str(task.parent_task_id) in by_id:  # an API-made task tree
            up = by_id[str(task.parent_task_id)]
            children[id(up)].append(task)
            parent.setdefault(id(task), up)
        for child in linked:
            if child is not None:
                children[id(task)].append(child)
                parent.setdefault(id(child), task)
    failed = [t for t in details if str(t.state) == "FAILED"]
    found: dict[str, TaskFailure] = {}
    for task in failed:
        if _reaches_a_failure(task, children):
            continue
        owner = task
        if _ATTEMPT.fullmatch(str(task.display_name or "")):
            # One pod "executor(<n>)" of a Retry node "executor" (argo-workflows operator.go
            # processNodeRetries): a failure only if the retries ended in one.
            retry = parent.get(id(task))
            if retry is None or str(retry.state) != "FAILED":
                continue
            owner = retry
        name = str(owner.display_name or "")
        if name == "executor" and id(owner) in parent:
            name = str(parent[id(owner)].display_name)
        name = name or str(task.task_id)
        found[name] = TaskFailure(name, _task_error(task, run))  # its last attempt's error
    return list(found.values())


_ATTEMPT = re.compile(r"executor\(\d+\)")  # one pod of a task's retried executor


def _reaches_a_failure(task: Any, children: Mapping[int, list[Any]]) -> bool:
    """True if another FAILED task is reachable from `task` through `children`."""
    seen, queue = {id(task)}, list(children[id(task)])
    while queue:
        other = queue.pop()
        if id(other) in seen:
            continue
        seen.add(id(other))
        if str(other.state) == "FAILED":
            return True
        queue.extend(children[id(other)])
    return False


def _task_error(task: Any, run: Any) -> str:
    if task.error is not None and task.error.message:
        return str(task.error.message)
    for status in reversed(task.state_history or []):
        if status.error is not None and status.error.message:
            return str(status.error.message)
    if run.error is not None and run.error.message:
        return str(run.error.message)
    where = f" (node {task.pod_name})" if task.pod_name else ""
    return f"no error message in KFP's API: see the task's log in the KFP UI{where}"
