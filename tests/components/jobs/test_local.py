"""The local launcher: real worker processes, TF_CONFIG, restarts, deadline, cancellation."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from components.jobs.errors import LaunchCancelled, LaunchError, LaunchTimeout
from components.jobs.local import LocalLauncher, exit_code_of, exited
from components.jobs.spec import JobSpec
from components.train import executor
from contracts.errors import UserError
from contracts.process import stat_fields
from tests.doubles.kubernetes.fake_worker import BAD_SHARD
from tests.processes import alive
from trainer.config import resolve_config

FAKE_WORKER = Path(__file__).parents[2] / "doubles" / "kubernetes" / "fake_worker.py"
WORKER = r'''
import json, os, signal, subprocess, sys, time
from pathlib import Path

mode, out = sys.argv[1], Path(sys.argv[2])
FULL_DISK = "no space left on device at /runs/x/model: a restart cannot mend this; free space"
tf_config = os.environ.get("TF_CONFIG")
index = json.loads(tf_config)["task"]["index"] if tf_config else 0
record = {"pid": os.getpid(), "tf_config": tf_config,
          "extra": os.environ.get("GPTPIPE_EXTRA"), "parent": os.environ.get("GPTPIPE_PARENT")}
with open(out / f"starts-{index}.jsonl", "a") as f:
    f.write(json.dumps(record) + "\n")
print(f"worker {index} started", flush=True)


def starts(i):
    path = out / f"starts-{i}.jsonl"
    text = path.read_text() if path.exists() else ""
    return text.count("\n")  # whole lines only: a start may be midway through its record


def running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def block():
    """Sleep with a child in our process group, as a trainer with data workers would."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with open(out / "pids.txt", "a") as f:
        f.write(f"{os.getpid()}\n{child.pid}\n")
    time.sleep(60)


if mode == "ok":
    sys.exit(0)
if mode == "oom-once":  # worker 1 is OOM-killed once; worker 0 finishes once it is back
    if index == 1 and starts(1) == 1:
        # Only once worker 0 runs too: on a loaded machine the group could otherwise be
        # restarted before worker 0's first start got this far, and the test sees one start.
        for _ in range(600):
            if starts(0) >= 1:
                break
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    for _ in range(600):
        if starts(1) >= 2:
            sys.exit(0)
        time.sleep(0.05)
    sys.exit(3)
if mode == "bad-input":
    if index == 1:
        print("Traceback (most recent call last):")
        print("ValueError: bad shard")
        sys.exit(1)
    block()
if mode == "always-137":
    if index == 1:
        print("CUDA error: an illegal memory access was encountered", flush=True)
        os._exit(137)
    block()
if mode == "leave-child":  # worker 1 exits 1, leaving a child that ignores SIGTERM
    if index == 1:
        ready = out / "child-ready"
        code = (
            "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "open(sys.argv[1], 'w').close(); time.sleep(60)"
        )
        child = subprocess.Popen([sys.executable, "-c", code, str(ready)])
        with open(out / "pids.txt", "a") as f:
            f.write(f"{child.pid}\n")
        while not ready.exists():
            time.sleep(0.01)
        sys.exit(1)
    block()
if mode == "hang":
    block()
if mode == "full-disk":  # worker 1 finds the disk full (exit 3, its record); worker 0 loses it
    said = out / "said-1"
    if index == 1:
        record = {"kind": "permanent_error", "message": FULL_DISK}
        Path(os.environ["GPTPIPE_TERMINATION_MESSAGE"]).write_text(json.dumps(record))
        print(f"error: {FULL_DISK}", flush=True)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # it ends by itself, after worker 0
        said.touch()
        while starts(0) < 1:  # a whole line: its start is recorded
            time.sleep(0.01)
        peer = json.loads((out / "starts-0.jsonl").read_text().splitlines()[0])["pid"]
        while running(peer):  # it exits 143 first, as a peer that lost this one does
            time.sleep(0.01)
        sys.exit(3)
    while not said.exists():
        time.sleep(0.01)
    sys.exit(143)
if mode == "chatty":  # more than a pipe holds (64 KiB), then done
    for line in range(4000):
        print(f"line {line:04d} " + "x" * 60)
    sys.exit(0)
