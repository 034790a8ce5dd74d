"""One Indexed Job's side of the Kubernetes API: the calls the launcher's steps make about it.

Create, read, watch and delete the Job (batch/v1); list its pods and read a pod's log tail.
Everything is plain JSON, as the API server sends it (the client's models are not needed, and
a newer server's fields would only be dropped by them).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any, TextIO

from components.jobs.errors import LaunchError
from components.jobs.indexed.manifest import CONTAINER, LABEL_CONTROLLER_UID
from components.jobs.indexed.spec import IndexedJobSpec


class JobApi:
    """The API calls about the Job of `spec`, and the launcher's `[job]` lines."""

    def __init__(self, api_client: Any, spec: IndexedJobSpec, out: TextIO, tail_lines: int):
        from kubernetes import client

        self.api_client = api_client
        self.batch = client.BatchV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.spec, self.out, self.tail_lines = spec, out, tail_lines
        self.what = f"Job {spec.namespace}/{spec.name}"  # how messages name the job

    def say(self, message: str) -> None:
        self.out.write(f"[job] {message}\n")
        self.out.flush()

    def create(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        response = self.batch.create_namespaced_job(
            self.spec.namespace, manifest, _preload_content=False
        )
        spec = self.spec
        self.say(f"created {self.what} ({spec.completions} parts, {spec.parallelism} at a time)")
        return dict(json.loads(response.data))

    def get(self) -> dict[str, Any]:
        response = self.batch.read_namespaced_job(
            self.spec.name, self.spec.namespace, _preload_content=False
        )
        return dict(json.loads(response.data))

    def delete(self, why: str, propagation: str = "Background") -> None:
        """Delete the job and its pods (batch/v1 would orphan them unless told); a job already
        gone is no error, and a failure is said, not raised: the job's TTL still ends it."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.batch.delete_namespaced_job(
                self.spec.name, self.spec.namespace, propagation_policy=propagation
            )
            self.say(f"deleted {self.what} ({why})")
        except ApiException as exc:
            if exc.status != 404:
                self.say(f"could not delete {self.what}: {exc.status} {exc.reason}")

    def watch(self, resource_version: str, seconds: int) -> Iterator[dict[str, Any]]:
        """The job's watch events for up to `seconds`, as {"type", "object"} of plain JSON."""
        from kubernetes import watch

        for event in watch.Watch().stream(
            self.batch.list_namespaced_job,
            self.spec.namespace,
            field_selector=f"metadata.name={self.spec.name}",
            resource_version=resource_version,
            timeout_seconds=seconds,
            _request_timeout=seconds + 30,
        ):
            yield {"type": event["type"], "object": event["raw_object"]}

    def deleted(self) -> LaunchError:
        """The error for a job deleted under the launcher."""
        return LaunchError(
            f"{self.what} was deleted while running", reason="Deleted", job_name=self.spec.name
        )

    def pods(self, job_uid: str) -> list[dict[str, Any]]:
        """The pods of that incarnation of the job, as plain JSON."""
        response = self.core.list_namespaced_pod(
            self.spec.namespace,
            label_selector=f"{LABEL_CONTROLLER_UID}={job_uid}",
            _preload_content=False,
        )
        return list(json.loads(response.data).get("items") or [])

    def log_tail(self, pod_name: str) -> list[str]:
        """The last lines of a pod's log; [] (said) if it cannot be read."""
        from kubernetes.client.exceptions import ApiException

        try:
            response = self.core.read_namespaced_pod_log(
                pod_name,
                self.spec.namespace,
                container=CONTAINER,
                tail_lines=self.tail_lines,
                _preload_content=False,
            )
        except ApiException as exc:
            self.say(f"could not read the log of {pod_name}: {exc.status} {exc.reason}")
            return []
        return response.data.decode("utf-8", errors="replace").splitlines()[-self.tail_lines :]
