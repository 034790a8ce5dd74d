"""Worker 0's log, streamed from its pods into the train step's log while the TFJob runs.

A follow stream can end before its container does: an idle timeout in a proxy or load balancer
between here and the API server, the API server restarting, a kubelet's streaming connection
closing. The follower then follows the same pod again from where it stopped, as `kubectl logs
-f` does not: it asks for timestamps (`timestamps=true`: the kubelet puts each line's RFC 3339
time with nanoseconds in front of it, pkg/kubelet/kuberuntime/logs/logs.go, `timeFormatOut`)
and for the lines of the last seconds (`sinceSeconds`; the Python client has no `sinceTime`),
and drops those it already wrote. A pod is done once a stream ended after its container had.
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
import math
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, TextIO

from components.train.launcher import JobSpec
from components.train.tfjob_manifest import CONTAINER, worker0_selector

log = logging.getLogger(__name__)

# Lines of up to this many seconds before the last one received are asked for again when a
# stream is resumed: the time a line spends between the container and here (the runtime's log
# file, the kubelet, the API server) is under it.
RESUME_MARGIN_SECONDS = 10
REFOLLOW_PAUSE_SECONDS = 0.5  # between a stream that ended early and the next on that pod
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


@dataclass
class LogPlace:
    """How far one pod's log has been written: the last line's timestamp, how many lines bore
    exactly that timestamp, and when (this process's monotonic clock) the last line came."""

    stamp: tuple[int, int] | None = None
    at_stamp: int = 0
    received: float = 0.0
    _repeat: int = 0  # lines at `stamp` in the current stream

    def next_stream(self) -> int | None:
        """Start a stream: the `sinceSeconds` to ask for (None: the whole log)."""
        self._repeat = 0
        if self.stamp is None:
            return None
        return math.ceil(time.monotonic() - self.received) + RESUME_MARGIN_SECONDS

    def is_new(self, stamp: tuple[int, int] | None) -> bool:
        """Whether a line of the current stream is past this place (moving the place if so)."""
        if stamp is None:  # no timestamp to tell by: write it
            return True
        if self.stamp is not None and stamp < self.stamp:
            return False
        if stamp == self.stamp:
            self._repeat += 1
            if self._repeat <= self.at_stamp:  # written from an earlier stream
                return False
            self.at_stamp += 1
        else:
            self.stamp, self.at_stamp, self._repeat = stamp, 1, 1
        self.received = time.monotonic()
        return True


class LogFollower(threading.Thread):
    """Streams worker 0's log into `out`, each incarnation of its pod (a restart is a new pod)
    from its first line to its last, each line once."""

    def __init__(self, core: Any, spec: JobSpec, out: TextIO, tail_lines: int) -> None:
        super().__init__(name=f"logs-{spec.name}", daemon=True)
        self.core, self.spec, self.out = core, spec, out
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self.streams = 0  # follow requests made, resumed ones included
        self._halt = threading.Event()
        self._final = threading.Event()
        self._places: dict[str, LogPlace] = {}
        self._done: set[str] = set()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                pods = self.core.list_namespaced_pod(
                    self.spec.namespace, label_selector=worker0_selector(self.spec.name)
                ).items
                ready = [p for p in pods if p.status and p.status.phase != "Pending"]
                todo = [p for p in ready if p.metadata.uid not in self._done]
                if not todo:
                    if self._final.is_set():
                        return
                    self._halt.wait(REFOLLOW_PAUSE_SECONDS)
                    continue
                pod = todo[0]
                uid = pod.metadata.uid
                ended = _container_ended(pod)  # before the stream: all its lines are in it
                resumed = uid in self._places
                place = self._places.setdefault(uid, LogPlace())
                if resumed:
                    self._halt.wait(REFOLLOW_PAUSE_SECONDS)
                self._follow(pod.metadata.name, place)
                if ended:
                    self._done.add(uid)
            except Exception as exc:  # the log is a convenience; never fail the job over it
                log.debug("following worker-0 log: %s", exc)
                self._halt.wait(REFOLLOW_PAUSE_SECONDS)

    def _follow(self, pod_name: str, place: LogPlace) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        options: dict[str, Any] = {"follow": True, "timestamps": True}
        since = place.next_stream()
        if since is not None:
            options["since_seconds"] = since
        self.streams += 1
        resp = self.core.read_namespaced_pod_log(
            pod_name, self.spec.namespace, container=CONTAINER, _preload_content=False, **options
        )
        try:
            for raw in iter_resp_lines(resp):
                if self._halt.is_set():
                    return
                stamp, line = split_stamp(raw)
                if not place.is_new(stamp):
                    continue
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


def _container_ended(pod: Any) -> bool:
    """Whether the pod's trainer container has terminated (or the pod has ended)."""
    if pod.status.phase in ("Succeeded", "Failed"):
        return True
    for status in pod.status.container_statuses or []:
        if status.name == CONTAINER and status.state and status.state.terminated:
            return True
    return False