if mode == "stubborn":  # notes SIGTERM, then runs on: stopped only by SIGKILL
    signal.signal(signal.SIGTERM, lambda *_: (out / f"sigterm-{index}").touch())
    block()
if mode in ("cancel", "hangup"):  # the launcher told to stop: SIGTERM, or a closed terminal
    if index == 0:
        os.kill(os.getppid(), signal.SIGTERM if mode == "cancel" else signal.SIGHUP)
    block()
'''


@pytest.fixture
def job(tmp_path: Path):
    """Makes a JobSpec running the scripted worker in `mode`; records land in tmp_path/rec."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    records = tmp_path / "rec"
    records.mkdir()

    def make(mode: str, **overrides: Any) -> JobSpec:
        fields: dict[str, Any] = dict(
            name="local-test",
            command=[sys.executable, str(script), mode, str(records)],
            workers=2,
            backoff_limit=2,
        )
        fields.update(overrides)
        return JobSpec(**fields)

    return make


def starts(tmp_path: Path, index: int) -> list[dict[str, Any]]:
    path = tmp_path / "rec" / f"starts-{index}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def recorded_pids(tmp_path: Path) -> list[int]:
    path = tmp_path / "rec" / "pids.txt"
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def run_local(spec: JobSpec, tmp_path: Path, **kwargs: Any) -> tuple[Any, str]:
    out = io.StringIO()
    launcher = LocalLauncher(log_dir=tmp_path / "logs", out=out, kill_grace_seconds=2)
    try:
        return launcher.run(spec, **kwargs), out.getvalue()
    finally:
        run_local.output = out.getvalue()  # type: ignore[attr-defined]


def test_two_workers_get_the_operators_tf_config_and_the_parent_env(job, tmp_path, monkeypatch):
    monkeypatch.setenv("GPTPIPE_PARENT", "inherited")
    monkeypatch.setenv("TF_CONFIG", '{"stale": true}')  # never leaks into the workers
    result, out = run_local(job("ok", env={"GPTPIPE_EXTRA": "extra"}), tmp_path)
    configs = [json.loads(starts(tmp_path, i)[0]["tf_config"]) for i in (0, 1)]
    cluster = configs[0]["cluster"]
    assert list(cluster) == ["worker"] and len(cluster["worker"]) == 2
    assert all(addr.startswith("127.0.0.1:") for addr in cluster["worker"])
    assert len(set(cluster["worker"])) == 2
    for index, config in enumerate(configs):
        assert config == {
            "cluster": cluster,
            "task": {"type": "worker", "index": index},
            "environment": "cloud",
        }
        record = starts(tmp_path, index)[0]
        assert (record["extra"], record["parent"]) == ("extra", "inherited")
    assert (result.launcher, result.attempts, result.restarts, result.gpu_hours) == (
        "local",
        1,
        0,
        0.0,
    )
    assert "[worker-0] worker 0 started" in out
    assert "worker 1 started" not in out  # the others' output goes to their log files
    assert "worker 1 started" in (tmp_path / "logs/attempt-1/worker-1.log").read_text()


def test_one_worker_gets_no_tf_config_like_the_operator(job, tmp_path):
    run_local(job("ok", workers=1), tmp_path)
    assert starts(tmp_path, 0)[0]["tf_config"] is None


@pytest.mark.fault("the launcher's output closed (its local run killed) while worker 0 talks")
def test_a_launcher_whose_output_is_gone_still_drains_worker_0_and_finishes(job, tmp_path):
    """The job finishes on its workers alone, worker 0's whole output in its log."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads: every write fails with EPIPE (Python ignores SIGPIPE)
    with open(write_end, "w", encoding="utf-8") as closed:
        launcher = LocalLauncher(log_dir=tmp_path / "logs", out=closed, kill_grace_seconds=2)
        # the deadline only stops a regression from hanging: worker 0 blocked on a full pipe
        result = launcher.run(job("chatty", workers=1), timeout_seconds=600)
        assert launcher.echo.gone
        with contextlib.suppress(BrokenPipeError):
            closed.close()  # its buffer cannot be flushed either
    assert result.attempts == 1
    log = (tmp_path / "logs/attempt-1/worker-0.log").read_text().splitlines()
    assert len([line for line in log if line.startswith("line ")]) == 4000
    assert log[-1].startswith("line 3999 ")


def test_a_worker_killed_once_restarts_all_workers_on_fresh_ports(job, tmp_path):
    result, out = run_local(job("oom-once"), tmp_path)
    assert (result.attempts, result.restarts) == (2, 1)
    assert len(starts(tmp_path, 0)) == 2 and len(starts(tmp_path, 1)) == 2
    clusters = [json.loads(s["tf_config"])["cluster"]["worker"] for s in starts(tmp_path, 0)]
    assert not set(clusters[0]) & set(clusters[1])
    assert "worker-1 exited with retryable code 137" in out


def test_a_permanent_exit_code_fails_with_worker_index_and_log_tail(job, tmp_path):
    with pytest.raises(LaunchError) as err:
        run_local(job("bad-input"), tmp_path)
    e = err.value
    assert (e.reason, e.replica, e.exit_code) == ("WorkerFailed", "worker-1", 1)
    assert e.log_tail[-1] == "ValueError: bad shard"
    assert "worker-1 exited with code 1" in str(e) and "ValueError: bad shard" in str(e)
    assert len(starts(tmp_path, 1)) == 1  # no restart
    assert not any(alive(p) for p in recorded_pids(tmp_path))


@pytest.mark.fault("a worker finds the disk full (exit 3, its record) and its peer exits 143 first")
def test_a_full_disk_fails_the_job_at_once_whichever_exit_came_first(job, tmp_path):
    """The job fails at once, blaming the worker that said why it stopped.

    Worker 0 exits 143 before worker 1's exit 3: the launcher sees it first, yet does not
    restart."""
    # Worker 1 outlasts the launcher's SIGTERM until worker 0 has gone: a grace it cannot
    # run past on a loaded machine (the wait ends when it exits).
    launcher = LocalLauncher(log_dir=tmp_path / "logs", out=io.StringIO(), kill_grace_seconds=600)
    with pytest.raises(LaunchError) as err:
        launcher.run(job("full-disk", backoff_limit=3))
    e = err.value
    assert isinstance(e, UserError) and e.reason == "WorkerPermanentError"
    assert (e.replica, e.exit_code) == ("worker-1", 3)
    assert str(e) == (
        "job local-test failed: worker-1 exited with code 3: no space left on device at "
        "/runs/x/model: a restart cannot mend this; free space"
    )
    assert len(starts(tmp_path, 0)) == len(starts(tmp_path, 1)) == 1  # no restart
    assert not (tmp_path / "logs" / "attempt-2").exists()


@pytest.mark.parametrize(
    ("wrote", "input_error"),
    [("record", True), ("long", True), ("overlong", False), ("text", False), ("nothing", False)],
)
def test_a_worker_names_its_bad_input_in_its_own_termination_message_file(
    tmp_path, wrote, input_error
):
    """Each worker writes to its own file in the attempt folder (GPTPIPE_TERMINATION_MESSAGE),
    read as the kubelet reads it: the trainer's record after exit 2 is a WorkerInputError with
    its message; anything else is an ordinary failure, though the log says `error: ...`."""
    records = tmp_path / "rec"
    records.mkdir()
    command = [sys.executable, str(FAKE_WORKER), f"wrote-{wrote}", str(records)]
    with pytest.raises(LaunchError) as err:
        run_local(JobSpec(name="local-test", command=command, workers=2), tmp_path)
    e = err.value
    assert (e.replica, e.exit_code) == ("worker-1", 2)
    assert (e.reason, isinstance(e, UserError)) == (
        ("WorkerInputError", True) if input_error else ("WorkerFailed", False)
    )
    first = str(e).splitlines()[0]
    head = "job local-test failed: worker-1 exited with code 2"
    assert first.startswith(f"{head}: {BAD_SHARD}" if input_error else f"{head}, a permanent")
    assert e.log_tail[-1] == f"error: {BAD_SHARD}"
    attempt = tmp_path / "logs" / "attempt-1"
    assert (attempt / "worker-1.termination-log").exists() == (wrote != "nothing")
    assert not (attempt / "worker-0.termination-log").exists()


@pytest.mark.parametrize("policy, attempts", [("ExitCode", 2), ("Never", 1)])
def test_retryable_exits_past_the_backoff_limit_fail(job, tmp_path, policy, attempts):
    with pytest.raises(LaunchError) as err:
        run_local(job("always-137", backoff_limit=1, restart_policy=policy), tmp_path)
    e = err.value
    assert (e.replica, e.exit_code) == ("worker-1", 137)
    assert e.reason == ("BackoffLimitExceeded" if policy == "ExitCode" else "WorkerFailed")
    assert len(starts(tmp_path, 1)) == attempts
    assert "CUDA error" in e.log_tail[-1]
    assert not any(alive(p) for p in recorded_pids(tmp_path))


@pytest.mark.slow
def test_the_deadline_stops_every_worker_and_fails(job, tmp_path):
    with pytest.raises(LaunchTimeout) as err:
        run_local(job("hang", active_deadline_seconds=3), tmp_path)
    assert err.value.reason == "DeadlineExceeded"
    workers = [s["pid"] for i in (0, 1) for s in starts(tmp_path, i)]
    assert len(workers) == 2
    assert not any(alive(p) for p in workers + recorded_pids(tmp_path))  # and their children


@pytest.mark.parametrize("mode, name", [("cancel", "SIGTERM"), ("hangup", "SIGHUP")])
def test_sigterm_or_sighup_stops_every_worker_and_fails(job, tmp_path, mode, name):
    hangup = signal.signal(signal.SIGHUP, signal.SIG_DFL)  # not as under nohup (CI runs so)
    try:
        before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
        with pytest.raises(LaunchCancelled, match=name):
            run_local(job(mode), tmp_path)
        assert {s: signal.getsignal(s) for s in before} == before
    finally:
        signal.signal(signal.SIGHUP, hangup)
    assert not any(alive(p) for p in recorded_pids(tmp_path))


def test_a_sighup_ignored_by_nohup_stays_ignored(job, tmp_path):
    from components.jobs.cancel import cancel_on_sigterm

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with cancel_on_sigterm():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


@pytest.fixture
def ctrl_c():
    """Ctrl-C (SIGINT) raises KeyboardInterrupt for the test's length: a process started as a
    background job by a shell without job control (`make test &` in a script, CI runners)
    inherits SIGINT ignored, and Python then leaves it ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_second_ctrl_c_kills_the_workers_at_once_and_still_stops_them_all(job, tmp_path, ctrl_c):
    """The first Ctrl-C SIGTERMs the workers and grants a grace period; a second one, during
    it, SIGKILLs them then: it never leaves workers behind."""
    launcher = LocalLauncher(log_dir=tmp_path / "logs", out=io.StringIO(), kill_grace_seconds=600)

    late: list[str] = []  # what never happened, if the test had to go on without it

    def await_then_press(what: str, done: Callable[[], bool]) -> None:
        until = time.monotonic() + 120  # only a broken launcher reaches it
        while not done():
            if time.monotonic() > until:
                late.append(what)
                break
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)  # KeyboardInterrupt in the launcher

    def press_ctrl_c_twice() -> None:
        await_then_press("workers up", lambda: len(recorded_pids(tmp_path)) == 4)
        sigtermed = lambda: len(list((tmp_path / "rec").glob("sigterm-*"))) == 2  # noqa: E731
        await_then_press("SIGTERM to both", sigtermed)  # the grace period runs

    threading.Thread(target=press_ctrl_c_twice, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        launcher.run(job("stubborn"))
    assert late == []
    assert len(recorded_pids(tmp_path)) == 4
    assert not any(alive(p) for p in recorded_pids(tmp_path))


def test_the_executor_picks_the_local_launcher_without_loading_kubernetes(tmp_path):
    # A fresh interpreter: what a local train step imports, and nothing this test session did.
    script = (
        "import sys; from components.train import executor; "
        f"launcher = executor.make_launcher('local', {str(tmp_path / 'work')!r}); "
        "print(type(launcher).__name__, launcher.log_dir); "
        "print(sorted(m for m in sys.modules if m.startswith(('kubernetes', 'components.jobs'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).parents[3],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    kind, loaded = done.stdout.splitlines()
    assert kind == f"LocalLauncher {tmp_path / 'work' / 'worker-logs'}"
    loaded_now = ast.literal_eval(loaded)
    assert "components.jobs.local" in loaded_now
    assert not [m for m in loaded_now if m.startswith(("kubernetes", "components.jobs.tfjob"))]


SCRATCH_WORKER = r"""
import json, os, sys, time
from pathlib import Path

model, work = Path(sys.argv[1]), Path(sys.argv[2])
left = [work / "checkpoints" / ".worker-tmp-0a1b2c3d", work / "scratch-model-4e5f6a7b"]
if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1:
    # what a worker killed mid-save and mid-export leaves (trainer/callbacks.py, export.py)
    for folder in left:
        folder.mkdir(parents=True)
        (folder / "part").write_text("half")
    sys.exit(0)
(work / "checkpoints").mkdir(parents=True, exist_ok=True)
(work / "checkpoints" / "ckpt-10.index").write_text("the chief's")
(work / "scratch-model-notes.txt").write_text("a file, not a worker's folder")
for _ in range(600):  # the job succeeds when worker 0 does: after worker 1 has left them
    if all((folder / "part").exists() for folder in left):
        break
    time.sleep(0.1)
model.mkdir(parents=True)
metrics = {"steps": 10, "final_loss": 1.5, "diverged": False, "diverged_at_step": None}
metrics.update(tokens_per_second=9.5, global_batch_size=8, replicas=2, workers=2)
(model / "train_metrics.json").write_text(json.dumps({**metrics, "precision_policy": "float32"}))
(model / "COMPLETE").write_text("")  # last, as trainer/export.py writes it
"""


def test_the_train_step_removes_scratch_a_dead_worker_left_and_keeps_the_chiefs(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(SCRATCH_WORKER)
    model, work = tmp_path / "model", tmp_path / "work"
    spec = JobSpec(
        name="scratch-test",
        command=[sys.executable, str(script), str(model), str(work)],
        workers=2,
        backoff_limit=0,
    )
    launcher = LocalLauncher(log_dir=None, out=io.StringIO())
    assert len(executor.worker_scratch(str(work))) == 0  # a missing folder has none
    result = executor.run(spec, resolve_config("tiny"), str(model), str(work), launcher)
    assert result.model_properties["steps"] == 10
    kept = sorted(str(p.relative_to(work)) for p in work.rglob("*"))
    assert kept == ["checkpoints", "checkpoints/ckpt-10.index", "scratch-model-notes.txt"]


def test_exit_codes_in_kubernetes_terms():
    assert exit_code_of(-signal.SIGKILL) == 137
    assert exit_code_of(-signal.SIGTERM) == 143
    assert exit_code_of(1) == 1 and exit_code_of(0) == 0


def test_unknown_launcher_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="launcher 'slurm'"):
        executor.make_launcher("slurm", str(tmp_path))


@pytest.mark.slow
def test_a_failed_workers_child_is_stopped_with_its_group(job, tmp_path):
    """Worker 1 exits, leaving a child that ignores SIGTERM: its group is still signalled (the
    worker, unreaped, keeps the group's ID its own) and the SIGKILL round ends the child."""
    with pytest.raises(LaunchError) as err:
        run_local(job("leave-child"), tmp_path)
    assert (err.value.replica, err.value.exit_code) == ("worker-1", 1)
    pids = recorded_pids(tmp_path)
    assert len(pids) == 3 and not any(alive(p) for p in pids)  # worker 0's two, and the child


@pytest.mark.skipif(not hasattr(os, "waitid"), reason="Python has no os.waitid on macOS")
@pytest.mark.parametrize(
    ("script", "code"),
    [("raise SystemExit(3)", 3), ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -9)],
)
def test_an_exited_worker_stays_unreaped_so_its_group_id_stays_its_own(script, code):
    """`exited` reads a worker's end without reaping it: the zombie keeps its PID, so the
    group stop that follows cannot signal another process's group of the same number."""
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    until = time.monotonic() + 60
    while exited(proc) is None and time.monotonic() < until:
        time.sleep(0.01)
    assert exited(proc) == code and proc.returncode is None
    assert stat_fields(proc.pid)[0] == "Z"
    assert proc.wait(timeout=5) == code and exited(proc) == code  # reaped by Popen only
