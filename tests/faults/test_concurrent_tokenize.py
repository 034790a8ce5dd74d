"""Fault rows for runs that share a dataset: racing tokenizes, and a lease holder that dies.

Real processes released at one moment (`processes.run_together`); on gs:// through
`gcs_strict`, the emulator behind a proxy that enforces GCS's preconditions.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components import storage
from components.storage import lease
from contracts.process import stat_fields
from tests.processes import REPO, run_together

CORPUS = REPO / "data" / "tinyshakespeare.txt"

TOKENIZE = """
import json
from components.tokenize import executor
WAIT()
dataset = executor.run_content_addressed(
    {corpus!r}, {root!r}, vocab_size=512, seq_len=32, progress=False
)
print(json.dumps({{"uri": dataset.uri, "reused": dataset.reused}}))
"""


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore::FutureWarning"}


@pytest.mark.fault("three runs tokenize the same data at the same moment")
@pytest.mark.parametrize("where", ["local", "gcs"])
@pytest.mark.slow
def test_racing_runs_tokenize_a_dataset_once(where, tmp_path, request, ledger):
    if where == "local":
        corpus, root = str(tmp_path / "corpus.txt"), str(tmp_path / "datasets")
    else:
        gcs = request.getfixturevalue("gcs_strict")
        corpus, root = gcs.uri("corpus.txt"), gcs.uri("datasets")
    storage.write_bytes(corpus, CORPUS.read_bytes()[:200_000])

    results = run_together([TOKENIZE.format(corpus=corpus, root=root)] * 3, child_env())

    assert [r.returncode for r in results] == [0, 0, 0], [r.stderr[-2000:] for r in results]
    outcomes = [json.loads(r.stdout.strip().splitlines()[-1]) for r in results]
    assert len({o["uri"] for o in outcomes}) == 1
    assert sorted(o["reused"] for o in outcomes) == [False, True, True]  # one did the work
    ledger("datasets", 1, len([n for n in storage.names_taken(root) if not n.startswith(".")]))
    manifest = json.loads(storage.read_bytes(storage.join(outcomes[0]["uri"], "manifest.json")))
    shards = manifest["splits"]["train"]["shards"] + manifest["splits"]["eval"]["shards"]
    tree = storage.list_tree(outcomes[0]["uri"])
    assert all(s in tree for s in shards)
    leftover = [n for n in storage.list_tree(root) if n.endswith(".lease") or ".staging-" in n]
    assert not leftover  # (a local lease leaves its zero-byte `.lock`: deleting one is racy)


@pytest.mark.fault("a holder whose lease was taken over finds its dataset published first")
def test_a_holder_overtaken_while_it_worked_reads_the_version_published_first(
    tmp_path, monkeypatch
):
    """Its heartbeat stalled past the limit, a waiter took over and published the same
    version first: the holder's own publish finds the folder taken and it reads that one."""
    from components.tokenize import executor

    corpus, root = tmp_path / "corpus.txt", str(tmp_path / "datasets")
    corpus.write_bytes(CORPUS.read_bytes()[:100_000])
    real = storage.atomic_dir

    @contextlib.contextmanager
    def overtaken(final, ready="", include=None):
        with real(final, ready=ready, include=include) as tmp:
            yield tmp
            if ".work" not in str(final):  # the dataset itself, not a part's unit of it
                shutil.copytree(tmp, final)  # the successor's copy, the same data's, lands first
                for rel, uri in (include or {}).items():
                    Path(final, rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(uri, Path(final, rel))

    monkeypatch.setattr(storage, "atomic_dir", overtaken)
    dataset = executor.run_content_addressed(
        str(corpus), root, vocab_size=512, seq_len=32, progress=False
    )
    assert dataset.reused and Path(dataset.uri, "manifest.json").is_file()
    assert [p.name for p in Path(root).iterdir() if not p.name.startswith(".")] == [
        Path(dataset.uri).name
    ]


HOLD_THEN_HANG = """
import time
real = time.time
time.time = lambda: real() + {skew!r}  # this node's clock is off by `skew` seconds
from components.storage import lease
if {elsewhere!r}:  # as if on another machine: a waiter here cannot look the process up
    here = lease.this_process()
    lease.this_process = lambda: {{**here, "boot": "another-machine"}}
with lease.hold_or_wait({uri!r}, done=lambda: False, heartbeat_s=0.2):
    print("holding", flush=True)
    time.sleep(600)
"""


def start_holder(uri: str, skew: float = 0.0, elsewhere: bool = False) -> subprocess.Popen[str]:
    """A process that holds the lease at `uri`, beating every 0.2 s, until killed; `elsewhere`:
    its lease says it runs on another machine."""
    code = HOLD_THEN_HANG.format(uri=uri, skew=skew, elsewhere=elsewhere)
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO, env=child_env()
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
    return holder


@pytest.mark.fault("the process holding a dataset's lease is SIGKILLed on another machine")
@pytest.mark.slow
def test_a_dead_holders_lease_is_taken_over_once_its_heartbeat_stops(tmp_path):
    uri = str(tmp_path / "datasets" / ".v1.lease")
    holder = start_holder(uri, elsewhere=True)
    try:
        assert wait_briefly(uri) is False  # while the holder beats, a waiter keeps waiting ...
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        assert wait_briefly(uri, seconds=1.0, stale_after_s=30) is False  # not at once ...
        # ... and once its heartbeat has stopped long enough, the waiter takes the lease.
        started = time.monotonic()
        with lease.hold_or_wait(uri, done=lambda: False, stale_after_s=1.5, poll_s=0.05) as held:
            assert held is True
            assert json.loads(Path(uri).read_bytes())["holder"]
        assert time.monotonic() - started < 60  # not a timing test: it just must not hang
        assert not Path(uri).exists()  # released
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


@pytest.mark.slow
@pytest.mark.fault("the process holding a dataset's lease is SIGKILLed on the waiter's machine")
@pytest.mark.parametrize("where", ["local", "gcs"])
@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "zombie"])
def test_a_holder_that_died_on_this_machine_is_taken_over_without_waiting(
    where, reaped, tmp_path, request
):
    """A holder that died on the waiter's own machine is taken over at once.

    The waiter sees the process gone; it does not wait out the heartbeat's staleness (an hour
    here), which is for holders it cannot look up."""
    uri = lease_uri(where, tmp_path, request)
    holder = start_holder(uri)
    try:
        holder.send_signal(signal.SIGKILL)
        if reaped:
            holder.wait(timeout=30)
        else:  # killed but not yet waited for by its parent: a zombie, still under its PID
            wait_for_state(holder.pid, "Z")
        assert wait_briefly(uri, seconds=30, stale_after_s=3600) is True
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()


