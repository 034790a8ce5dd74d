"""Recent runs of gptpipe on KFP: state, duration, pipeline version, dataset and pushed version.

KFP's API gives a run's state, times, pipeline version and parameters. It does not give what a
step produced: in KFP 2.5 a task's `inputs`/`outputs` are empty (api_converter.go
`toModelTask` reads none from Argo nodes) and would hold only ML Metadata artifact ids, and the
v2beta1 API has no output parameters at all. The dataset version and the pushed version are
read from ML Metadata instead, where every step records them under the KFP run id, when the
store is given (`--mlmd`).
"""

from __future__ import annotations

import datetime
from dataclasses import asdict, dataclass
from typing import Any

from contracts.errors import UserError
from pipelines.runners.kfp import ops
from pipelines.runners.kfp.client import Api

NOT_KNOWN = "-"


@dataclass(frozen=True)
class RunRow:
    """One run as `gptpipe kfp runs` shows it."""

    run_id: str
    name: str  # the run's display name
    state: str  # RuntimeState: PENDING, RUNNING, SUCCEEDED, FAILED...
    created_at: str  # ISO 8601, UTC
    duration: str  # e.g. "1h02m05s"; "-" while it runs
    version: str  # the pipeline version's name, or "-" (a run of a YAML file)
    recurring_run_id: str  # the schedule that started it, or ""
    dataset_version: str  # from ML Metadata, or "-"
    pushed_version: str  # from ML Metadata: the served version it pushed, "not pushed" or "-"

    def as_dict(self) -> dict[str, str]:
        """The row for --json."""
        return asdict(self)


def recent(api: Api, limit: int, mlmd: str | None = None) -> list[RunRow]:
    """The `limit` most recent runs, newest first, enriched from ML Metadata when given."""
    if limit < 1:
        raise UserError(f"--limit {limit}: pass 1 or more")
    found = api.call(
        "list runs",
        lambda: api.client.list_runs(
            page_size=limit, sort_by="created_at desc", namespace=api.namespace or None
        ),
    )
    runs = list(found.runs or [])
    names = _version_names(api)
    return [_row(run, names, mlmd) for run in runs]


def _version_names(api: Api) -> dict[str, str]:
    pipeline_id = ops.find_pipeline(api)
    if pipeline_id is None:
        return {}
    found = api.call(
        "list pipeline versions",
        lambda: api.client.list_pipeline_versions(pipeline_id, page_size=200),
    )
    return {str(v.pipeline_version_id): str(v.display_name) for v in found.pipeline_versions or []}


def _row(run: Any, version_names: dict[str, str], mlmd: str | None) -> RunRow:
    reference = run.pipeline_version_reference
    version_id = str(getattr(reference, "pipeline_version_id", "") or "")
    dataset, pushed = _from_lineage(mlmd, str(run.run_id)) if mlmd else (NOT_KNOWN, NOT_KNOWN)
    return RunRow(
        run_id=str(run.run_id),
        name=str(run.display_name or ""),
        state=str(run.state or "RUNTIME_STATE_UNSPECIFIED"),
        created_at=_iso(run.created_at),
        duration=_duration(run),
        version=version_names.get(version_id, version_id or NOT_KNOWN),
        recurring_run_id=str(run.recurring_run_id or ""),
        dataset_version=dataset,
        pushed_version=pushed,
    )


def _from_lineage(store: str, run_id: str) -> tuple[str, str]:
    """(dataset version, pushed version) of one run from ML Metadata; "-" for what is missing."""
    from components import lineage

    try:
        summary = lineage.run_summary(store, run_id)
    except UserError:  # the run recorded nothing (yet)
        return NOT_KNOWN, NOT_KNOWN
    pushed = summary["steps"].get("push", {}).get("outputs", {}).get("pushed_model", [])
    props = pushed[0]["properties"] if pushed else {}
    if not props:
        where = NOT_KNOWN
    elif props.get("pushed"):
        where = f"{props.get('pushed_destination')}/{props.get('pushed_version')}"
    else:
        where = "not pushed"
    return str(summary.get("dataset_version") or NOT_KNOWN), where


def _iso(when: Any) -> str:
    if not isinstance(when, datetime.datetime):
        return NOT_KNOWN
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _duration(run: Any) -> str:
    start, end = run.created_at, run.finished_at
    if not isinstance(start, datetime.datetime) or not isinstance(end, datetime.datetime):
        return NOT_KNOWN
    seconds = int((end - start).total_seconds())
    if seconds < 0:  # KFP 2.5 reports an unfinished run's finished_at as the epoch
        return NOT_KNOWN
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"
