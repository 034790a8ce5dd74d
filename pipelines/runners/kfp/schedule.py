"""Recurring runs: the cron KFP accepts, and creating, replacing, pausing and deleting one.

KFP's cron is robfig/cron v1.2.0's `cron.Parse` (backend/src/apiserver/server/api_converter.go
validates with it, backend/src/crd/controller/scheduledworkflow/util/cron_schedule.go fires with
it): six fields, seconds first. Its parser also takes five fields, as seconds to month with the
day of week left `*`, so a classic `0 2 * * *` would silently mean "at minute 2 of every hour";
`check_cron` refuses five fields and names the six-field form meant.

A recurring run references the pipeline and no version: KFP 2.5 then leaves the version out of
the ScheduledWorkflow (resource_manager.go `CreateJob`), and each firing creates its run with an
empty version id, which the API server resolves to the newest version
(scheduledworkflow/controller.go; `fetchPipelineVersionFromPipelineSpec`). So uploading a new
version re-points every future firing without touching the schedule.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from contracts.errors import UserError
from pipelines.runners.kfp import ops
from pipelines.runners.kfp.client import Api, KfpError

# robfig/cron v1.2.0 spec.go: each field's bounds and names; parser.go: the descriptors.
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_FIELDS: tuple[tuple[str, int, int, Mapping[str, int]], ...] = (
    ("second", 0, 59, {}),
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, {m: i + 1 for i, m in enumerate(_MONTHS)}),
    ("day of week", 0, 6, {d: i for i, d in enumerate(_DAYS)}),
)
_DESCRIPTORS = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)
_EVERY = re.compile(r"@every (\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+")


def check_cron(expr: str) -> str:
    """Return `expr` when KFP's cron accepts it as meant; refuse it with the fix otherwise."""
    text = expr.strip()
    if text in _DESCRIPTORS or _EVERY.fullmatch(text):
        return text
    fields = text.split()
    if len(fields) == 5:
        raise UserError(
            f"--cron {expr!r} has five fields, but KFP's cron has six with seconds first, and "
            f"would read this one as 'second minute hour day month': pass --cron '0 {text}'"
        )
    if len(fields) != 6:
        raise UserError(
            f"--cron {expr!r} has {len(fields)} fields: KFP's cron has six, "
            "'second minute hour day-of-month month day-of-week', e.g. '0 0 2 * * *' (02:00 daily)"
        )
    for field, (name, low, high, names) in zip(fields, _FIELDS, strict=True):
        for part in field.split(","):
            problem = _range_problem(part, low, high, names)
            if problem:
                raise UserError(f"--cron {expr!r}: the {name} field {field!r} {problem}")
    return text


def _range_problem(part: str, low: int, high: int, names: Mapping[str, int]) -> str:
    """What is wrong with one range (robfig's getRange: `*`/`?`, N, N-M, each with /STEP)."""
    span, _, step = part.partition("/")
    if step and (not step.isdigit() or int(step) == 0):
        return f"has step {step!r}: a step is a positive number"
    if span in ("*", "?"):
        return ""
    ends = span.split("-")
    if len(ends) > 2:
        return f"has too many '-' in {part!r}"
    values = []
    for end in ends:
        value = names.get(end.lower()) if end.lower() in names else None
        if value is None and not end.isdigit():
            return f"has {end!r}, not a number{' or a name' if names else ''}"
        values.append(int(end) if value is None else value)
    if values[0] < low or values[-1] > high:
        return f"is out of range: {low}-{high}"
    if values[0] > values[-1]:
        return f"has a range that runs backwards: {span!r}"
    return ""


DESCRIPTION_PREFIX = "gptpipe on cron"  # how schedule's recurring runs describe themselves


