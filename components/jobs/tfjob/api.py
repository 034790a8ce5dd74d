"""One TFJob's side of the Kubernetes API: the calls the launcher's steps make about it.

Create, read, annotate and delete the job; list its pods, read a worker's log tail, and read
which workers exited how from the operator's events. Everything is plain JSON (the manifest's
field names); the steps (submit, watch, restart, finish, clean up) decide what to do with it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

from components.jobs import kube
from components.jobs.errors import LaunchError
from components.jobs.spec import JobSpec
from components.jobs.tfjob.manifest import (
    CONTAINER,
    GROUP,
    LABEL_JOB_NAME,
    PLURAL,
    VERSION,
    worker0_selector,
)
from components.jobs.tfjob.restarts import RestartLedger
from components.jobs.tfjob.status import (
    EXITED_REASON,
    JobState,
    WorkerExit,
    event_exits,
    merge_exits,
)

EVENTS_TIMEOUT_SECONDS = 30  # reading the job's events, a diagnosis: never waited on for long
_EPOCH = datetime.fromtimestamp(0, UTC)


class TFJobApi:
    """The API calls about the TFJob of `spec`, and the launcher's `[tfjob]` lines."""

    def __init__(
        self, api_client: Any, custom: Any, core: Any, spec: JobSpec, out: TextIO, tail_lines: int
    ) -> None:
        self.api_client, self.custom, self.core = api_client, custom, core
        self.spec, self.out, self.tail_lines = spec, out, tail_lines
        self.what = f"TFJob {spec.namespace}/{spec.name}"  # how messages name the job

    def say(self, message: str) -> None:
        self.out.write(f"[tfjob] {message}\n")
        self.out.flush()

    def create(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        spec = self.spec
        job = self.custom.create_namespaced_custom_object(
            GROUP, VERSION, spec.namespace, PLURAL, manifest
        )
        self.say(f"created {self.what} ({spec.workers} workers)")
        return dict(job)

    def get(self) -> dict[str, Any]:
        spec = self.spec
        return dict(
            self.custom.get_namespaced_custom_object(
                GROUP, VERSION, spec.namespace, PLURAL, spec.name
            )
        )

    def delete(self, why: str) -> None:
        """Delete the job, its pods first (foreground); a job already gone is no error."""
        from kubernetes.client.exceptions import ApiException

        spec = self.spec
        try:
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, spec.namespace, PLURAL, spec.name, propagation_policy="Foreground"
            )
            self.say(f"deleted {self.what} ({why})")
        except ApiException as exc:
            if exc.status != 404:
                self.say(f"could not delete {self.what}: {exc.reason}")

    def record_restarts(self, ledger: RestartLedger) -> bool:
        """Keep the ledger on the job (a merge patch of its annotations); False if that failed,
        and the next observation tries again: a launcher that re-attaches counts from it."""
        from kubernetes.client.exceptions import ApiException

        spec = self.spec
        patch = {"metadata": {"annotations": ledger.annotations()}}
        try:
            self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, spec.namespace, PLURAL, spec.name, patch
            )
        except ApiException as exc:
            self.say(f"could not record restarts on TFJob {spec.name}: {exc.status} {exc.reason}")
            return False
        return True

    def deleted(self) -> LaunchError:
        """The error for a job deleted under the launcher."""
        return LaunchError(
            f"{self.what} was deleted while running", reason="Deleted", job_name=self.spec.name
        )

    def pods(self, job_uid: str = "") -> list[Mapping[str, Any]]:
        """The job's pods as plain JSON (this package's field names are the manifest's). With
        `job_uid`, only the pods of that incarnation of the job (its ownerReference)."""
        pods = self.core.list_namespaced_pod(
            self.spec.namespace, label_selector=f"{LABEL_JOB_NAME}={self.spec.name}"
        )
        found = [self.api_client.sanitize_for_serialization(p) for p in pods.items]
        if not job_uid:
            return found
        return [
            p
            for p in found
            if any(r.get("uid") == job_uid for r in p["metadata"].get("ownerReferences") or [])
        ]

    def worker0_log(self, tail_lines: int) -> list[str]:
        """The last `tail_lines` lines of worker 0's log, read from its newest pod (see
        `TFJobLauncher.worker0_log`); [] if it has none left."""
        pods = self.core.list_namespaced_pod(
            self.spec.namespace, label_selector=worker0_selector(self.spec.name)
        ).items
        if not pods:
            return []
        newest = max(pods, key=lambda p: p.metadata.creation_timestamp or _EPOCH)
        return self.log_tail(newest.metadata.name, tail_lines)

    def log_tail(self, pod_name: str, lines: int | None = None) -> list[str]:
        """The last lines of a pod's `tensorflow` log; [] (said) if it cannot be read."""
        from kubernetes.client.exceptions import ApiException

        lines = lines or self.tail_lines
        try:
            # The raw body: deserialised, a log that is one JSON value comes back as its
            # Python repr (kubernetes-client/python#811, #1354).
            response = self.core.read_namespaced_pod_log(
                pod_name,
                self.spec.namespace,
                container=CONTAINER,
                tail_lines=lines,
                _preload_content=False,
            )
            text = response.data.decode("utf-8", errors="replace")
        except ApiException as exc:
            self.say(f"could not read the log of {pod_name}: {exc.status} {exc.reason}")
            return []
        return text.splitlines()[-lines:]

    def exits(self, job_uid: str, state: JobState) -> list[WorkerExit]:
        """The job's failed worker exits, the likely cause first: those the pod listings showed
        and those the operator's ExitedWithCode events on this job (by uid) recorded.

        A diagnosis only: whatever goes wrong reading the events (no rights, an outage, a body
        the client cannot read) is said once per kind and never fails or delays the job.
        """
        recorded: list[WorkerExit] = []
        try:
            # The raw body, as log_tail reads it: the client's models are not needed here.
            response = self.core.list_namespaced_event(
                self.spec.namespace,
                field_selector=f"involvedObject.uid={job_uid},reason={EXITED_REASON}",
                _preload_content=False,
                _request_timeout=EVENTS_TIMEOUT_SECONDS,
            )
            recorded = event_exits(json.loads(response.data).get("items") or [], self.spec.name)
        except LaunchError:  # SIGTERM's LaunchCancelled, raised wherever the main thread is
            raise
        except Exception as exc:
            self._events_unreadable(exc, state)
        return merge_exits(state.exits, recorded)

    def _events_unreadable(self, exc: Exception, state: JobState) -> None:
        brief = kube.api_error_brief(exc)
        if brief in state.events_failures:
            return
        state.events_failures.add(brief)
        rights = getattr(exc, "status", None) == 403
        self.say(
            f"could not read TFJob {self.spec.name}'s events ({brief}): which worker exited "
            "how is shown as far as the pod listings saw it"
            + ("; deploy/rbac.yaml grants list on events" if rights else "")
        )
