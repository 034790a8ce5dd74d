"""Lineage when ML Metadata fails or is contended: the step's own error always wins, a store
that fails is one line naming it, and concurrent writers retry the lock and lose nothing.

Every failure is real: a SQLite store locked by another process's open write transaction,
removed or replaced by a folder while the step runs, holding a type another tool registered
with other property kinds, or a gRPC service (doubles/mlmd) stopped under the step. Racing
writers are real processes released at one moment (`processes.run_together`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from components import lineage
from components.lineage import store as store_module
from components.lineage.query import execution_views
from components.lineage.store import mlmd
from contracts.errors import UserError
from tests.doubles.mlmd.server import MetadataGrpcServer
from tests.processes import REPO, run_together

PIPELINE = "gptpipe"
LOCK_RETRY_S = 0.3  # the tests' retry budget: a held lock fails a call after this long

# Another SQLite writer in the middle of its transaction: it holds the RESERVED lock, as a
# step does while MLMD writes, until its stdin closes or `seconds` pass.
_HOLD_LOCK = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
if float(sys.argv[2]) > 0:
    time.sleep(float(sys.argv[2]))
else:
    sys.stdin.read()
con.rollback()
"""


def hold_write_lock(path: Path, seconds: float = 0) -> subprocess.Popen[str]:
    """Start a process that holds the store's write lock (until released, or for `seconds`)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(path), str(seconds)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    return holder


def release(holder: subprocess.Popen[str]) -> None:
    assert holder.stdin is not None
    holder.stdin.close()
    holder.wait(timeout=30)


def new_store(path: Path) -> str:
    """An existing SQLite store, as after earlier steps: opening it writes nothing more."""
    lineage.open_store(str(path))
    return str(path)


def one_line(text: str) -> str:
    assert text.count("\n") == 1, text  # one line, no traceback
    return text


# ---- a store that fails while the step runs ------------------------------------------------


@dataclass
class FailingStore:
    """A store that works when the step starts and fails once `fail()` is called."""

    address: str
    fail: Callable[[], None]
    readable: str | None  # where what was recorded can be read afterwards; None: nowhere
    reason: str  # a word of the one line that says why the store failed


@pytest.fixture(
    params=["locked", "removed", "replaced by a folder", "type clash", "service stopped"]
)
def failing_store(request, tmp_path: Path, monkeypatch) -> Iterator[FailingStore]:
    monkeypatch.setattr(store_module, "LOCK_RETRY_S", LOCK_RETRY_S)
    path = tmp_path / "metadata.sqlite"
    kind = request.param
    if kind == "service stopped":
        with MetadataGrpcServer(path) as server:
            yield FailingStore(server.address, server.stop, str(path), "unreachable")
        return
    address = new_store(path)
    holders = []
    if kind == "locked":
        yield FailingStore(
            address, lambda: holders.append(hold_write_lock(path)), address, "stayed locked"
        )
    elif kind == "removed":
        yield FailingStore(address, path.unlink, None, "not in the store any more")
    elif kind == "replaced by a folder":

        def replace() -> None:
            path.unlink()
            path.mkdir()

        yield FailingStore(address, replace, None, "cannot be opened")
    else:  # another tool registered TFX's Examples, with other property kinds

        def register_clash() -> None:
            clash = mlmd.ArtifactType(name="Examples", properties={"span": mlmd.STRING})
            lineage.open_store(address).put_artifact_type(clash)

        yield FailingStore(address, register_clash, address, "AlreadyExistsError")
    for holder in holders:
        release(holder)


@pytest.mark.fault("the metadata store fails while a failed step records its failure")
@pytest.mark.parametrize("user_error", [False, True], ids=["bug", "user error"])
def test_a_failure_the_store_cannot_record_still_raises_the_steps_own_error(
    failing_store, user_error, capsys
):
    error = UserError("corpus is empty") if user_error else RuntimeError("disk full")
    with (
        pytest.raises(SystemExit if user_error else RuntimeError) as raised,
        lineage.step(failing_store.address, "train", PIPELINE, "run-1", {}) as rec,
    ):
        rec.input("examples", "Examples", "/data/examples", upstream=True)
        failing_store.fail()
        raise error
    err = capsys.readouterr().err
    if user_error:  # the step's own one line comes last, after the warning
        assert raised.value.code == 2
        warning, own = err.splitlines()
        assert own == "gptpipe train: error: corpus is empty"
    else:  # the very exception the block raised, not one chained to a recording error
        assert raised.value is error and raised.value.__cause__ is None
        warning = one_line(err).rstrip("\n")
    assert warning.startswith("gptpipe train: warning: its failure is not recorded: ")
    assert failing_store.address in warning and failing_store.reason in warning
    assert warning.endswith("stays RUNNING until the run's exit handler closes it")
    if failing_store.readable is not None:  # the start is there, for the exit handler to close
        (execution,) = lineage.run_summary(failing_store.readable, "run-1")["executions"]
        assert execution["state"] == "RUNNING"


@pytest.mark.fault("the metadata store fails after a step published its outputs")
def test_a_step_whose_completion_is_not_recorded_fails_naming_what_it_published(
    failing_store, tmp_path, capsys
):
    examples = str(tmp_path / "datasets" / "v1")
    with (
        pytest.raises(SystemExit) as exited,
        lineage.step(failing_store.address, "tokenize", PIPELINE, "run-1", {}) as rec,
    ):
        rec.output("examples", "Examples", examples, {"windows": 3})
        failing_store.fail()
    assert exited.value.code == 2
    err = one_line(capsys.readouterr().err)
    assert err.startswith("gptpipe tokenize: error: the step succeeded but is not recorded: ")
    assert failing_store.address in err and failing_store.reason in err
    assert f"published and not recorded: examples={examples}: fix the store" in err
    if failing_store.readable is None:
        return
    assert lineage.find_artifact(failing_store.readable, examples) is None
    (execution,) = lineage.run_summary(failing_store.readable, "run-1")["executions"]
    if failing_store.reason == "AlreadyExistsError":  # the store still took the FAILED mark
        assert execution["state"] == "FAILED"
        assert lineage.failure_of(failing_store.readable, "run-1") == (
            "tokenize",
            err.removeprefix("gptpipe tokenize: error: ").rstrip("\n"),
        )
    else:  # the store failed that too: RUNNING, for the run's exit handler to close
        assert execution["state"] == "RUNNING"


def test_a_bug_in_what_a_step_records_keeps_its_traceback_and_names_what_it_published(
    tmp_path,
):
    address = new_store(tmp_path / "metadata.sqlite")
    with (
        pytest.raises(ValueError, match="span") as raised,
        lineage.step(address, "tokenize", PIPELINE, "run-1", {}) as rec,
    ):
        rec.output("examples", "Examples", "/data/v1", {"span": "zero"})  # TFX's span is an int
    (note,) = raised.value.__notes__
    assert "published and not recorded: examples=/data/v1" in note
    assert lineage.failure_of(address, "run-1") == ("tokenize", note)


# ---- a store that fails before the step starts ---------------------------------------------


def _closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.fault("the metadata store cannot be opened or written when a step starts")
@pytest.mark.parametrize(
    "kind, reason",
    [
        ("its folder is a file", "cannot make its folder"),
        ("it is a folder", "unable to open database file"),
        ("it is not SQLite", "file is not a database"),
        ("it is locked", "stayed locked by other writers for 0.3 s"),
        ("nothing listens", "is unreachable"),
    ],
)
def test_a_store_that_fails_at_the_start_stops_the_step_before_its_work(
    kind, reason, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(store_module, "LOCK_RETRY_S", LOCK_RETRY_S)
    path = tmp_path / "metadata.sqlite"
    holder = None
    if kind == "its folder is a file":
        (tmp_path / "runs").write_text("")
        path = tmp_path / "runs" / "metadata.sqlite"
    elif kind == "it is a folder":
        path.mkdir()
    elif kind == "it is not SQLite":
        path.write_text("not a database\n" * 100)
    elif kind == "it is locked":
        holder = hold_write_lock(Path(new_store(path)))
    address = _closed_port() if kind == "nothing listens" else str(path)
    worked = []
    try:
        with (
            pytest.raises(SystemExit) as exited,
            lineage.step(address, "tokenize", PIPELINE, "run-1", {}),
        ):
            worked.append(True)
    finally:
        if holder is not None:
            release(holder)
    assert exited.value.code == 2 and worked == []
    err = one_line(capsys.readouterr().err)
    assert err.startswith("gptpipe tokenize: error: ") and address in err and reason in err


# ---- writers that contend for the lock -----------------------------------------------------


@pytest.mark.slow
@pytest.mark.fault("another process holds the metadata store's write lock for a second")
def test_a_step_waits_out_another_writers_lock_and_records_once(tmp_path, capsys):
    address = new_store(tmp_path / "metadata.sqlite")
    holder = hold_write_lock(Path(address), seconds=1.0)
    try:
        assert holder.poll() is None
        with lineage.step(address, "tokenize", PIPELINE, "run-1", {}) as rec:
            assert holder.poll() == 0  # the start was recorded once the lock was let go
            rec.output("examples", "Examples", "/data/v1")
    finally:
        holder.wait(timeout=30)
    assert capsys.readouterr().err == ""
    (execution,) = lineage.run_summary(address, "run-1")["executions"]
    assert execution["state"] == "COMPLETE"
    raw = lineage.open_store(address)
    assert [a.uri for a in raw.get_artifacts()] == ["/data/v1"]
    (only,) = raw.get_executions()
    assert len(raw.get_events_by_execution_ids([only.id])) == 1


WRITERS = 5  # processes writing at the same moment
ROUNDS = 4  # steps each writes, one per run; every writer writes into every run at once
STEPS = ("train", "evaluate")  # writer k records as STEPS[k % 2]: types raced too

# One writer: a step per run, each reading the Examples an earlier run made (so each run also
# races to record its CACHED tokenize) and publishing a model of its own.
_WRITER = """
from components import lineage
WAIT()
for i in range({rounds}):
    run = f"run-{{i + 1}}"
    with lineage.step({store!r}, {step!r}, "gptpipe", run, {{"writer": {k}, "round": i}}) as rec:
        rec.input("examples", "Examples", "/data/examples", upstream=True)
        rec.output("model", "Model", f"/models/{k}/{{i}}", {{"writer": {k}, "round": i}})
        rec.dataset_version = "dv-1"
