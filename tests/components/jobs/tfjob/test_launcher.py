"""The TFJob launcher against an HTTP double of the Kubernetes API with a scripted operator,
deleting a run's jobs, and counting restarts from the pods."""

from __future__ import annotations

import io
import re
import signal
import time
from typing import Any

import pytest
from kubernetes import client as kubernetes_client

from components.jobs import follow
from components.jobs.errors import LaunchCancelled, LaunchError, LaunchTimeout
from components.jobs.spec import JobSpec
from components.jobs.tfjob import cleanup, manifest
from components.jobs.tfjob import launcher as tfjob
from components.jobs.tfjob import logs as tfjob_logs
from components.jobs.tfjob import status as tfjob_status
from components.jobs.tfjob.restarts import RestartLedger
from contracts import termination
from contracts.errors import UserError
from contracts.params import TrainJob
from tests.components.jobs.tfjob.specs import make_spec
from tests.doubles.kubernetes.apiserver import IMAGE_DIGEST, FakeKube, scenarios
from tests.doubles.kubernetes.crd_schema import SCHEMA, schema_errors
from tests.doubles.kubernetes.scenarios import Script, Step
from tests.doubles.kubernetes.store import Cluster

JOB_PATH = "/apis/kubeflow.org/v1/namespaces/ml/tfjobs/train-run-1"

# -- the launcher against the Kubernetes API double --


def follows(kube: FakeKube, worker: int) -> list[Any]:
    """The follow requests for worker `worker`'s log so far."""
    logs = kube.calls("GET", f"-worker-{worker}/log")
    return [r for r in logs if r.query.get("follow", "").lower() == "true"]


def await_follows(c: Script, kube: FakeKube, worker: int, count: int) -> None:
    """A scenario step: wait until the launcher has asked to follow the log `count` times.
    If it never does, the worker fails with a line saying so, which fails the job and the
    test (an assertion here would end only the scenario's thread, and the launcher would wait
    for the job forever)."""
    until = time.monotonic() + 120  # only a hung launcher reaches it
    while len(follows(kube, worker)) < count:
        if time.monotonic() > until:
            c.log(worker, f"the launcher followed the log {len(follows(kube, worker))} times")
            c.exit(worker, 1)
            return
        time.sleep(0.01)


def run_tfjob(kube: FakeKube, spec: JobSpec | None = None, **kwargs: Any) -> Any:
    out = io.StringIO()
    launcher = tfjob.TFJobLauncher(kube.api_client(), out=out, poll_seconds=5)
    try:
        return launcher.run(spec or make_spec(), **kwargs), out.getvalue()
    finally:
        kube.output = out.getvalue()  # for asserts after an exception


def test_success_reports_gpu_hours_digests_and_streams_worker0_log():
    with FakeKube(scenarios.success()) as kube:
        result, out = run_tfjob(kube)
    # 2 workers x 1 GPU x 1800 s (the operator's startTime to completionTime) / 3600
    assert result.gpu_hours == pytest.approx(1.0)
    assert result.wall_seconds == pytest.approx(1800)
    assert (result.attempts, result.restarts, result.reattached) == (1, 0, False)
    assert result.image_digests == {
        "train-run-1-worker-0": IMAGE_DIGEST,
        "train-run-1-worker-1": IMAGE_DIGEST,
    }
    assert "[train-run-1-worker-0] step 2 loss 3.1" in out
    (post,) = kube.calls("POST")
    assert schema_errors(post.body, SCHEMA) == []
    assert not kube.calls("DELETE")  # a finished job is left to ttlSecondsAfterFinished


@pytest.mark.slow
def test_a_cut_log_stream_is_followed_again_from_where_it_stopped():
    # A proxy's idle timeout drops the follow stream twice while worker 0 runs on, and the API
    # server ends it cleanly twice (its leg to the kubelet broke): each line still reaches the
    # step's log once, in order, the later streams from shortly before the last line written
    # (timestamps and sinceTime, as tfjob_logs asks the kubelet).
    # Each line after the first is written once the launcher has followed again after the
    # previous one: an event, not a pause, so a busy machine cannot merge them into one stream.
    lines = [f"step {i} loss {5 - i / 10:.1f}" for i in range(1, 7)]
    paced: list[Any] = []
    for i, line in enumerate(lines, start=1):
        if i > 1:
            paced.append(lambda c, i=i: await_follows(c, kube, 0, min(i, 5)))
        paced.append(lambda c, line=line: c.log(0, line))
    steps = scenarios.success()
    with FakeKube([*steps[:3], *paced, *steps[4:]]) as kube:
        kube.cut_follows, kube.end_follows = 2, 2  # dropped twice, then ended twice
        _, out = run_tfjob(kube)
    worker0 = [x for x in out.splitlines() if x.startswith("[train-run-1-worker-0] ")]
    assert worker0 == [f"[train-run-1-worker-0] {line}" for line in lines]
    streams = follows(kube, 0)
    assert len(streams) >= 5 and kube.cut_follows == kube.end_follows == 0
    assert all(r.query.get("timestamps", "").lower() == "true" for r in streams)
    assert "sinceTime" not in streams[0].query  # the first from the start
    assert all(r.query["sinceTime"].endswith("Z") for r in streams[1:])
    assert out.count("worker 0's log stream: ProtocolError; trying again") == 1  # said once


def test_a_last_line_without_newline_is_written():
    # The worker's last output has no newline (a partial record: the kubelet serves it without
    # one) and the container exits: the line reaches the step's log all the same, once.
    steps = scenarios.success()
    steps[3] = lambda c: c.log(0, "step 1 loss 4.2", unfinished="fatal: NCCL timeout")
    with FakeKube(steps) as kube:
        _, out = run_tfjob(kube)
    worker0 = [x for x in out.splitlines() if x.startswith("[train-run-1-worker-0] ")]
    assert worker0 == [
        "[train-run-1-worker-0] step 1 loss 4.2",
        "[train-run-1-worker-0] fatal: NCCL timeout",
    ]
    # Written once a stream after the exit brought nothing new (LogPlace.stream_ended).
    assert len(follows(kube, 0)) >= 2


@pytest.mark.slow
def test_a_line_unfinished_when_a_stream_ends_is_written_once_finished():
    # The worker writes part of a line (no newline yet) and the API server ends the stream
    # there while the container runs on; the next stream brings the line again, finished.
    steps = scenarios.success()
    steps[3:4] = [
        lambda c: c.log(0, "step 1 loss 4.2", unfinished="step 2 lo"),
        lambda c: await_follows(c, kube, 0, 2),  # that stream ended; the launcher followed again
        lambda c: c.log(0, "ss 3.1"),  # the runtime's next record: the rest of the line
    ]
    with FakeKube(steps) as kube:
        kube.end_follows = 1
        _, out = run_tfjob(kube)
    worker0 = [x for x in out.splitlines() if x.startswith("[train-run-1-worker-0] ")]
    assert len(worker0) == 2 and worker0[0] == "[train-run-1-worker-0] step 1 loss 4.2"
    # The one line, with the second record's stamp inside it, as the kubelet serves a line the
    # runtime split (each record stamped): not "step 2 lo" on a line of its own.
    assert worker0[1].startswith("[train-run-1-worker-0] step 2 lo") and worker0[1].endswith(
        "Z ss 3.1"
    )