def find(api: Api, name: str, pipeline_id: str | None) -> list[Any]:
    """The recurring runs called `name` of the pipeline `pipeline_id` (in the namespace on a
    multi-user KFP): another pipeline's schedule of the same name on a shared KFP is not ours
    to replace, pause or delete."""
    found = api.call(
        f"list recurring runs named {name}",
        lambda: api.client.list_recurring_runs(
            filter=ops.name_filter(name), namespace=api.namespace or None, page_size=100
        ),
    )
    return [each for each in found.recurring_runs or [] if _ours(each, pipeline_id)]


def _ours(recurring_run: Any, pipeline_id: str | None) -> bool:
    """Whether a recurring run is gptpipe's: by its pipeline reference, or, from a server that
    returns the pipeline spec inline instead of the reference, by the description `schedule`
    gives it."""
    reference = recurring_run.pipeline_version_reference
    if reference is not None and reference.pipeline_id:
        return bool(pipeline_id) and reference.pipeline_id == pipeline_id
    return str(recurring_run.description or "").startswith(DESCRIPTION_PREFIX)


def delete(api: Api, recurring_run_id: str) -> None:
    """Delete one recurring run; one already gone (404, say a retried delete) is fine."""
    try:
        api.call(
            f"delete recurring run {recurring_run_id}",
            lambda: api.client.delete_recurring_run(recurring_run_id),
        )
    except KfpError as err:
        if err.status != 404:
            raise


def schedule(
    api: Api,
    name: str,
    cron: str,
    params: Mapping[str, Any],
    *,
    experiment: str,
    root: str | None,
    max_concurrency: int,
    no_catchup: bool,
) -> tuple[Any, int]:
    """Create the recurring run `name`, then delete any older of that name (the API has no update).

    Returns the new recurring run and how many it replaced. The parameters are checked, and
    the pipeline root read, on the newest version, the one the next firing runs.
    """
    cron = check_cron(cron)
    if max_concurrency < 1:
        raise UserError(f"--max-concurrency {max_concurrency}: pass 1 or more")
    source = ops.source_from_server(api, None)
    params = ops.check_params(source, params)
    root = ops.pipeline_root(source, root)
    exp_id = ops.experiment_id(api, experiment)
    # Create first, then delete the old ones: a failed create leaves the old schedule in place
    # (two schedules of one name for a moment is better than none after an error).
    old = find(api, name, source.pipeline_id)
    models = api.client.api_models
    body = models.V2beta1RecurringRun(
        display_name=name,
        description=f"{DESCRIPTION_PREFIX} '{cron}': each firing runs the newest version",
        experiment_id=exp_id,
        namespace=api.namespace or None,
        # A pipeline id and no version id: each firing runs the newest version.
        pipeline_version_reference=models.V2beta1PipelineVersionReference(
            pipeline_id=source.pipeline_id
        ),
        runtime_config=models.V2beta1RuntimeConfig(
            parameters=dict(params), pipeline_root=root or None
        ),
        trigger=models.V2beta1Trigger(cron_schedule=models.V2beta1CronSchedule(cron=cron)),
        max_concurrency=str(max_concurrency),
        no_catchup=no_catchup,
        mode=models.RecurringRunMode.ENABLE,
    )
    created = api.call(
        f"create recurring run {name}",
        lambda: api.client.recurring_runs.recurring_run_service_create_recurring_run(body=body),
        creates=True,
    )
    for each in old:
        delete(api, str(each.recurring_run_id))
    return created, len(old)


def unschedule(api: Api, name: str, *, disable: bool = False) -> int:
    """Delete (or, with `disable`, pause) gptpipe's recurring runs called `name`; how many."""
    found = find(api, name, ops.find_pipeline(api))
    for each in found:
        if disable:
            _disable(api, str(each.recurring_run_id))
        else:
            delete(api, str(each.recurring_run_id))
    return len(found)


def _disable(api: Api, recurring_run_id: str) -> None:
    api.call(
        f"disable recurring run {recurring_run_id}",
        lambda: api.client.disable_recurring_run(recurring_run_id),
    )