"""


@pytest.mark.fault("two steps write ML Metadata at the same moment")
@pytest.mark.slow
def test_steps_writing_at_the_same_moment_retry_the_lock_and_lose_nothing(tmp_path, ledger):
    address = str(tmp_path / "metadata.sqlite")
    lineage.record_execution(  # run-0's tokenize made the Examples every writer reads
        address,
        step="tokenize",
        pipeline_name=PIPELINE,
        run_id="run-0",
        parameters={},
        inputs={},
        outputs={"examples": [lineage.ArtifactRecord("Examples", "/data/examples")]},
    )
    scripts = [
        _WRITER.format(rounds=ROUNDS, store=address, step=STEPS[k % 2], k=k) for k in range(WRITERS)
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}
    for result in run_together(scripts, env, timeout=240):
        assert (result.returncode, result.stderr) == (0, ""), result.stderr

    expected, counts = expected_records(), count_records(address)
    found = sum(1 for key in expected if counts[key] == 1)
    ledger("lineage records", len(expected), found)
    duplicated = {key: n for key, n in counts.items() if n > 1}
    assert (found, duplicated) == (len(expected), {})
    assert set(counts) == set(expected)  # and nothing else was recorded


def expected_records() -> set[tuple[Any, ...]]:
    """Every record the writers must leave, each once, beside run-0's own."""
    records: set[tuple[Any, ...]] = set()
    for k in range(WRITERS):
        for i in range(ROUNDS):
            run = f"run-{i + 1}"
            records |= {
                ("execution", STEPS[k % 2], run, k, i, "COMPLETE"),
                ("artifact", "Model", f"/models/{k}/{i}", k, i),
                ("event", "INPUT", k, i, "/data/examples"),
                ("event", "OUTPUT", k, i, f"/models/{k}/{i}"),
                ("member", run, k, i),
                ("member", "gptpipe", k, i),
                ("member", "dv-1", k, i),
            }
    for i in range(ROUNDS):
        run = f"run-{i + 1}"
        records |= {
            ("execution", "tokenize", run, None, None, "CACHED"),
            ("event", "OUTPUT", run, "cached", "/data/examples"),
            ("context", "pipeline_run", run),
        }
    records |= {("context", "pipeline", "gptpipe"), ("context", "dataset_version", "dv-1")}
    records |= {("type", name) for name in ("gptpipe.Train", "gptpipe.Evaluate", "Model")}
    return records