def follow_stopped_worker0(
    kube: FakeKube,
    records: list[tuple[str, bool]],
    core: Any = None,
    seconds: list[float] | None = None,
) -> tuple[list[str], int]:
    """Follow the log of a worker-0 pod whose container has already exited, holding `records`
    ((text, partial) each, stamped now or `seconds` from now), until the follower is done: the
    lines written, and how many follow streams it took."""
    from kubernetes import client as k8s

    spec = make_spec()
    cluster = kube.cluster
    with cluster.cond:
        cluster.add_job(manifest.build_manifest(spec))
    worker0 = Script(cluster)
    worker0.create_pods()
    worker0.exit(0, 1)
    with cluster.cond:
        log = cluster.logs[worker0.pod(0)["metadata"]["uid"]]
        for text, partial in records:
            log.append(text, partial)
        if seconds is not None:
            start = time.time_ns()
            log.stamps[:] = [start + int(x * 1e9) for x in seconds]
    out = io.StringIO()
    core = core or k8s.CoreV1Api(kube.api_client())
    follower = tfjob_logs.LogFollower(core, spec, out, 10)
    follower.start()
    follower.finish(timeout=20)
    assert not follower.is_alive()
    prefix = f"[{spec.name}-worker-0] "
    return [x.removeprefix(prefix) for x in out.getvalue().splitlines()], len(follows(kube, 0))


LINES = [("step 1 loss 4.2", False), ("step 2 loss 3.1", False), ("done", False)]


def test_a_stopped_workers_log_is_done_after_a_quiet_stream():
    with FakeKube() as kube:
        written, streams = follow_stopped_worker0(kube, LINES)
    assert written == [text for text, _ in LINES]
    assert streams == 2  # the log, then one that brings nothing new


def width(*texts: str) -> int:
    """Characters the kubelet serves for these lines under timestamps=true: a 30-character
    RFC3339NanoFixed stamp and a space before each, a newline after."""
    return sum(31 + len(text) + 1 for text in texts)


L1, L2, L3 = (text for text, _ in LINES)


@pytest.mark.slow
@pytest.mark.parametrize(
    "ends_at",
    [
        [0],  # before its first line
        [-4],  # inside the last line
        [width(L1)],  # after the first line
        [-4, width(L1)],  # then the second ends at a line inside the lines it brings again
        [width(L1, L2), width(L1)],  # the same, after ending between lines
        [width(L1, L2), width(L1) + 5],  # then the second ends in a line it brings again
    ],
)
def test_a_stopped_workers_stream_ended_early_is_asked_again_for_the_rest(ends_at):
    # The API server's leg to the kubelet breaks in the middle of a line, or between two, and
    # it ends the stream cleanly: the follower asks again and writes the rest, each line once.
    with FakeKube() as kube:
        kube.end_follows_at = list(ends_at)
        written, streams = follow_stopped_worker0(kube, LINES)
        assert kube.end_follows_at == []
    assert written == [L1, L2, L3]
    assert streams == 2 + len(ends_at)  # cut short, the rest, then a quiet one


@pytest.mark.parametrize(
    "ends",
    [
        {},
        {"end_follows_at": [-4]},  # the first stream ends inside that line
        {"end_follows": 1, "end_follows_at": [-4]},  # then the second does
    ],
)
def test_a_stopped_workers_unfinished_last_line_is_written_once(ends):
    # Written once a stream ended on the same line as the one before, not on a piece of it.
    with FakeKube() as kube:
        for name, value in ends.items():
            setattr(kube, name, value)
        written, streams = follow_stopped_worker0(kube, [LINES[0], ("fatal: NCCL timeout", True)])
    assert written == [L1, "fatal: NCCL timeout"]
    assert streams == 2 + len(ends)


class AfterStreams:
    """The official client, except that once the log has been asked for `streams` times,
    worker 0's pod is no longer listed (it was deleted), or listing fails (the API server is
    down)."""

    def __init__(self, kube: FakeKube, after: str, streams: int = 1) -> None:
        from kubernetes import client as k8s

        self.kube, self.after, self.streams = kube, after, streams
        self.real = k8s.CoreV1Api(kube.api_client())
        self.api_client = self.real.api_client

    def list_namespaced_pod(self, *args: Any, **kwargs: Any) -> Any:
        listed = self.real.list_namespaced_pod(*args, **kwargs)
        if len(self.kube.calls("GET", "-worker-0/log")) >= self.streams:
            if self.after == "API server down":
                raise ConnectionError("the API server is down")
            listed.items = []
        return listed


@pytest.mark.parametrize("after", ["pod deleted", "API server down"])
def test_an_unfinished_last_line_is_written_as_the_job_ends_before_a_quiet_stream(after):
    with FakeKube() as kube:
        records = [LINES[0], ("fatal: NCCL timeout", True)]
        written, streams = follow_stopped_worker0(kube, records, AfterStreams(kube, after))
    assert [x for x in written if not x.startswith("[logs]")] == [L1, "fatal: NCCL timeout"]
    assert streams == 1


def test_the_unfinished_last_line_outlives_a_stream_ended_in_the_lines_it_brings_again():
    with FakeKube() as kube:
        kube.end_follows, kube.end_follows_at = 1, [width(L1) - 10]
        follower = AfterStreams(kube, "pod deleted", streams=2)
        records = [LINES[0], ("fatal: NCCL timeout", True)]
        written, streams = follow_stopped_worker0(kube, records, follower)
    assert written == [L1, "fatal: NCCL timeout"] and streams == 2


def test_a_line_split_into_records_comes_again_as_its_end_and_is_not_written_twice():
    # A progress line the runtime wrote in two records 4 s apart, each stamped: a stream
    # resumed from sinceTime (2 s before the last line written) brings only its second record,
    # as the kubelet filters records, not lines (logs.go `write`).
    records = [(L1, False), ("progress 10%", True), (" 100%", False), ("eval", False), (L3, False)]
    with FakeKube() as kube:
        kube.end_follows_at = [-4]  # the first stream ends inside the last line
        written, _ = follow_stopped_worker0(kube, records, seconds=[0, 1, 5, 6, 6.5])
    assert len(written) == 4 and (written[0], written[2], written[3]) == (L1, "eval", L3)
    assert written[1].startswith("progress 10%") and written[1].endswith("Z  100%")