def wait_for_state(pid: int, state: str, seconds: float = 30.0) -> None:
    """Wait until /proc/<pid>/stat shows `state` (its third field)."""
    deadline = time.monotonic() + seconds
    while stat_fields(pid)[0] != state:
        assert time.monotonic() < deadline, f"process {pid} never reached state {state}"
        time.sleep(0.01)


# Ends its main thread at the OS level (pthread_exit) while another thread goes on: the process
# lives, though /proc/<pid>/stat shows the state of its exited main thread, "Z".
MAIN_THREAD_EXITS = """
import ctypes, threading, time
threading.Thread(target=time.sleep, args=(60,)).start()
ctypes.CDLL(None).pthread_exit(None)
"""


def test_a_live_process_whose_main_thread_exited_is_not_gone():
    here = lease.this_process()
    assert here is not None
    alive = subprocess.Popen([sys.executable, "-c", MAIN_THREAD_EXITS])
    try:
        start = lease._start_ticks(alive.pid)
        wait_for_state(alive.pid, "Z")
        assert alive.poll() is None
        record = {"process": {**here, "pid": alive.pid, "start": start}}
        assert lease.holder_gone(json.dumps(record).encode(), here) is False
    finally:
        alive.kill()
        alive.wait()


def test_only_a_process_of_this_machine_seen_gone_counts_as_gone():
    here = lease.this_process()
    assert here is not None  # Linux: /proc tells
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        child = {**here, "pid": alive.pid, "start": lease._start_ticks(alive.pid)}
    finally:
        alive.kill()
        alive.wait()

    def gone(process: object) -> bool:
        return lease.holder_gone(json.dumps({"holder": "h", "process": process}).encode(), here)

    assert gone(here) is False  # this process: running
    assert gone({**here, "start": here["start"] - 1}) is True  # its PID, another process
    assert gone(child) is True  # exited and reaped
    assert gone({**child, "boot": "another-machine"}) is False  # elsewhere: cannot tell
    assert gone({**child, "host": "another-host"}) is False
    assert gone({**child, "pidns": "pid:[1]"}) is False  # another PID namespace: cannot tell
    assert gone({**child, "timens": "time:[1]"}) is False  # its start times read otherwise
    assert gone({**child, "pid": 2**40}) is False  # no PID at all: no error either
    assert gone({**child, "pid": 0}) is False
    assert gone({**child, "pid": float("inf")}) is False  # JSON's Infinity: not an int
    assert gone([here]) is False
    assert gone(None) is False  # a holder without /proc
    assert lease.holder_gone(b"not json", here) is False
    assert lease.holder_gone(json.dumps({"holder": "h"}).encode(), here) is False  # an old lease
    assert lease.holder_gone(json.dumps({"process": child}).encode(), None) is False


