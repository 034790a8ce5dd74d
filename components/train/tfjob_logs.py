"""Worker 0's log, streamed from its pods into the train step's log while the TFJob runs."""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any, TextIO

from components.train.launcher import JobSpec
from components.train.tfjob_manifest import (
    CONTAINER,
    LABEL_JOB_NAME,
    LABEL_REPLICA_INDEX,
    LABEL_REPLICA_TYPE,
)

log = logging.getLogger(__name__)


class LogFollower(threading.Thread):
    """Streams worker 0's log into `out`, following each incarnation of its pod once."""

    def __init__(self, core: Any, spec: JobSpec, out: TextIO, tail_lines: int) -> None:
        super().__init__(name=f"logs-{spec.name}", daemon=True)
        self.core, self.spec, self.out = core, spec, out
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self._halt = threading.Event()
        self._final = threading.Event()
        self._selector = (
            f"{LABEL_JOB_NAME}={spec.name},{LABEL_REPLICA_TYPE}=worker,{LABEL_REPLICA_INDEX}=0"
        )

    def run(self) -> None:
        seen: set[str] = set()
        while not self._halt.is_set():
            try:
                pods = self.core.list_namespaced_pod(
                    self.spec.namespace, label_selector=self._selector
                ).items
                ready = [p for p in pods if p.status and p.status.phase != "Pending"]
                fresh = [p for p in ready if p.metadata.uid not in seen]
                if not fresh:
                    if self._final.is_set():
                        return
                    self._halt.wait(0.5)
                    continue
                pod = fresh[0]
                seen.add(pod.metadata.uid)
                self._follow(pod.metadata.name)
            except Exception as exc:  # the log is a convenience; never fail the job over it
                log.debug("following worker-0 log: %s", exc)
                self._halt.wait(0.5)

    def _follow(self, pod_name: str) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        resp = self.core.read_namespaced_pod_log(
            pod_name, self.spec.namespace, container=CONTAINER, follow=True, _preload_content=False
        )
        try:
            for line in iter_resp_lines(resp):
                if self._halt.is_set():
                    return
                self.tail.append(line)
                self.out.write(f"[{pod_name}] {line}\n")
                self.out.flush()
        finally:
            resp.release_conn()

    def finish(self, timeout: float) -> None:
        """Let the current stream drain (the pod has ended), then stop."""
        self._final.set()
        self.join(timeout)
        self.stop()

    def stop(self) -> None:
        """Stop writing. A stream still open is left to end with its pod: closing a response
        another thread is reading blocks on the reader's lock."""
        self._halt.set()