def test_a_piece_of_a_line_brought_again_is_not_written_as_the_job_ends():
    # The second stream ends inside a line it brings again, then the pod goes: what that
    # stream ended on is a piece of a line already written, not the log's last line.
    with FakeKube() as kube:
        kube.end_follows_at = [width(L1, L2), width(L1) + 35]
        follower = AfterStreams(kube, "pod deleted", streams=2)
        written, streams = follow_stopped_worker0(kube, LINES, follower)
    assert written == [L1, L2] and streams == 2  # the pod went before the rest was asked for


def test_log_lines_split_as_the_client_does_and_keep_what_follows_the_last_newline():
    class Response:
        def __init__(self, *chunks: bytes) -> None:
            self.chunks = chunks

        def stream(self, amt: Any = None, decode_content: bool = False) -> Any:
            return iter(self.chunks)

    # Lines across chunks, an empty line, a character split between chunks, an invalid byte.
    chunks = (b"ste", b"p 1\n\nst", b"ep 2 \xe2\x9c", b"\x93\n\xff", b"50%")
    expected = [("step 1", True), ("step 2 \u2713", True), ("\ufffd50%", False)]
    assert list(tfjob_logs._lines(Response(*chunks))) == expected
    assert list(tfjob_logs._lines(Response(b"a\n"))) == [("a", True)]
    assert list(tfjob_logs._lines(Response())) == []


def test_no_right_to_read_logs_is_said_once_and_not_asked_again():
    with FakeKube(scenarios.success()) as kube:
        kube.forbid_logs = True
        result, out = run_tfjob(kube)  # the job itself succeeds
    assert result.attempts == 1
    assert out.count("403 Forbidden; not allowed: `get` on pods/log") == 1
    assert len(kube.calls("GET", "-worker-0/log")) == 1


def test_which_containers_are_asked_for_and_which_have_stopped():
    from kubernetes import client as k8s

    def pod(state: dict[str, Any], container_id: str = "containerd://abc") -> Any:
        status = k8s.V1ContainerStatus(
            name="tensorflow",
            container_id=container_id,
            state=k8s.V1ContainerState(**state),
            image="i",
            image_id="d",
            ready=False,
            restart_count=0,
        )
        return k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(uid="u1"),
            status=k8s.V1PodStatus(phase="Running", container_statuses=[status]),
        )

    running = {"running": k8s.V1ContainerStateRunning()}
    waiting = {"waiting": k8s.V1ContainerStateWaiting(reason="CrashLoopBackOff")}
    ended = {"terminated": k8s.V1ContainerStateTerminated(exit_code=1)}
    assert tfjob_logs._container(pod(running)) == (("u1", "containerd://abc"), False)
    assert tfjob_logs._container(pod(waiting)) == (("u1", "containerd://abc"), True)
    assert tfjob_logs._container(pod(ended)) == (("u1", "containerd://abc"), True)
    assert tfjob_logs._container(pod(running, container_id=""))[0] is None  # not asked for
    assert tfjob_logs._container(k8s.V1Pod(metadata=k8s.V1ObjectMeta(uid="u2"))) == (None, False)


def test_the_jobs_end_cuts_a_back_off_short(monkeypatch):
    # The API server is down while the job ends: the follower, waiting out its back-off, tries
    # once more when finish() comes, and stops (not after the 20 s pause, nor the join's 3 s).
    monkeypatch.setattr(tfjob_logs, "PAUSE_SECONDS", 10.0)
    lists: list[int] = []

    class Down:
        def list_namespaced_pod(self, *args: Any, **kwargs: Any) -> Any:
            lists.append(1)
            raise ConnectionError("the API server is down")

    out = io.StringIO()
    follower = tfjob_logs.LogFollower(Down(), make_spec(), out, 10)
    follower.start()
    while not lists:
        time.sleep(0.01)
    follower.finish(timeout=3)
    assert not follower.is_alive()
    assert len(lists) == 2
    assert out.getvalue() == "[logs] worker 0's log stream: ConnectionError; trying again\n"


def _written(place: tfjob_logs.LogPlace, *streams: list[str]) -> list[str]:
    """What the follower writes of these streams of one container, one after another."""
    written = []
    for stream in streams:
        place.next_stream()
        written += [tfjob_logs.split_stamp(raw)[1] for raw in stream if place.is_new(raw)]
    return written


def test_a_resumed_stream_skips_the_lines_already_written_and_no_others(monkeypatch):
    t = "2026-12-01T10:00:0{}.{:09d}Z {}".format
    # stderr's line stamped before stdout's reaches the file after it (containerd copies each
    # stream in its own goroutine): both are written, and again only once after the cut.
    first = [t(1, 200, "a"), t(1, 100, "b (stderr)"), t(1, 200, "c")]
    again = [*first, t(1, 200, "c2"), t(2, 0, "d")]  # from sinceTime: a suffix, then new lines
    place = tfjob_logs.LogPlace()
    assert _written(place, first, again) == ["a", "b (stderr)", "c", "c2", "d"]
    assert place.next_stream() == "2026-12-01T10:00:00Z"  # the latest stamp (d's), less 2 s
    # More lines since sinceTime than are remembered: those before the oldest one are old too.
    monkeypatch.setattr(tfjob_logs, "RECENT_LINES", 2)
    small = tfjob_logs.LogPlace()
    old = [t(i, 0, f"line {i}") for i in range(4)]
    assert _written(small, old, [*old, t(5, 0, "new")]) == [*(f"line {i}" for i in range(4)), "new"]
    # A server that gives no stamps: the whole log again, the lines written skipped by count.
    plain = tfjob_logs.LogPlace()
    assert _written(plain, ["x", "y"], ["x", "y", "y", "z"]) == ["x", "y", "y", "z"]
    assert plain.next_stream() is None


def test_split_stamp_reads_the_kubelets_prefix():
    assert tfjob_logs.split_stamp("no stamp here") == (None, "no stamp here")
    stamp, text = tfjob_logs.split_stamp("2026-12-01T11:00:00.5+01:00 x y")
    assert (stamp, text) == ((1796119200, 500_000_000), "x y")
    assert tfjob_logs.split_stamp("2026-12-01T10:00:00.000000000Z ") == ((1796119200, 0), "")


def test_failure_carries_reason_exit_code_and_last_log_lines():
    with FakeKube(scenarios.failure(index=1, code=1)) as kube, pytest.raises(LaunchError) as err:
        run_tfjob(kube)
    e = err.value
    assert e.reason == "TFJobFailed"
    assert (e.replica, e.exit_code) == ("worker-1", 1)
    assert e.log_tail[-1] == "ValueError: bad shard"
    message = str(e)
    assert "has failed because 1 Worker replica(s) failed" in message
    assert "exit code: 1" in message and "ValueError: bad shard" in message
    assert not kube.calls("DELETE")


