"""Worker 0's log, streamed from its pods into the train step's log while the TFJob runs.

The kubelet ends a follow stream cleanly once the container has stopped and its log is read to
the end (pkg/kubelet/kuberuntime/logs/logs.go, `ReadLogs`: `if !found { return nil }`). A stream
cut before that (a proxy's or load balancer's idle timeout between here and the API server, an
API server restarting) ends without HTTP's last chunk, an error here. The follower then asks
again for the same container from shortly before the last line it wrote, as `kubectl logs -f`
does not:

- with `timestamps=true`, the kubelet puts each line's time in front of it (RFC3339NanoFixed and
  a space: logs.go, `logWriter.write`), and `sinceTime` (the node's own clock, so no skew, lag
  or suspended laptop in between) skips lines stamped before it (`NewLogOptions`);
- the lines it brings again are recognised by their text and stamp among the last ones written,
  in order, and skipped: stdout and stderr lines can reach the log file slightly out of their
  stamps' order (containerd copies each stream in its own goroutine), so lines are matched, not
  compared by time.

A container is done once its stream ended cleanly. Progress is kept per container (the pod's uid
and the container's ID), so a pod the operator recreates under the same name, and a container
the kubelet restarts in place (restartPolicy OnFailure), are each followed from their start.
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
import re
import threading
from typing import Any, TextIO

from components.train.launcher import JobSpec
from components.train.tfjob_manifest import CONTAINER, worker0_selector

log = logging.getLogger(__name__)

RESUME_BACK_SECONDS = 2  # sinceTime this long before the last line: out-of-order stamps
RECENT_LINES = 4096  # lines kept to recognise in a resumed stream
PAUSE_SECONDS = 0.5  # between streams of one container, and between listings with nothing new
MAX_BACKOFF_SECONDS = 30.0  # the longest wait after failed requests in a row
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d) ")


def split_stamp(line: str) -> tuple[tuple[int, int] | None, str]:
    """A `timestamps=true` log line as ((epoch seconds, nanoseconds), text); (None, line) for a
    line without one."""
    found = _STAMP.match(line)
    if not found:
        return None, line
    whole, fraction, zone = found.groups()
    when = dt.datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone))
    nanos = int((fraction or "0").ljust(9, "0"))
    return (int(when.timestamp()), nanos), line[found.end() :]


class LogPlace:
    """How far one container's log has been written: the latest stamp seen, how many lines, and
    the last RECENT_LINES of them as they came (stamp included), to skip when a resumed stream
    brings them again."""

    def __init__(self) -> None:
        self.latest: tuple[int, int] | None = None
        self.written = 0
        self.recent: collections.deque[str] = collections.deque(maxlen=RECENT_LINES)
        self._replay: list[str] | None = None
        self._at = 0
        self._unstamped = 0  # lines of a resumed whole-log stream (no stamps) still to skip

    def next_stream(self) -> str | None:
        """Start a stream: its `sinceTime` (None: the whole log, the first time or where the
        server gave no stamps)."""
        if self.latest is None:  # the whole log again: skip as many lines as were written
            self._replay, self._unstamped = None, self.written
            return None
        self._replay, self._at, self._unstamped = (list(self.recent) or None), 0, 0
        start = dt.datetime.fromtimestamp(self.latest[0] - RESUME_BACK_SECONDS, dt.UTC)
        return start.strftime("%Y-%m-%dT%H:%M:%SZ")

    def is_new(self, raw: str) -> bool:
        """Whether a line of the current stream was not written before (and note it if so)."""
        if self._unstamped > 0:
            self._unstamped -= 1
            return False
        if self._replay is not None:
            try:
                self._at = self._replay.index(raw, self._at) + 1
            except ValueError:  # the first line not written before: the rest are new too
                self._replay = None
            else:
                if self._at == len(self._replay):
                    self._replay = None
                return False
        self.recent.append(raw)
        self.written += 1
        stamp, _ = split_stamp(raw)
        if stamp is not None and (self.latest is None or stamp > self.latest):
            self.latest = stamp
        return True


class LogFollower(threading.Thread):
    """Streams worker 0's log into `out`: each container of each of its pods (a restart is a
    new pod, or a new container in the same one) from its first line to its last, each once."""

    def __init__(self, core: Any, spec: JobSpec, out: TextIO, tail_lines: int) -> None:
        super().__init__(name=f"logs-{spec.name}", daemon=True)
        self.core, self.spec, self.out = core, spec, out
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self._halt = threading.Event()
        self._final = threading.Event()
        self._places: dict[tuple[str, str], LogPlace] = {}
        self._done: set[tuple[str, str]] = set()
        self._said: set[str] = set()

    def run(self) -> None:
        pause, failures = 0.0, 0
        while not self._halt.is_set():
            if pause:  # before listing: the container listed is the one then asked for
                self._halt.wait(pause)
            try:
                pods = self.core.list_namespaced_pod(
                    self.spec.namespace, label_selector=worker0_selector(self.spec.name)
                ).items
                ready = [p for p in pods if p.status and p.status.phase != "Pending"]
                todo = [p for p in ready if _container_key(p) not in self._done]
                if not todo:
                    if self._final.is_set():
                        return
                    pause = PAUSE_SECONDS
                    continue
                key = _container_key(todo[0])
                place = self._places.setdefault(key, LogPlace())
                if self._follow(todo[0].metadata.name, place):
                    self._done.add(key)
                    pause = 0.0
                else:
                    pause = PAUSE_SECONDS
                failures = 0
            except Exception as exc:  # the log is a convenience; never fail the job over it
                failures += 1
                pause = min(MAX_BACKOFF_SECONDS, PAUSE_SECONDS * 2**failures)
                self._note(exc)

    def _follow(self, pod_name: str, place: LogPlace) -> bool:
        """Write the container's new lines as they come; True when the kubelet ended the
        stream (the container has stopped), False when it stopped early (the halt)."""
        from kubernetes.watch.watch import iter_resp_lines

        query: list[tuple[str, str]] = [
            ("container", CONTAINER),
            ("follow", "true"),
            ("timestamps", "true"),
        ]
        since = place.next_stream()
        if since is not None:
            query.append(("sinceTime", since))
        # read_namespaced_pod_log's own request (core_v1_api.py), with the sinceTime of the
        # API's PodLogOptions, which the generated method does not take.
        resp = self.core.api_client.call_api(
            "/api/v1/namespaces/{namespace}/pods/{name}/log",
            "GET",
            {"namespace": self.spec.namespace, "name": pod_name},
            query,
            {"Accept": "text/plain"},
            response_type="str",
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _preload_content=False,
        )
        try:
            for raw in iter_resp_lines(resp):
                if self._halt.is_set():
                    return False
                if not place.is_new(raw):
                    continue
                _, line = split_stamp(raw)
                self.tail.append(line)
                self.out.write(f"[{pod_name}] {line}\n")
                self.out.flush()
        finally:
            resp.release_conn()
        return True

    def _note(self, exc: Exception) -> None:
        """Say once per kind of failure that the log could not be followed (it is retried)."""
        status = getattr(exc, "status", None)
        what = f"{status} {getattr(exc, 'reason', '')}".strip() if status else type(exc).__name__
        log.debug("following worker-0 log: %s", exc)
        if what not in self._said:
            self._said.add(what)
            self.out.write(f"[logs] worker 0's log stream: {what}; trying again\n")
            self.out.flush()

    def finish(self, timeout: float) -> None:
        """Let the current stream drain (the pod has ended), then stop."""
        self._final.set()
        self.join(timeout)
        self.stop()

    def stop(self) -> None:
        """Stop writing. A stream still open is left to end with its pod: closing a response
        another thread is reading blocks on the reader's lock."""
        self._halt.set()


def _container_key(pod: Any) -> tuple[str, str]:
    """The pod's uid and its trainer container's ID (new at each restart in place; "" until
    the container has one)."""
    for status in pod.status.container_statuses or []:
        if status.name == CONTAINER:
            return pod.metadata.uid, status.container_id or ""
    return pod.metadata.uid, ""
