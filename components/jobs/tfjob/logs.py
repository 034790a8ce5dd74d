"""Worker 0's log, streamed from its pods into the train step's log while the TFJob runs.

A follow stream can end while its container runs on: an idle timeout in a proxy or load
balancer between here and the API server, the kubelet's 4-hour write timeout on its HTTP server
(pkg/kubelet/server/server.go), a broken API-server-to-kubelet connection, which the API server
ends cleanly (apiserver handlers/responsewriters/writers.go, `StreamObject`: `io.Copy`, its
error dropped), at the end of a line or in its middle. So how a stream ended says nothing: a
container is done once the listing showed it stopped (terminated, or waiting to be restarted)
and then a stream was quiet: it brought again all it replays and nothing new, and ended where
the one before did (`LogPlace.stream_ended`), which costs one more request per container.
Until then the follower asks again from shortly before the last line it wrote, as
`kubectl logs -f` does not:

- with `timestamps=true`, the kubelet puts each line's time in front of it (RFC3339NanoFixed and
  a space: pkg/kubelet/kuberuntime/logs/logs.go, `logWriter.write`), and `sinceTime` (the node's
  own clock, so no skew, lag or suspended laptop in between) skips lines stamped before it
  (`NewLogOptions`);
- the lines it brings again are recognised by their text and stamp among the last ones written,
  in order, and skipped: stdout and stderr lines can reach the log file slightly out of their
  stamps' order (containerd copies each stream in its own goroutine), so lines are matched, not
  compared by time. A line the runtime wrote as several records comes again as its end: the
  kubelet skips records, not lines, stamped before `sinceTime`.

What this cannot tell from the log's end: a stream ended early exactly where its replay ends,
right after another stream ended early.

A line the container left unfinished when it stopped (its last output without a newline: the
runtime's partial record, which the kubelet writes without one, `parseCRILog`) ends the stream
with no newline after it. It is written once the container is done, where `kubernetes.watch`'s
`iter_resp_lines` would drop it; until then each stream brings it again (finished, if the
container went on).

Progress is kept per container (the pod's uid and the runtime's container ID), so a pod the
operator recreates under the same name, and a container the kubelet restarts in place
(restartPolicy OnFailure), are each followed from their start. A container with no ID yet (or
none any more) is not asked for: the kubelet would serve an earlier container's log for it.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import logging
import re
import threading
from collections.abc import Iterator
from typing import Any, TextIO

from components.jobs import kube
from components.jobs.spec import JobSpec
from components.jobs.tfjob.manifest import CONTAINER, worker0_selector

log = logging.getLogger(__name__)

RESUME_BACK_SECONDS = 2  # sinceTime this long before the last line: out-of-order stamps
RECENT_LINES = 4096  # lines kept to recognise in a resumed stream
PAUSE_SECONDS = 0.5  # between streams of one container, and between listings with nothing new
FINAL_PAUSE_SECONDS = 0.2  # the same once the job has ended (finish)
MAX_BACKOFF_SECONDS = 30.0  # the longest wait after failed requests in a row
BACKOFF_DOUBLINGS = 6  # of PAUSE_SECONDS, at most: 32 s, capped to MAX_BACKOFF_SECONDS
RESTLESS_STREAMS = 3  # streams after the stop, nothing new, not quiet: the last counts as quiet
CONNECT_SECONDS, SILENT_SECONDS = 30, 600  # the stream's timeouts: a silent one is asked again
# The media types of read_namespaced_pod_log (core_v1_api.py); the client picks JSON of them.
# The API server negotiates a log request's Accept against JSON, YAML and protobuf before it
# streams, so text/plain alone is refused with 406 (kubernetes/kubernetes#61450).
_LOG_ACCEPT = [
    "text/plain",
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
]
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


def _lines(resp: Any) -> Iterator[tuple[str, bool]]:
    """The lines of a log response as (line, finished), as `kubernetes.watch`'s
    `iter_resp_lines` splits them (UTF-8, invalid bytes replaced, empty lines skipped), and then
    what followed the last newline, if anything, with finished False."""
    buffer = bytearray()
    for chunk in resp.stream(amt=None, decode_content=False):
        data = chunk.encode() if isinstance(chunk, str) else chunk
        buffer.extend(data)
        if b"\n" not in data:
            continue
        *complete, rest = buffer.split(b"\n")
        buffer = bytearray(rest)
        for line in complete:
            if line:
                yield line.decode("utf-8", errors="replace"), True
    if buffer:
        yield buffer.decode("utf-8", errors="replace"), False


class LogPlace:
    """How far one container's log has been written: the latest stamp seen, how many lines, and
    the last RECENT_LINES of them as they came (stamp included), to skip when a resumed stream
    brings them again."""

    def __init__(self, pod: str = "") -> None:
        self.pod = pod  # the name of the container's pod, which prefixes its lines
        self.latest: tuple[int, int] | None = None
        self.written = 0
        self.recent: collections.deque[str] = collections.deque(maxlen=RECENT_LINES)
        self._replay: list[str] | None = None
        self._at = 0
        self._unstamped = 0  # lines of a resumed whole-log stream (no stamps) still to skip
        self._oldest: tuple[int, int] | None = None  # the stamp of recent[0] at the stream's start
        self.ended = False  # whether the container is done: stopped, and then a quiet stream
        self.unfinished: str | None = None  # the line the last stream ended on, not yet written
        self.restless = 0  # streams in a row after the stop, nothing new, not quiet
        self.clean_ends = 0  # streams of this container that ended cleanly
        self._start: tuple[int, str | None] = (0, None)  # `written`, `unfinished` at its start

    def next_stream(self) -> str | None:
        """Start a stream: its `sinceTime` (None: the whole log, the first time or where the
        server gave no stamps)."""
        self._start = (self.written, self.unfinished)
        if self.latest is None:  # the whole log again: skip as many lines as were written
            self._replay, self._unstamped = None, self.written
            return None
        self._replay, self._at, self._unstamped = (list(self.recent) or None), 0, 0
        self._oldest = split_stamp(self.recent[0])[0] if self.recent else None
        start = dt.datetime.fromtimestamp(self.latest[0] - RESUME_BACK_SECONDS, dt.UTC)
        return start.strftime("%Y-%m-%dT%H:%M:%SZ")

    @property
    def brought_new(self) -> bool:
        """Whether the current stream has brought a line not written before."""
        return self.written != self._start[0]

    @property
    def caught_up(self) -> bool:
        """Whether the current stream has brought again every line it replays."""
        return self._replay is None and self._unstamped == 0

    def stream_ended(self) -> bool:
        """After a stream of a container that had stopped ended cleanly: whether it was quiet,
        bringing again all it replays, no line not written before, and ending where the one
        before did, so that the container is done. After RESTLESS_STREAMS streams in a row
        that brought nothing new but were not quiet (a server that keeps ending streams early
        at the same few places, a log rotated away), the last counts as quiet."""
        if self.brought_new:
            self.restless = 0
            return False
        if self.caught_up and self.unfinished == self._start[1] and self.clean_ends > 1:
            return True  # (a first stream's end has no stream before it to agree with)
        self.restless += 1
        return self.restless >= RESTLESS_STREAMS

    def is_new(self, raw: str) -> bool:
        """Whether a line of the current stream was not written before (and note it if so)."""
        if self._unstamped > 0:
            self._unstamped -= 1
            return False
        if self._replay is not None:
            found = self._replayed(raw, self._replay)
            if found is None:
                stamp, oldest = split_stamp(raw)[0], self._oldest
                if stamp is not None and oldest is not None and stamp <= oldest:
                    return False  # before every line remembered: written, and forgotten since
                self._replay = None  # the first line not written before: the rest are new too
            else:
                self._at = found + 1
                if self._at == len(self._replay):
                    self._replay = None
                return False
        self.record(raw)
        return True

    def _replayed(self, raw: str, replay: list[str]) -> int | None:
        """Where in `replay`, from the current place on, the stream's line `raw` was written
        before: the same line, or its end. A line the runtime split into records (over its
        buffer, 16 KiB in containerd; a progress bar's pieces) comes again without those
        stamped before sinceTime: the kubelet filters records, not lines (logs.go `write`)."""
        with contextlib.suppress(ValueError):
            return replay.index(raw, self._at)
        return next((i for i in range(self._at, len(replay)) if replay[i].endswith(raw)), None)

    def record(self, raw: str) -> None:
        """Note `raw` as written."""
        self.recent.append(raw)
        self.written += 1
        stamp, _ = split_stamp(raw)
        if stamp is not None and (self.latest is None or stamp > self.latest):
            self.latest = stamp


class LogFollower(threading.Thread):
    """Streams worker 0's log into `out`: each container of each of its pods (a restart is a
    new pod, or a new container in the same one) from its first line to its last, each once."""

    def __init__(self, core: Any, spec: JobSpec, out: TextIO, tail_lines: int) -> None:
        super().__init__(name=f"logs-{spec.name}", daemon=True)
        self.core, self.spec, self.out = core, spec, out
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self._halt = threading.Event()
        self._final = threading.Event()
        self._wake = threading.Event()  # ends a pause: set by finish and stop
        self._places: dict[tuple[str, str], LogPlace] = {}
        self._said: set[str] = set()

    def run(self) -> None:
        pause, failures = 0.0, 0
        while not self._halt.is_set():
            if pause:
                self._pause(pause)
            try:
                pods = self.core.list_namespaced_pod(
                    self.spec.namespace, label_selector=worker0_selector(self.spec.name)
                ).items
                todo = self._todo(pods)
                if not todo:
                    if self._final.is_set():
                        self._write_unfinished_lines()
                        return
                    pause = PAUSE_SECONDS
                    continue
                name, key, stopped = todo[0]
                place = self._places.get(key)
                if place is None:
                    place = self._places[key] = LogPlace(name)
                how = self._follow(name, place)
                if how == "ended" and stopped and place.stream_ended():
                    place.ended = True
                    self._write_unfinished(place)
                if how == "dropped" and not place.brought_new:
                    failures += 1  # a stream that breaks at once, again and again: back off
                else:
                    failures = 0
                pause = 0.0 if stopped and not failures else PAUSE_SECONDS
            except Exception as exc:  # the log is a convenience; never fail the job over it
                if getattr(exc, "status", None) in (401, 403):
                    self._note(exc, "not allowed: `get` on pods/log (deploy/rbac.yaml grants it)")
                    return  # for good: it will not stream
                if self._final.is_set():  # the job has ended: no waiting out a failing server
                    self._write_unfinished_lines()
                    return
                failures += 1
                pause = PAUSE_SECONDS
                self._note(exc)
            pause = min(pause * 2 ** min(failures, BACKOFF_DOUBLINGS), MAX_BACKOFF_SECONDS)

    def _todo(self, pods: list[Any]) -> list[tuple[str, tuple[str, str], bool]]:
        """(pod name, container key, whether it has stopped) of each container to ask for."""
        todo = []
        for pod in pods:
            key, stopped = _container(pod)
            if key is None:
                continue
            place = self._places.get(key)
            if place is not None and place.ended:  # done: all of its log came
                continue
            todo.append((pod.metadata.name, key, stopped))
        return todo

    def _pause(self, seconds: float) -> None:
        if self._final.is_set():  # the job has ended: its pods' last lines are due
            self._halt.wait(min(seconds, FINAL_PAUSE_SECONDS))
        else:
            self._wake.wait(seconds)

    def _follow(self, pod_name: str, place: LogPlace) -> str:
        """Write the container's new lines as they come, until the stream ends ("ended"; a
        line it ends on without a newline is kept as `place.unfinished`, not written), breaks
        ("dropped": said once), stays silent for SILENT_SECONDS ("silent") or the follower is
        stopped ("halted")."""
        from urllib3.exceptions import ProtocolError, ReadTimeoutError

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
        api = self.core.api_client
        resp = api.call_api(
            "/api/v1/namespaces/{namespace}/pods/{name}/log",
            "GET",
            {"namespace": self.spec.namespace, "name": pod_name},
            query,
            {"Accept": api.select_header_accept(_LOG_ACCEPT)},
            response_type="str",
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _preload_content=False,
            _request_timeout=(CONNECT_SECONDS, SILENT_SECONDS),
        )
        tail, how = None, "ended"
        try:
            for raw, finished in _lines(resp):
                if self._halt.is_set():
                    return "halted"
                if not finished:
                    tail = raw  # the stream's end: kept, written once the container is done
                elif place.is_new(raw):
                    self._write(pod_name, raw)
        except ReadTimeoutError:  # nothing for SILENT_SECONDS: ask again, as after a cut
            how = "silent"
        except ProtocolError as exc:
            self._note(exc)
            how = "dropped"
        finally:  # as kubernetes.watch.Watch.stream ends its responses
            resp.close()
            resp.release_conn()
        if how == "ended":
            place.clean_ends += 1
        if how == "ended" and place.caught_up:
            place.unfinished = tail
        elif place.brought_new:
            place.unfinished = None  # lines came after the one the last stream ended on
        # else: it ended inside the lines it brings again (what it ended on is a piece of
        # one of them), broke or went silent: it says nothing of the log's last line
        return how

    def _write(self, pod_name: str, raw: str) -> None:
        if self._halt.is_set():  # stopped: the launcher writes on its own now
            return
        _, line = split_stamp(raw)
        self.tail.append(line)
        self.out.write(f"[{pod_name}] {line}\n")
        self.out.flush()

    def _write_unfinished(self, place: LogPlace) -> None:
        """Write the line the container's last stream ended on, if new: the container is done,
        or nothing more will be asked of it."""
        raw, place.unfinished = place.unfinished, None
        if raw is not None and raw not in place.recent:  # never written, whatever is replayed
            place.record(raw)
            self._write(place.pod, raw)

    def _write_unfinished_lines(self) -> None:
        """As the job ends: the unfinished last lines of containers not done (a pod deleted
        before a quiet stream, a server that failed), as the streams left them."""
        for place in self._places.values():
            if not place.ended:
                self._write_unfinished(place)

    def _note(self, exc: Exception, what_now: str = "trying again") -> None:
        """Say once per kind of failure that the log could not be followed, and what next."""
        what = kube.api_error_brief(exc)
        log.debug("following worker-0 log: %s", exc)
        if what not in self._said and not self._halt.is_set():
            self._said.add(what)
            self.out.write(f"[logs] worker 0's log stream: {what}; {what_now}\n")
            self.out.flush()

    def finish(self, timeout: float) -> None:
        """Let the current stream drain (the pod has ended), then stop."""
        self._final.set()
        self._wake.set()
        self.join(timeout)
        self.stop()

    def stop(self) -> None:
        """Stop writing. A stream still open is left to end with its pod: closing a response
        another thread is reading blocks on the reader's lock."""
        self._halt.set()
        self._wake.set()


def _container(pod: Any) -> tuple[tuple[str, str] | None, bool]:
    """The pod's trainer container as (pod uid, the runtime's container ID), None while it has
    no ID; and whether it has stopped (not running, or the pod has ended)."""
    if pod.status is None:  # not yet given one
        return None, False
    ended = pod.status.phase in ("Succeeded", "Failed")
    for status in pod.status.container_statuses or []:
        if status.name == CONTAINER:
            # Waiting (CrashLoopBackOff) counts as stopped: the ID is still the last container's
            stopped = ended or not (status.state and status.state.running)
            return (
                (pod.metadata.uid, status.container_id) if status.container_id else None
            ), stopped
    return None, ended