def test_restarting_then_success_succeeds_and_counts_the_restart():
    """Worker 1 is killed, worker 0 loses it and exits 143: two failed pods, one restart."""
    with FakeKube(scenarios.restart_then_success(index=1, code=137)) as kube:
        result, out = run_tfjob(kube)
        annotations = kube.cluster.tfjobs[("ml", "train-run-1")]["metadata"]["annotations"]
    assert (result.attempts, result.restarts) == (2, 1)
    assert "Restarting: TFJobRestarting" in out
    assert annotations["gptpipe.dev/restarts"] == "1"  # kept for a launcher that re-attaches


def test_restarts_past_backoff_limit_delete_the_job():
    """Under ExitCode the v1 operator ignores backoffLimit (kubeflow/trainer#2045)."""
    with FakeKube(scenarios.restart_then_success(times=3)) as kube:
        with pytest.raises(LaunchError) as err:
            run_tfjob(kube, make_spec(backoff_limit=1))
        assert err.value.reason == "BackoffLimitExceeded"
        assert kube.calls("DELETE", JOB_PATH)
        assert kube.cluster.tfjobs == {}


SIGKILL = "worker-1 exited with code 137 (SIGKILL: out of memory, or the node evicted it)"
SIGTERM = (
    "worker-0 exited with code 143 (SIGTERM or the trainer's retry: preempted, lost a peer "
    "worker, or an export failed)"
)


def _lost_and_recreated(c: Script) -> None:
    """Worker 1 is OOM-killed, worker 0 loses it, and the operator recreates both, all under
    the double's lock: no pod listing of the launcher can see the exits."""
    with c.cluster.cond:  # a Condition's lock is reentrant: each call below takes it again
        c.exit(1, 137, "OOMKilled")
        c.recreate_pod(1)
        c.exit(0, 143)
        c.recreate_pod(0)


def _recorded(restarts: int) -> Any:
    """A step that waits until the launcher has counted `restarts` (its annotation on the job):
    two restarts the launcher lists no pods between would count as one."""

    def step(c: Script) -> None:
        until = time.monotonic() + 60
        with c.cluster.cond:
            while time.monotonic() < until and c.cluster.job_key in c.cluster.tfjobs:
                annotations = c.job["metadata"].get("annotations") or {}
                if annotations.get("gptpipe.dev/restarts") == str(restarts):
                    return
                c.cluster.cond.wait(0.05)

    return step


def _restarts_seen_only_in_events(times: int) -> list[Any]:
    steps = [*scenarios.hang(), _recorded(0)]  # the first pods seen and recorded
    for restart in range(1, times + 1):
        steps += [
            _lost_and_recreated,
            lambda c: c.condition("Restarting"),
            lambda c: c.condition("Running"),
            _recorded(restart),
        ]
    return steps


@pytest.mark.fault("the apiserver answers 503 to the launcher's restart-count patch")
def test_a_restart_count_the_apiserver_failed_to_record_is_recorded_at_the_next_change():
    """The count is patched again at the next observation, not only at the next restart.

    The annotation is what a retried launcher counts from."""
    steps = [
        *scenarios.hang(),
        _recorded(0),  # the first pods seen and recorded
        lambda c: setattr(kube, "unavailable_patches", 1),
        _lost_and_recreated,  # seen at once: one change of the ledger, one patch, failing
        lambda c: c.condition("Restarting"),
        lambda c: c.condition("Running"),
        _recorded(1),
        *scenarios.success()[3:],
    ]
    kube = FakeKube(steps)
    with kube:
        result, out = run_tfjob(kube)
        annotations = kube.cluster.tfjobs[("ml", "train-run-1")]["metadata"]["annotations"]
    assert result.restarts == 1 and annotations["gptpipe.dev/restarts"] == "1"
    assert "could not record restarts on TFJob train-run-1: 503" in out


@pytest.mark.fault("a TFJob deleted while the launcher's watch connection was broken")
def test_a_job_deleted_while_the_watch_was_down_is_reported_as_deleted():
    def cut_then_delete(c: Script) -> None:
        with c.cluster.cond:  # the open watch breaks off before it could carry the deletion
            kube.cut_watches = 1
            c.cluster.delete_job(c.cluster.job_key, "Foreground")

    kube = FakeKube([*scenarios.hang(), cut_then_delete])
    with kube, pytest.raises(LaunchError) as err:
        run_tfjob(kube)
    assert err.value.reason == "Deleted"
    assert "TFJob ml/train-run-1 was deleted while running" in str(err.value)
    assert "API unavailable" in kube.output  # the broken watch, waited out, then the job gone


def _an_earlier_job_of_the_same_name(c: Script) -> None:
    """An event left on a deleted job of the same name (events live an hour): another uid."""
    earlier = {**c.job, "metadata": {**c.job["metadata"], "uid": "uid-of-an-earlier-job"}}
    with c.cluster.cond:
        message = "Pod: ml.train-run-1-worker-0 exited with code 139"
        c.recorder.event(earlier, "TFJob", "Normal", "ExitedWithCode", message)


def test_restarts_past_backoff_limit_name_the_exits_the_operator_recorded():
    """The operator deletes a failed pod in the reconcile that marks the job Restarting, so how
    it exited is left only in the operator's ExitedWithCode events on the job."""
    steps = [_an_earlier_job_of_the_same_name, *_restarts_seen_only_in_events(times=2)]
    with FakeKube(steps) as kube:
        with pytest.raises(LaunchError) as err:
            run_tfjob(kube, make_spec(backoff_limit=1))
        (listed,) = kube.calls("GET", "/api/v1/namespaces/ml/events")[-1:]
    e = err.value
    assert (e.reason, e.replica, e.exit_code) == ("BackoffLimitExceeded", "worker-1", 137)
    message = str(e)
    assert re.search(
        rf"worker exits: {re.escape(SIGKILL)} at \S+Z; {re.escape(SIGTERM)} at ", message
    )
    assert "code 139" not in message  # the earlier job's
    assert "failing replica: worker-1, exit code: 137" in message
    memory = f"each worker has {make_spec().memory} of memory (train_job.memory)"
    assert memory in message
    assert re.search(rf"restart 1; worker exits so far: {re.escape(SIGKILL)} at \S+; ", kube.output)
    assert kube.output.count("could not read") == 0
    uid_term, reason_term = listed.query["fieldSelector"].split(",")
    assert uid_term.startswith("involvedObject.uid=") and reason_term == "reason=ExitedWithCode"


def test_without_rights_to_events_the_error_still_says_what_it_knows():
    """A Role from before deploy/rbac.yaml granted `list` on events: said once."""
    with FakeKube(_restarts_seen_only_in_events(times=2)) as kube:
        kube.forbid_events = True
        with pytest.raises(LaunchError) as err:
            run_tfjob(kube, make_spec(backoff_limit=1))
    assert (err.value.reason, err.value.replica, err.value.exit_code) == (
        "BackoffLimitExceeded",
        None,
        None,
    )
    assert "worker exits" not in str(err.value) and "train_job.memory" not in str(err.value)
    said = "could not read TFJob train-run-1's events (403 Forbidden)"
    assert kube.output.count(said) == 1
    assert "; deploy/rbac.yaml grants list on events" in kube.output


