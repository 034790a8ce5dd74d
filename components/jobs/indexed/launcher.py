"""The indexed launcher interface alone: an `IndexedLauncher` runs an `IndexedJobSpec` to the
end and returns an `IndexedResult`, or raises a `LaunchError` (components/jobs/errors.py).

Both implementations, `local` (indexed/local.py: processes here) and `job` (indexed/job.py: a
batch/v1 Indexed Job), run a spec with the same semantics (indexed/spec.py says them);
indexed/make.py picks one (contracts/params.py `PART_LAUNCHERS` names them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # a type only: the spec's home is indexed/spec.py
    from components.jobs.indexed.spec import IndexedJobSpec


@dataclass(frozen=True)
class IndexedResult:
    """What a finished, successful indexed job reports, whichever launcher ran it."""

    launcher: str  # "local" or "job"
    job_name: str  # IndexedJobSpec.name
    completions: int  # indexes, every one of which succeeded
    wall_seconds: float  # from the first part's start to the last one's success
    retries: int  # failed part runs that were run again (disruptions not counted)
    image_digests: Mapping[str, str] = field(default_factory=dict)  # pod -> sha256 digest
    reattached: bool = False  # the launcher found the job already there (a retried launcher)


class IndexedLauncher(Protocol):
    """Runs an `IndexedJobSpec` to the end: local processes or an Indexed Job, same semantics."""

    def run(self, spec: IndexedJobSpec, *, timeout_seconds: float | None = None) -> IndexedResult:
        """Run every index of `spec` to success and report it; raise `LaunchError` (or a
        subclass: `WorkerInputError` for a part's bad input) if the job fails.

        `timeout_seconds` is the launcher's own limit on top of `spec.active_deadline_seconds`.
        """
        ...
