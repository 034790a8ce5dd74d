"""Run a `JobSpec` as a Kubeflow Training Operator v1 TFJob and watch it to the end.

The launcher is a small state machine over one job, each step in a module of its own:

    submit ──▶ watch ──(Succeeded / Failed)──▶ finish: the result, or the job's error
      │          │ each change: restart step (count, record, backoff)
      └──────────┴──(cancel, timeout, an error that ends the job)──▶ clean up, then raise

- submit (submit.py): create the job from its manifest (manifest.py), or re-attach to the one
  an earlier attempt made, or run a Failed one again;
- watch (watch.py): follow the job and its pods; workers that cannot start (start.py) and a
  permanent exit while the operator shows Restarting (kubeflow/trainer#2044) fail it;
- restart (backoff.py): count restarts of the whole worker group, not failed pods
  (restarts.py), keep the count on the job so that a retried launcher continues it, and
  enforce `backoff_limit`, which the v1 operator cannot under `restartPolicy: ExitCode`
  (kubeflow/trainer#2045; the manifest leaves its runPolicy.backoffLimit out, manifest.py
  `operator_backoff_limit`); say which worker exited how (status.py, from the pods and the
  operator's ExitedWithCode events);
- finish (finish.py): the `LaunchResult`, or the error of a Failed job with the failing
  worker's exit, termination message and log;
- clean up (cleanup.py): delete the job on SIGTERM (a cancelled run), the launcher's timeout,
  or an error that ends a job the operator would go on running; an API error leaves it.

Worker 0's log streams into this process's output all along (logs.py).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from components.jobs import kube
from components.jobs.cancel import cancel_on_sigterm
from components.jobs.errors import LaunchError
from components.jobs.launcher import LaunchResult
from components.jobs.spec import JobSpec
from components.jobs.tfjob.api import TFJobApi
from components.jobs.tfjob.cleanup import clean_up
from components.jobs.tfjob.finish import failure, result
from components.jobs.tfjob.logs import LogFollower
from components.jobs.tfjob.manifest import build_manifest
from components.jobs.tfjob.restarts import RestartLedger
from components.jobs.tfjob.start import START_GRACE_SECONDS
from components.jobs.tfjob.status import JobState
from components.jobs.tfjob.submit import submit
from components.jobs.tfjob.watch import Watch

TIMEOUT_SLACK_SECONDS = 900  # default launcher timeout beyond active_deadline_seconds


class TFJobLauncher:
    """Creates (or re-attaches to) a TFJob, watches it, streams worker 0's log, reports."""

    def __init__(
        self,
        api_client: Any = None,
        out: TextIO | None = None,
        *,
        poll_seconds: int = 30,
        log_tail_lines: int = 30,
        start_grace_seconds: float = START_GRACE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from kubernetes import client

        self.api_client = api_client if api_client is not None else kube.default_api_client()
        self.custom = client.CustomObjectsApi(self.api_client)
        self.core = client.CoreV1Api(self.api_client)
        self.out = out if out is not None else sys.stdout
        self.poll_seconds = poll_seconds  # longest single watch request
        self.log_tail_lines = log_tail_lines
        self.start_grace_seconds = start_grace_seconds  # a worker that cannot start, this long
        self.clock = clock  # seconds, monotonic: what the start grace is measured by

    def run(self, spec: JobSpec, *, timeout_seconds: float | None = None) -> LaunchResult:
        """Run `spec` as a TFJob to the end; return the result or raise `LaunchError`.

        `timeout_seconds` defaults to active_deadline_seconds plus TIMEOUT_SLACK_SECONDS (no
        limit if neither is set). On the timeout, on SIGTERM and when restarts exceed
        `spec.backoff_limit`, the TFJob is deleted before the error is raised.
        """
        manifest = build_manifest(spec)
        if timeout_seconds is None and spec.active_deadline_seconds is not None:
            timeout_seconds = spec.active_deadline_seconds + TIMEOUT_SLACK_SECONDS
        started = time.monotonic()
        deadline = None if timeout_seconds is None else started + timeout_seconds
        api = self._api(spec)
        with cancel_on_sigterm():
            follower = None
            try:
                job, reattached = submit(api, manifest)
                annotations = job["metadata"].get("annotations") or {}
                state = JobState(RestartLedger.from_annotations(spec.workers, annotations))
                follower = LogFollower(self.core, spec, self.out, self.log_tail_lines)
                follower.start()
                watch = Watch(
                    api, state, self.poll_seconds, self.start_grace_seconds, clock=self.clock
                )
                job = watch.until_finished(job, deadline)
                follower.finish(timeout=5)
            except (LaunchError, KeyboardInterrupt) as exc:
                if follower is not None:
                    follower.stop()
                clean_up(api, exc)
                raise
        if state.phase == "Failed":
            tail = list(follower.tail) if follower else []
            raise failure(api, job["metadata"]["uid"], state, tail)
        return result(api, job, state, started, reattached)

    def worker0_log(self, spec: JobSpec, tail_lines: int) -> list[str]:
        """The last `tail_lines` lines of worker 0's log, read from its newest pod once the job
        has ended, so not from the stream that followed it. A job that succeeded, or failed by
        a worker's exit, keeps its pods until its TTL (cleanPodPolicy `Running` deletes only
        running ones); one the operator failed past its deadline or backoff limit has none
        left (it deletes them all), and then this is []."""
        return self._api(spec).worker0_log(tail_lines)

    def _api(self, spec: JobSpec) -> TFJobApi:
        lines = self.log_tail_lines
        return TFJobApi(self.api_client, self.custom, self.core, spec, self.out, lines)
