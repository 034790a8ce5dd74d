"""Reading a batch/v1 Job's status: its conditions and its index sets.

Types and reasons are k8s.io/api batch/v1 types.go's (Kubernetes 1.31): `Complete` and
`Failed` are terminal; since 1.31 the controller first adds `SuccessCriteriaMet` or
`FailureTarget` (same reason) and the terminal one only once every pod has stopped.
`completedIndexes` and `failedIndexes` are interval strings, "0-2,5" (pkg/controller/job/
indexed_job_utils.go `orderedIntervals.String`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

TERMINAL = ("Complete", "Failed")
INTERIM = ("SuccessCriteriaMet", "FailureTarget")


def condition(job: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    """The job's condition of type `kind` when its status is True, else None."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def finished(job: Mapping[str, Any]) -> dict[str, Any] | None:
    """The job's terminal condition (Complete or Failed), None while it runs."""
    return next((c for kind in TERMINAL if (c := condition(job, kind))), None)


def format_indexes(indexes: Iterable[int]) -> str:
    """Indexes as Kubernetes writes them: sorted intervals, "0-2,5"."""
    spans: list[list[int]] = []
    for index in sorted(indexes):
        if spans and index == spans[-1][1] + 1:
            spans[-1][1] = index
        else:
            spans.append([index, index])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def parse_indexes(text: str) -> list[int]:
    """The indexes of an interval string ("0-2,5" -> [0, 1, 2, 5])."""
    found: list[int] = []
    for term in filter(None, (text or "").split(",")):
        first, _, last = term.partition("-")
        found.extend(range(int(first), int(last or first) + 1))
    return found