def test_events_that_cannot_be_read_never_fail_a_job_that_succeeds(monkeypatch):
    """A diagnosis only: a reply the client cannot read (or any other fault) is said once, and
    the job's restart and success go on as before."""

    def unreadable(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("Invalid value for `involved_object`, must not be `None`")

    monkeypatch.setattr(kubernetes_client.CoreV1Api, "list_namespaced_event", unreadable)
    with FakeKube(scenarios.restart_then_success(times=2)) as kube:
        result, out = run_tfjob(kube)
    assert result.restarts == 2
    assert out.count("could not read TFJob train-run-1's events (ValueError)") == 1
    assert "rbac" not in out


def test_a_cancel_while_events_are_read_still_cancels_and_deletes_the_job(monkeypatch):
    """SIGTERM's LaunchCancelled is raised wherever the main thread is, the events call too:
    the diagnosis must not swallow it."""

    def cancelled(*args: Any, **kwargs: Any) -> Any:
        raise LaunchCancelled("received SIGTERM: the run was cancelled", reason="Cancelled")

    monkeypatch.setattr(kubernetes_client.CoreV1Api, "list_namespaced_event", cancelled)
    with FakeKube(scenarios.restart_then_success(times=1)) as kube:
        with pytest.raises(LaunchCancelled):
            run_tfjob(kube)
        assert kube.calls("DELETE", JOB_PATH)


def test_exits_come_from_events_newest_first_and_the_pod_listings_reason_wins():
    def event(message: str, second: int, reason: str = "ExitedWithCode") -> dict[str, Any]:
        return {
            "reason": reason,
            "message": message,
            "lastTimestamp": f"2025-01-01T00:00:0{second}Z",
        }

    events = [
        event("Pod: ml.train-worker-0 exited with code 143", 5),
        event("Pod: ml.train-worker-1 exited with code 137", 4),
        event(f"{'(combined from similar events): '}Pod: ml.train-worker-1 exited with code 1", 3),
        event("Pod: ml.train-worker-0 exited with code 0", 7),  # a success explains no failure
        event("Pod: ml.train-x-worker-0 exited with code 9", 8),  # job train-x's pod
        event("Created pod: train-worker-0", 9, reason="SuccessfulCreatePod"),
        event("Pod: ml.train-worker-1 exited with code 137", 1),  # the same exit, older
    ]
    recorded = tfjob_status.event_exits(events, "train")
    # The newest exit other than 143 first (143 is what the others do after a loss), then the
    # rest newest first; each (replica, code) once, at its latest time.
    assert [(e.replica, e.code, e.at) for e in recorded] == [
        ("worker-1", 137, "2025-01-01T00:00:04Z"),
        ("worker-1", 1, "2025-01-01T00:00:03Z"),
        ("worker-0", 143, "2025-01-01T00:00:05Z"),
    ]
    script = Script(Cluster())
    with script.cluster.cond:
        script.cluster.add_job(manifest.build_manifest(make_spec()))
    script.create_pods()
    script.exit(1, 1, "Error")
    state = tfjob_status.JobState(RestartLedger.from_annotations(2, {}))
    state.saw_exit(script.pod(1))
    state.saw_exit(script.pod(0))  # running: no exit
    finished = script.pod(1)["status"]["containerStatuses"][0]["state"]["terminated"]
    merged = tfjob_status.merge_exits(state.exits, recorded)
    assert [e.describe() for e in merged] == [  # the listing's exit is newer than the events'
        f"worker-1 exited with code 1 at {finished['finishedAt']}",
        "worker-1 exited with code 137 (SIGKILL: out of memory, or the node evicted it) "
        "at 2025-01-01T00:00:04Z",
        SIGTERM + " at 2025-01-01T00:00:05Z",
    ]
    oom = tfjob_status.WorkerExit("worker-1", 137, "OOMKilled", "2025-01-01T00:00:02Z")
    (first, *_) = tfjob_status.merge_exits([oom], recorded)  # seen in a listing, recorded later
    assert first.describe() == "worker-1 exited with code 137 (OOMKilled) at 2025-01-01T00:00:04Z"
    assert tfjob_status.utc_stamp("2025-01-01T01:00:04+01:00") == "2025-01-01T00:00:04Z"


def _past_a_limit(c: Script) -> None:
    """Worker 1 dies again; the operator, past runPolicy's backoff limit or deadline, deletes
    every pod first (common/job.go ReconcileJobs), so this exit gets no event."""
    with c.cluster.cond:
        c.exit(1, 137, recorded=False)
        for index in (0, 1):
            c.cluster.remove_pod(c.pod(index))


BACKOFF = "Job train-run-1 has failed because it has reached the specified backoff limit"
DEADLINE = "Job train-run-1 has failed because it was active longer than specified deadline"


@pytest.mark.parametrize(
    ("message", "error", "expected"),
    [
        (BACKOFF, LaunchError, ("BackoffLimitExceeded", "worker-1", 137)),  # the recorded exit
        (DEADLINE, LaunchTimeout, ("DeadlineExceeded", None, None)),  # no exit is the cause
    ],
)
def test_a_job_the_operator_failed_with_no_pod_left_names_the_recorded_cause(
    message, error, expected
):
    steps = [
        *_restarts_seen_only_in_events(times=1),
        _past_a_limit,
        lambda c: c.condition("Failed", message),
    ]
    with FakeKube(steps) as kube, pytest.raises(error) as err:
        run_tfjob(kube)
    e = err.value
    assert (e.reason, e.replica, e.exit_code) == expected
    assert ("failing replica: worker-1, exit code: 137" in str(e)) == (message == BACKOFF)


def test_worker0s_lines_beside_a_recorded_cause_are_said_to_be_worker0s():
    """With no pod left, the lines are worker 0's as it was followed: labelled so, and never
    read as the failing worker's own one-line input error."""
    cause = tfjob_status.WorkerExit("worker-1", 2)
    condition = {"reason": "TFJobFailed", "message": BACKOFF}
    tail = ["error: examples not found"]
    e = tfjob_status.failure_error(make_spec(), condition, None, tail, cause)
    assert type(e) is LaunchError and e.reason == "BackoffLimitExceeded"
    assert "failing replica: worker-1, exit code: 2" in str(e)
    assert "log lines of worker-0:\n  | error: examples not found" in str(e)


BAD_SHARD = "shard train-00001 is not a GZIP TFRecord file"
INPUT_ERROR = termination.encode(
    termination.TerminationMessage(termination.INPUT_ERROR, BAD_SHARD)
).decode()
FULL_DISK = (
    "no space left on device at gs://b/runs/r/model/Format-Serving/variables/v.data: a "
    "restart cannot mend this; free space there, or give the run a root with room"
)
PERMANENT_ERROR = termination.encode(
    termination.TerminationMessage(termination.PERMANENT_ERROR, FULL_DISK)
).decode()


@pytest.mark.fault("a worker exits permanently while its TFJob is Restarting")
@pytest.mark.parametrize(
    ("last_line", "code", "wrote", "reason"),
    [
        ("ValueError: bad shard", 2, "", "PermanentWorkerError"),
        # The trainer's exit 2 naming its bad input in its termination message (a user error,
        # no traceback), which the launcher turns into a WorkerInputError: the job must go all
        # the same.
        (f"error: {BAD_SHARD}", 2, INPUT_ERROR, "WorkerInputError"),
        # Its exit 3 naming a full disk, which no restart can mend.
        (f"error: {FULL_DISK}", 3, PERMANENT_ERROR, "WorkerPermanentError"),
    ],
    ids=["a traceback", "the trainer's input-error record", "the trainer's full-disk record"],
)
def test_permanent_exit_while_restarting_fails_and_deletes_the_job(last_line, code, wrote, reason):
    """The run fails naming the worker's exit, and the job is deleted, freeing its workers.

    The operator would keep it Restarting (kubeflow/trainer#2044)."""
    steps = [
        *scenarios.hang(),
        lambda c: c.log(1, last_line),
        lambda c: c.exit(1, code, wrote=wrote),
        lambda c: c.condition("Restarting"),
    ]
    with FakeKube(steps) as kube:
        with pytest.raises(LaunchError) as err:
            run_tfjob(kube)
        assert (err.value.reason, err.value.replica, err.value.exit_code) == (
            reason,
            "worker-1",
            code,
        )
        said = {INPUT_ERROR: BAD_SHARD, PERMANENT_ERROR: FULL_DISK}.get(wrote, "ValueError")
        assert said in str(err.value)
        assert kube.calls("DELETE", JOB_PATH)
        assert f"deleted TFJob ml/train-run-1 ({reason})" in kube.output


def test_hang_times_out_and_deletes_the_job():
    with FakeKube(scenarios.hang()) as kube:
        with pytest.raises(LaunchTimeout, match="timeout"):
            run_tfjob(kube, timeout_seconds=1)
        (delete,) = kube.calls("DELETE", JOB_PATH)
        assert kube.cluster.tfjobs == {}
        assert "deleted TFJob ml/train-run-1 (LaunchTimeout)" in kube.output


def test_sigterm_deletes_the_job_and_fails():
    before = signal.getsignal(signal.SIGTERM)
    with FakeKube(scenarios.cancel()) as kube:
        with pytest.raises(LaunchCancelled, match="SIGTERM"):
            run_tfjob(kube)
        assert kube.calls("DELETE", JOB_PATH)
        assert kube.cluster.tfjobs == {}
    assert signal.getsignal(signal.SIGTERM) is before


def test_retried_launcher_reattaches_on_409_instead_of_creating_a_second_job():
    spec = make_spec()
    existing = manifest.build_manifest(spec)
    with FakeKube(scenarios.success(), existing=existing) as kube:
        result = tfjob.TFJobLauncher(kube.api_client(), out=io.StringIO()).run(spec)
        assert result.reattached
        assert result.gpu_hours == pytest.approx(1.0)
        (post,) = kube.calls("POST")
        assert len(kube.cluster.tfjobs) == 1


def test_an_existing_job_of_another_run_is_not_adopted():
    existing = manifest.build_manifest(make_spec(run_id="some-other-run"))
    with FakeKube(scenarios.hang(), existing=existing) as kube, pytest.raises(UserError):
        run_tfjob(kube)
    assert not kube.calls("DELETE")


def test_a_transient_apiserver_outage_during_the_watch_is_waited_out(monkeypatch):
    monkeypatch.setattr(tfjob.time, "sleep", lambda seconds: None)  # the backoff, not the test
    with FakeKube(scenarios.success()) as kube:
        kube.unavailable = 3  # the next three GETs answer 503, as a restarting apiserver does
        result, out = run_tfjob(kube)
    assert (result.attempts, result.restarts) == (1, 0)
    assert out.count("API unavailable (503") >= 1
    assert not kube.calls("DELETE")


def test_an_apiserver_that_stays_down_fails_the_launch(monkeypatch):
    monkeypatch.setattr(tfjob.time, "sleep", lambda seconds: None)
    with FakeKube(scenarios.hang()) as kube:
        kube.unavailable = 10_000
        with pytest.raises(Exception, match="503"):
            run_tfjob(kube)
    assert kube.output.count("API unavailable") == follow.MAX_API_FAULTS - 1


@pytest.mark.parametrize(
    "status, message",
    [(403, "apply deploy/rbac.yaml"), (404, "install the Kubeflow Training Operator")],
)
def test_no_rights_or_no_crd_is_one_clear_user_error(status, message):
    from kubernetes.client.exceptions import ApiException

    class Refusing:
        def create_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> None:
            raise ApiException(status=status, reason="Forbidden" if status == 403 else "NotFound")

    with FakeKube() as kube:
        launcher = tfjob.TFJobLauncher(kube.api_client(), out=io.StringIO())
        launcher.custom = Refusing()  # what the apiserver answers (a Status with this code)
        with pytest.raises(UserError, match=message):
            launcher.run(make_spec())


def test_delete_run_jobs_leaves_finished_jobs_to_their_ttl():
    run = "3f2a9c1e-5b7d-4e0a-9c1b-2d3e4f5a6b7c"
    with FakeKube() as kube:
        with kube.cluster.cond:
            for name in ("train-done", "train-failed", "train-running"):
                job = kube.cluster.add_job(
                    manifest.build_manifest(make_spec(name=name, run_id=run))
                )
                kind = {"train-done": "Succeeded", "train-failed": "Failed"}.get(name)
                if kind:
                    job["status"] = {"conditions": [{"type": kind, "status": "True"}]}
        assert cleanup.delete_run_jobs(kube.api_client(), "ml", run) == ["train-running"]
        assert sorted(n for _, n in kube.cluster.tfjobs) == ["train-done", "train-failed"]


def test_delete_run_jobs_deletes_only_the_runs_jobs():
    run = "3f2a9c1e-5b7d-4e0a-9c1b-2d3e4f5a6b7c"
    with FakeKube() as kube:
        with kube.cluster.cond:
            for name, run_id in (("train-a", run), ("train-b", run), ("train-c", "other-run")):
                kube.cluster.add_job(manifest.build_manifest(make_spec(name=name, run_id=run_id)))
        deleted = cleanup.delete_run_jobs(kube.api_client(), "ml", run)
        assert sorted(deleted) == ["train-a", "train-b"]
        assert list(kube.cluster.tfjobs) == [("ml", "train-c")]
        assert all(r.query["propagationPolicy"] == "Foreground" for r in kube.calls("DELETE"))
        assert cleanup.delete_run_jobs(kube.api_client(), "ml", run) == []
        with pytest.raises(UserError, match="run id"):
            cleanup.delete_run_jobs(kube.api_client(), "ml", "")


@pytest.mark.fault("the apiserver answers 503 to the exit handler")
def test_delete_run_jobs_waits_out_a_transient_apiserver_outage():
    """The exit handler also runs after a run that succeeded: one hiccup must not fail it."""
    from kubernetes.client.exceptions import ApiException

    run = "3f2a9c1e-5b7d-4e0a-9c1b-2d3e4f5a6b7c"
    slept: list[float] = []
    with FakeKube() as kube:
        with kube.cluster.cond:
            kube.cluster.add_job(manifest.build_manifest(make_spec(run_id=run)))
        kube.unavailable, kube.unavailable_deletes = 2, 1
        deleted = cleanup.delete_run_jobs(kube.api_client(), "ml", run, slept.append)
        assert deleted == ["train-run-1"] and kube.cluster.tfjobs == {}
        assert slept == [1.0, 2.0, 1.0]  # the list twice, the delete once
        kube.unavailable = 100  # an outage that lasts: the error is real
        with pytest.raises(ApiException) as err:
            cleanup.delete_run_jobs(kube.api_client(), "ml", run, slept.append)
    assert err.value.status == 503 and len(slept) == 3 + cleanup.ATTEMPTS - 1


# -- counting restarts from the pods --


def pods(*uids: str) -> list[dict[str, Any]]:
    """Pods of worker 0, 1, ... with these uids ("" leaves that index out)."""
    return [
        {"metadata": {"uid": uid, "labels": {"training.kubeflow.org/replica-index": str(i)}}}
        for i, uid in enumerate(uids)
        if uid
    ]


def test_one_preemption_of_every_worker_is_one_restart_whatever_the_order():
    ledger = RestartLedger(workers=3)
    assert ledger.observe(pods("a0", "a1", "a2")) and ledger.restarts == 0
    assert not ledger.observe(pods("a0", "a1", "a2"))
    ledger.observe(pods("a0", "", "a2"))  # worker 1 failed and its pod is gone
    ledger.observe(pods("a0", "b1", "a2"))  # recreated; the others have not failed yet
    assert ledger.restarts == 0
    ledger.observe(pods("b0", "c1", "a2"))  # a replacement that met the old chief failed too
    ledger.observe(pods("b0", "c1", "b2"))
    assert ledger.restarts == 1
    ledger.observe(pods("c0", "d1", "c2"))  # a second preemption
    assert ledger.restarts == 2


def test_the_ledger_survives_in_annotations():
    ledger = RestartLedger(workers=2)
    ledger.observe(pods("a0", "a1"))
    ledger.observe(pods("b0", "b1"))
    ledger.observe(pods("b0", "c1"))
    annotations = ledger.annotations()
    assert annotations["gptpipe.dev/restarts"] == "1"
    again = RestartLedger.from_annotations(2, annotations)
    assert again.restarts == 1 and not again.observe(pods("b0", "c1"))
    again.observe(pods("c0", "c1"))  # worker 0 was replaced while no launcher watched
    assert again.restarts == 2
    by_hand = RestartLedger.from_annotations(2, {"gptpipe.dev/restarts": "3"})
    by_hand.observe(pods("x0", "x1"))
    assert by_hand.restarts == 3
    assert RestartLedger.from_annotations(2, {"gptpipe.dev/worker-pods": "garbage"}).restarts == 0


def test_a_worker_that_names_its_bad_input_is_one_user_error_line():
    """Exit 2 with the trainer's input-error record in its termination message: that message
    is the error, one line."""
    said = "corrupt TFRecord shard gs://b/d/train-00001.tfrecord.gz"
    wrote = termination.encode(termination.TerminationMessage(termination.INPUT_ERROR, said))
    steps = [
        *scenarios.hang(),
        lambda c: c.exit(1, 2, wrote=wrote.decode()),
        lambda c: c.condition("Restarting"),
    ]
    with FakeKube(steps) as kube, pytest.raises(UserError) as err:
        run_tfjob(kube)
    assert isinstance(err.value, LaunchError) and err.value.exit_code == 2
    assert str(err.value) == f"TFJob ml/train-run-1 failed: worker-1 exited with code 2: {said}"


@pytest.mark.parametrize(
    "wrote",
    [
        "",  # no message: the trainer died before it could write one
        "out of cheese\n",  # a user's own image writing text there
        INPUT_ERROR[:-5],  # cut
        INPUT_ERROR.replace("input_error", "lunch_break"),  # a kind we do not know
        '{"kind": "input_error", "message": "x", "extra": 1}',
    ],
    ids=["none", "text", "cut", "unknown-kind", "unknown-field"],
)
def test_exit_2_without_our_termination_message_is_an_ordinary_failure(wrote):
    """Neither a message that is not our record nor an `error: ` line in the log makes a
    user error: the job fails as for any permanent exit, with the worker's log."""
    steps = [
        *scenarios.hang(),
        lambda c: c.log(1, f"error: {BAD_SHARD}"),
        lambda c: c.exit(1, 2, wrote=wrote),
        lambda c: c.condition("Restarting"),
    ]
    with FakeKube(steps) as kube, pytest.raises(LaunchError) as err:
        run_tfjob(kube)
    e = err.value
    assert not isinstance(e, UserError)
    assert (e.reason, e.replica, e.exit_code) == ("PermanentWorkerError", "worker-1", 2)
    assert f"  | error: {BAD_SHARD}" in str(e)


@pytest.mark.parametrize(("wrote", "error"), [(INPUT_ERROR, UserError), ("", LaunchError)])
def test_a_job_the_operator_failed_on_exit_2_reads_the_failed_workers_message(wrote, error):
    steps = [*scenarios.failure(code=2)]
    steps[-2] = lambda c: c.exit(1, 2, wrote=wrote)
    with FakeKube(steps) as kube, pytest.raises(LaunchError) as err:
        run_tfjob(kube)
    assert isinstance(err.value, error)
    assert (BAD_SHARD in str(err.value)) == (error is UserError)
    assert (err.value.replica, err.value.exit_code) == ("worker-1", 2)


@pytest.mark.fault("a full disk: a worker exits 3 with its record, its peer 143 when it goes")
def test_a_job_failed_on_a_full_disk_names_it_though_a_peers_143_is_listed_first():
    """The error is the record of the worker that exited 3, one line naming the path.

    Pods list in name order: worker-0's 143 (it lost its peer) comes before worker-1's exit 3."""
    steps = [*scenarios.failure(code=3)]
    steps[-2:-1] = [
        lambda c: c.exit(1, 3, wrote=PERMANENT_ERROR),
        lambda c: c.exit(0, 143),
    ]
    with FakeKube(steps) as kube, pytest.raises(LaunchError) as err:
        run_tfjob(kube)
    e = err.value
    assert isinstance(e, UserError) and e.reason == "WorkerPermanentError"
    assert (e.replica, e.exit_code) == ("worker-1", 3)
    assert str(e) == f"TFJob ml/train-run-1 failed: worker-1 exited with code 3: {FULL_DISK}"


def test_the_message_of_a_container_restarted_in_place_is_its_last_states():
    """restartPolicy OnFailure: the kubelet restarts the container in its pod, and the message
    of the run that ended is under lastState; a container that ended again without one has
    none, whatever an earlier run said."""
    ended = {"terminated": {"exitCode": 2, "message": INPUT_ERROR}}
    pod: dict[str, Any] = {
        "status": {
            "containerStatuses": [
                {"name": "tensorflow", "state": {"running": {}}, "lastState": ended}
            ]
        }
    }
    assert tfjob_status.worker_said(pod) == termination.parse(INPUT_ERROR)
    pod["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": 2}}
    assert tfjob_status.worker_said(pod) is None