def wait_briefly(uri: str, seconds: float = 2.0, stale_after_s: float = 1.5) -> bool:
    """Wait on a lease for `seconds` (its holder beats every 0.2 s); True if it was taken
    over."""
    deadline = time.monotonic() + seconds
    with lease.hold_or_wait(
        uri, done=lambda: time.monotonic() > deadline, stale_after_s=stale_after_s, poll_s=0.05
    ) as held:
        return held


def lease_uri(where: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if where == "local":
        return str(tmp_path / "datasets" / ".v1.lease")
    return request.getfixturevalue("gcs_strict").uri("datasets/.v1.lease")


@pytest.mark.fault("a live lease holder's clock is an hour behind the waiter's")
@pytest.mark.parametrize("where", ["local", "gcs"])
@pytest.mark.slow
def test_a_live_holder_with_a_slow_clock_keeps_its_lease(where, tmp_path, request):
    """A live holder whose clock is slow keeps its lease.

    Staleness is the waiter's own watching of the lease not changing, not the time written in
    it (as client-go's leader election has it)."""
    uri = lease_uri(where, tmp_path, request)
    holder = start_holder(uri, skew=-3600.0)
    try:
        # Its heartbeats read an hour old: still alive. (A wider margin than the SIGKILL row's:
        # on gs:// the emulator serving the holder's beats shares this process with the waiter.)
        assert wait_briefly(uri, seconds=4.0, stale_after_s=3.0) is False
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
@pytest.mark.fault("a dead lease holder's clock was an hour ahead of the waiter's")
@pytest.mark.parametrize("where", ["local", "gcs"])
def test_a_dead_holder_with_a_fast_clock_is_taken_over(where, tmp_path, request):
    """A dead holder whose clock was fast is taken over once its lease stops changing.

    Not an hour later, when the time written in it would be 60 s old."""
    uri = lease_uri(where, tmp_path, request)
    record = {"holder": "dead", "beat": 7, "heartbeat": time.time() + 3600}
    assert storage.create_exclusive(uri, json.dumps(record).encode())
    deadline = time.monotonic() + 30  # not a timing test: it just must not wait the hour
    with lease.hold_or_wait(
        uri, done=lambda: time.monotonic() > deadline, stale_after_s=1.0, poll_s=0.05
    ) as held:
        assert held is True
        assert json.loads(storage.read_bytes(uri))["holder"] != "dead"


def test_a_holder_that_fails_releases_the_lease_for_the_next_caller(tmp_path):
    uri = str(tmp_path / ".v.lease")
    with (
        pytest.raises(RuntimeError, match="tokenize failed"),
        lease.hold_or_wait(uri, done=lambda: False) as held,
    ):
        assert held is True
        raise RuntimeError("tokenize failed")
    with lease.hold_or_wait(uri, done=lambda: False, poll_s=0.01) as held:
        assert held is True  # no waiting on a lease nobody holds


@pytest.mark.fault("a lease holder's lease is taken over while it works (its beats failed)")
@pytest.mark.parametrize("where", ["local", "gcs"])
def test_a_holder_taken_over_leaves_its_successors_lease_in_place(where, tmp_path, request):
    """A holder taken over leaves its successor's lease in place when it finishes.

    Deleting it would let a third run start the same work beside the successor."""
    uri = lease_uri(where, tmp_path, request)
    successor = json.dumps({"holder": "successor", "beat": 0, "heartbeat": time.time()})
    with lease.hold_or_wait(uri, done=lambda: False) as held:
        assert held is True
        storage.write_bytes(uri, successor.encode())  # a waiter took it over meanwhile
    assert json.loads(storage.read_bytes(uri))["holder"] == "successor"