def count_records(address: str) -> Counter[tuple[Any, ...]]:
    """How often each record is in the store, run-0's own left out."""
    raw = lineage.open_store(address)
    counts: Counter[tuple[Any, ...]] = Counter()
    artifacts = {a.id: a.uri for a in raw.get_artifacts()}
    contexts = {c.id: c for c in raw.get_contexts()}
    context_types = {t.id: t.name for t in raw.get_context_types()}
    for c in contexts.values():
        if c.name != "run-0":
            counts["context", context_types[c.type_id], c.name] += 1
    for a in raw.get_artifacts():
        props = a.custom_properties
        if a.uri != "/data/examples":
            who = (props["writer"].int_value, props["round"].int_value)
            counts["artifact", "Model", a.uri, *who] += 1
    for view in execution_views(raw, raw.get_executions()):
        props, state = view["properties"], view["state"]
        if props["run_id"] == "run-0":
            continue
        who = (props.get("writer"), props.get("round"))
        counts["execution", props["step"], props["run_id"], *who, state] += 1
        for event in raw.get_events_by_execution_ids([view["id"]]):
            kind = "INPUT" if event.type == mlmd.Event.INPUT else "OUTPUT"
            what = who if state != "CACHED" else (props["run_id"], "cached")
            counts["event", kind, *what, artifacts[event.artifact_id]] += 1
        if state != "CACHED":
            for c in raw.get_contexts_by_execution(view["id"]):
                counts["member", c.name, *who] += 1
    for name in ("gptpipe.Train", "gptpipe.Evaluate"):
        counts["type", name] += sum(t.name == name for t in raw.get_execution_types())
    counts["type", "Model"] += sum(t.name == "Model" for t in raw.get_artifact_types())
    return counts


def test_the_retrying_client_stands_on_ml_metadatas_call_path():
    # `_Store` overrides MetadataStore._call and calls _call_method; the "it is locked" case
    # above fails if the retries stop running, this one says where to look.
    from ml_metadata.metadata_store import metadata_store

    assert callable(metadata_store.MetadataStore._call)
    assert callable(metadata_store.MetadataStore._call_method)
