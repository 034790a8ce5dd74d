"""Run an `IndexedJobSpec` as a Kubernetes batch/v1 Indexed Job and watch it to the end.

A small state machine over one Job, each step in a module of its own, as tfjob/ is:

    submit ──▶ watch ──(Complete / Failed)──▶ finish: the result, or the job's error
      │          │
      └──────────┴──(cancel, timeout)──▶ clean up: delete the Job, then raise

- submit (submit.py): create the Job from its manifest (manifest.py), or re-attach to the one
  an earlier attempt made, or run a Failed one again;
- watch (watch.py): follow the Job's conditions and indexes until Complete or Failed;
- finish (finish.py): the `IndexedResult`, or the error of a Failed Job: its failed indexes,
  the failing part's exit and log, a part's bad input as a `WorkerInputError`;
- clean up (cleanup.py): delete the Job on SIGTERM (a cancelled run) or the launcher's
  timeout; a Failed Job stopped its pods itself and stays until its TTL.

Kubernetes runs the retries (`backoffLimitPerIndex`), the bad-input rule (`podFailurePolicy`)
and the deadline, so all of it holds while the launcher is gone.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from components.jobs import kube
from components.jobs.cancel import cancel_on_sigterm
from components.jobs.errors import LaunchError
from components.jobs.indexed.api import JobApi
from components.jobs.indexed.cleanup import clean_up
from components.jobs.indexed.finish import failure, result
from components.jobs.indexed.launcher import IndexedResult
from components.jobs.indexed.manifest import build_manifest
from components.jobs.indexed.spec import IndexedJobSpec
from components.jobs.indexed.status import condition
from components.jobs.indexed.submit import submit
from components.jobs.indexed.watch import Watch

TIMEOUT_SLACK_SECONDS = 900  # default launcher timeout beyond active_deadline_seconds


class IndexedJobLauncher:
    """Creates (or re-attaches to) an Indexed Job, watches it, reports."""

    def __init__(
        self,
        api_client: Any = None,
        out: TextIO | None = None,
        *,
        poll_seconds: int = 30,
        log_tail_lines: int = 30,
    ) -> None:
        self.api_client = api_client if api_client is not None else kube.default_api_client()
        self.out = out if out is not None else sys.stdout
        self.poll_seconds = poll_seconds  # longest single watch request
        self.log_tail_lines = log_tail_lines

    def run(self, spec: IndexedJobSpec, *, timeout_seconds: float | None = None) -> IndexedResult:
        """Run `spec` as an Indexed Job to the end; return the result or raise `LaunchError`.

        `timeout_seconds` defaults to active_deadline_seconds plus TIMEOUT_SLACK_SECONDS (no
        limit if neither is set). On the timeout and on SIGTERM the Job is deleted before the
        error is raised.
        """
        manifest = build_manifest(spec)
        if timeout_seconds is None and spec.active_deadline_seconds is not None:
            timeout_seconds = spec.active_deadline_seconds + TIMEOUT_SLACK_SECONDS
        started = time.monotonic()
        deadline = None if timeout_seconds is None else started + timeout_seconds
        api = JobApi(self.api_client, spec, self.out, self.log_tail_lines)
        with cancel_on_sigterm():
            try:
                job, reattached = submit(api, manifest)
                job = Watch(api, self.poll_seconds).until_finished(job, deadline)
            except (LaunchError, KeyboardInterrupt) as exc:
                clean_up(api, exc)
                raise
        if condition(job, "Failed") is not None:
            raise failure(api, job)
        return result(api, job, started, reattached)