def _said(out: io.StringIO, text: str) -> None:
    """A step that waits (at most a minute) until the launcher has said `text`."""
    until = time.monotonic() + 60
    while text not in out.getvalue() and time.monotonic() < until:
        time.sleep(0.05)


class Clock:
    """The launcher's monotonic clock, moved only by the test: its start grace then ends at a
    step of the test's, however slow the machine."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _launcher(kube: FakeKube, out: io.StringIO, grace: float, clock: Clock) -> tfjob.TFJobLauncher:
    api = kube.api_client()
    return tfjob.TFJobLauncher(api, out=out, poll_seconds=1, start_grace_seconds=grace, clock=clock)


PULL = 'Back-off pulling image "registry.example/trainer@sha256:0000": ErrImagePull: not found'
TRY = 'failed to pull and unpack image "registry.example/trainer@sha256:0000": not found'


@pytest.mark.slow
@pytest.mark.fault("a worker's image cannot be pulled")
def test_a_worker_that_cannot_start_fails_the_job_after_the_grace_and_frees_its_gpus():
    """The job fails once the worker has not started for the grace, and is deleted.

    The worker is timed by its pod, not by the reason of the moment: a failing pull alternates
    ErrImagePull (each try) and ImagePullBackOff (between them). Each change waits until the
    launcher has listed the pods, and the grace (2 s) passes on the launcher's clock only when
    the test moves it: at 1.5 s the launcher sees ImagePullBackOff, at 3 s ErrImagePull again,
    which it first saw at 0 s."""
    clock, out = Clock(), io.StringIO()

    def at(seconds: float, reason: str, message: str) -> Step:
        def step(c: Script) -> None:
            c.cannot_start(1, reason, message)
            # Once a listing saw the new reason, no older one is still being judged: the
            # launcher lists, then reads its clock, one listing at a time.
            c.launcher_lists_pods_again()
            clock.now = seconds
            c.launcher_lists_pods_again()

        return step

    steps = [
        lambda c: c.condition("Created"),
        lambda c: c.create_pods(waiting={1: ("ErrImagePull", TRY)}),  # worker 0 holds its GPU
        lambda c: _said(out, "worker-1: ErrImagePull: "),
        at(1.5, "ImagePullBackOff", PULL),
        at(3.0, "ErrImagePull", TRY),
    ]
    with FakeKube(steps) as kube:
        with pytest.raises(LaunchError) as err:
            _launcher(kube, out, grace=2, clock=clock).run(make_spec(), timeout_seconds=600)
        assert kube.calls("DELETE", JOB_PATH) and kube.cluster.tfjobs == {}
    assert (err.value.reason, err.value.replica) == ("WorkerCannotStart", "worker-1")
    message = str(err.value)
    assert f"worker-1 could not start for 3 s (ErrImagePull: {TRY}); deleted it" in message
    assert "pull secret" in message and "\n" not in message
    assert out.getvalue().count("worker-1: ErrImagePull: ") == 1  # said once, not at each flip
    assert "worker-1: ImagePullBackOff" not in out.getvalue()  # the same worker, the same wait
    assert "deleted TFJob ml/train-run-1 (WorkerCannotStart)" in out.getvalue()


def test_a_pull_that_recovers_within_the_grace_and_a_pod_waiting_for_a_node_do_not_fail():
    gpus = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    unavailable = (
        'image pull failed for "registry.example/trainer" because the registry is unavailable'
    )
    out = io.StringIO()
    steps = [
        lambda c: c.condition("Created"),
        lambda c: c.create_pods(
            waiting={1: ("RegistryUnavailable", unavailable)}, unscheduled={0: gpus}
        ),
        lambda c: _said(out, "is not scheduled"),  # a listing saw both
        lambda c: c.start(1),
        lambda c: c.start(0),
        *scenarios.success()[2:],
    ]
    with FakeKube(steps) as kube:
        result = _launcher(kube, out, grace=60, clock=Clock()).run(make_spec())
    assert result.restarts == 0
    said = out.getvalue()
    assert said.count(f"worker-1: RegistryUnavailable: {unavailable} (failing the job") == 1
    assert said.count(f"worker-0 is not scheduled: {gpus} (it waits for a node") == 1


@pytest.mark.fault("the exit handler may not delete TFJobs (RBAC)")
def test_the_exit_handler_closes_lineage_even_when_it_cannot_delete_the_jobs(tmp_path, monkeypatch):
    from kubernetes.client.exceptions import ApiException

    from components import lineage
    from components.jobs import kube
    from components.train import release

    store = str(tmp_path / "metadata.sqlite")
    run = "3f2a9c1e-5b7d-4e0a-9c1b-2d3e4f5a6b7c"
    lineage.record_execution(
        store,
        step="train",
        pipeline_name="gptpipe",
        run_id=run,
        parameters={},
        inputs={},
        outputs={},
        state="RUNNING",
    )  # its pod was killed: the exit handler closes it

    def forbidden(*args: Any, **kwargs: Any) -> list[str]:
        raise ApiException(status=403, reason="Forbidden")

    monkeypatch.setattr(cleanup, "delete_run_jobs", forbidden)
    monkeypatch.setattr(kube, "default_api_client", lambda: None)
    monkeypatch.setenv("KFP_RUN_ID", run)
    monkeypatch.setenv(kube.POD_NAMESPACE_ENV, "ml")
    with pytest.raises(ApiException):  # the exit task fails: its log says why
        release.release(TrainJob().to_dict(), store)
    assert lineage.failure_of(store, run)[0] == "train"  # ... once lineage is closed
