"""`gptpipe runs --local`: past local runs from ML Metadata, newest first.

The e2e tests list the session's two real runs (`local_runs`); the others read stores written
here through `lineage.record_execution`, as the steps write them, with runs that failed, ran
no evaluation or were a rollback.
"""

import datetime
import json
import os

import pytest

from components import lineage
from contracts.errors import UserError
from pipelines.cli import runs as runs_cmd
from tests.pipelines.cli import commands


def run(argv: list[str]) -> int:
    return commands.run(runs_cmd.add_parser, argv)


def output(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    return commands.output(capsys, runs_cmd.add_parser, argv)


# ---- the two real runs ---------------------------------------------------------------------


@pytest.mark.e2e
def test_json_lists_both_runs_newest_first_with_what_each_did(local_runs, capsys):
    rows = json.loads(output(capsys, ["runs", "--local", "--root", str(local_runs.root), "--json"]))
    newest_first = [1, 0]
    assert [r["run_id"] for r in rows] == [local_runs.run_id(i) for i in newest_first]
    assert [r["dataset_version"] for r in rows] == [
        local_runs.dataset_version(i) for i in newest_first
    ]
    assert rows[0]["dataset_version"] != rows[1]["dataset_version"]
    for row, index in zip(rows, newest_first, strict=True):
        assert row["eval_nats_per_char"] == pytest.approx(local_runs.eval_nats_per_char(index))
        assert (row["blessed"], row["pushed"]) == (True, True)
        assert row["pushed_version"] == local_runs.pushed_version(index)
        assert row["pushed_destination"] == str(local_runs.serving_dir)
        assert row["state"] == "COMPLETE"
        assert list(row["steps"]) == ["tokenize", "train", "evaluate", "push"]
        assert 0 < row["duration_s"] < 600
        assert row["started"].endswith("Z")
    # The newer run started after the older one ended.
    assert rows[0]["start_time_ms"] >= rows[1]["end_time_ms"]


@pytest.mark.e2e
def test_the_table_shows_each_run_on_its_row(local_runs, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # wide enough that rich folds no cell
    lines = output(capsys, ["runs", "--local", "--root", str(local_runs.root)]).splitlines()
    rows = [next(line for line in lines if local_runs.run_id(i) in line) for i in (1, 0)]
    assert lines.index(rows[0]) < lines.index(rows[1])  # newest first
    for line, index in zip(rows, (1, 0), strict=True):
        cells = line.split()
        assert local_runs.dataset_version(index)[:8] in cells
        assert f"{local_runs.eval_nats_per_char(index):.4f}" in cells
        assert cells[-2:] == ["yes", str(local_runs.pushed_version(index))]
        assert "COMPLETE" in cells


@pytest.mark.e2e
def test_limit_keeps_the_newest(local_runs, capsys):
    argv = ["runs", "--local", "--root", str(local_runs.root), "--json", "--limit", "1"]
    rows = json.loads(output(capsys, argv))
    assert [r["run_id"] for r in rows] == [local_runs.run_id(1)]


# ---- runs as lineage records them ----------------------------------------------------------


def record(store: str, run_id: str, step: str, at: float, **kwargs) -> None:
    lineage.record_execution(
        store,
        step=step,
        pipeline_name="gptpipe",
        run_id=run_id,
        parameters={},
        inputs={},
        outputs=kwargs.pop("outputs", {}),
        start_time=at,
        end_time=at + 5,
        **kwargs,
    )


def artifact(type_name: str, uri: str, **properties) -> list[lineage.ArtifactRecord]:
    return [lineage.ArtifactRecord(type_name, uri, properties)]


def test_failed_diverged_and_rollback_runs_read_as_they_ended(tmp_path):
    store = str(tmp_path / "metadata.sqlite")
    version = "ab" * 32
    # A run whose training failed: tokenize done, nothing evaluated or pushed.
    record(store, "local-failed", "tokenize", 1000.0, dataset_version=version)
    record(store, "local-failed", "train", 1010.0, state="FAILED", dataset_version=version)
    # A run that diverged: its loss is stored as the string "nan", not blessed, not pushed.
    record(store, "local-diverged", "tokenize", 2000.0, dataset_version=version)
    record(
        store,
        "local-diverged",
        "evaluate",
        2010.0,
        dataset_version=version,
        outputs={
            "evaluation": artifact("ModelEvaluation", "/e", eval_nats_per_char=float("nan")),
            "blessing": artifact("ModelBlessing", "/b", blessed=0),
        },
    )
    record(
        store,
        "local-diverged",
        "push",
        2020.0,
        outputs={"pushed_model": artifact("PushedModel", "/p", pushed=0, pushed_version="0")},
    )
    # A rollback: one push, recorded as its own run, with no data.
    record(
        store,
        "rollback-3000",
        "push",
        3000.0,
        outputs={
            "pushed_model": artifact(
                "PushedModel", "/s/3", pushed=1, pushed_version="3", pushed_destination="/s"
            )
        },
    )
    # A run whose first step is still running.
    record(store, "local-running", "tokenize", 4000.0, state="RUNNING")

    rows = {row["run_id"]: row for row in lineage.list_runs(store)}
    assert list(rows) == ["local-running", "rollback-3000", "local-diverged", "local-failed"]
    failed = rows["local-failed"]
    assert (failed["state"], failed["dataset_version"]) == ("FAILED", version)
    assert (failed["eval_nats_per_char"], failed["blessed"], failed["pushed"]) == (None,) * 3
    assert (failed["start_time_ms"], failed["end_time_ms"]) == (1_000_000, 1_015_000)
    diverged = rows["local-diverged"]
    assert (diverged["state"], diverged["eval_nats_per_char"]) == ("COMPLETE", "nan")
    assert (diverged["blessed"], diverged["pushed"], diverged["pushed_version"]) == (
        False,
        False,
        None,
    )
    rollback = rows["rollback-3000"]
    assert (rollback["dataset_version"], rollback["pushed_version"]) == (None, 3)
    assert rollback["pushed_destination"] == "/s"
    running = rows["local-running"]
    assert (running["state"], running["end_time_ms"]) == ("RUNNING", None)
    assert runs_cmd.table_cells(running)[2] == "-"  # no duration yet
    assert runs_cmd.table_cells(diverged)[5:] == ("nan", "no", "no")
    assert runs_cmd.table_cells(failed)[5:] == ("-", "-", "-")
    assert json.loads(json.dumps([runs_cmd.json_row(r) for r in rows.values()]))


def test_a_store_without_runs_says_so(tmp_path, capsys):
    lineage.open_store(str(tmp_path / "metadata.sqlite"))  # an empty store
    assert "no runs recorded in" in output(capsys, ["runs", "--local", "--root", str(tmp_path)])
    assert json.loads(output(capsys, ["runs", "--local", "--root", str(tmp_path), "--json"])) == []


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["runs"], "use `gptpipe runs --local`"),
        (["runs", "--local", "--root", "gs://bucket/gptpipe"], "is on GCS"),
        (["runs", "--local", "--limit", "0"], "--limit 0: pass 1 or more"),
    ],
)
def test_what_cannot_be_listed_is_one_line(argv, expected):
    with pytest.raises(UserError, match=expected) as err:
        run(argv)
    assert "\n" not in str(err.value)


def test_a_root_without_a_store_is_named_and_no_store_is_made(tmp_path):
    with pytest.raises(UserError, match="no metadata store at .*metadata.sqlite") as err:
        run(["runs", "--local", "--root", str(tmp_path)])
    assert str(tmp_path) in str(err.value)
    assert list(tmp_path.iterdir()) == []  # reading never creates a store


@pytest.mark.fault("a local run's step killed (SIGKILL, OOM) or the run interrupted")
@pytest.mark.parametrize("ending", ["killed", "interrupted"])
def test_a_local_run_closes_the_step_a_kill_left_running(tmp_path, monkeypatch, ending):
    """The step reads FAILED with why, not RUNNING forever: no exit handler runs locally."""
    from pipelines.runners.local import runner as local_runner

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text\n" * 100, encoding="utf-8")
    run = local_runner.LocalRun(root=tmp_path, corpus=str(corpus))

    def pipeline_whose_train_dies(**arguments):
        # What a step's process leaves when it is SIGKILLed: its execution recorded RUNNING.
        record(run.metadata, run_id, "train", 1000.0, state="RUNNING")
        if ending == "killed":  # kfp.local: the task "finished with status FAILURE"
            raise RuntimeError("Task 'train' finished with status FAILURE")
        raise KeyboardInterrupt

    run_id = "local-killed"
    monkeypatch.setattr(local_runner, "build", lambda target, config: pipeline_whose_train_dies)
    expected = local_runner.PipelineFailed if ending == "killed" else KeyboardInterrupt
    with pytest.raises(expected) as raised:
        local_runner.run_local(run, run_id=run_id)
    (row,) = lineage.list_runs(run.metadata)
    assert row["state"] == "FAILED" and row["end_time_ms"] is not None
    (execution,) = lineage.run_summary(run.metadata, run_id)["executions"]
    assert execution["state"] == "FAILED"
    if ending == "killed":
        assert raised.value.step == "train" and "killed (out of memory" in raised.value.error


@pytest.mark.fault("a local run's step killed before it recorded anything")
def test_a_step_that_died_before_recording_reads_failed_not_complete(tmp_path, monkeypatch):
    """Evaluate's process killed while importing TensorFlow records nothing: the run would
    read COMPLETE from tokenize and train alone; kfp.local's error names the task."""
    from pipelines.runners.local import runner as local_runner

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text\n" * 100, encoding="utf-8")
    run = local_runner.LocalRun(root=tmp_path, corpus=str(corpus))
    run_id = "local-evaluate-died"

    def pipeline_whose_evaluate_dies_at_once(**arguments):
        record(run.metadata, run_id, "train", 1000.0)
        # kfp.local's pipeline_orchestrator.py log_and_maybe_raise_for_failure, coloured
        raise RuntimeError(
            "Pipeline \x1b[95m'gptpipe'\x1b[0m finished with status \x1b[91mFAILURE\x1b[0m. "
            "Inner task failed: \x1b[96m'evaluate'\x1b[0m."
        )

    monkeypatch.setattr(
        local_runner, "build", lambda target, config: pipeline_whose_evaluate_dies_at_once
    )
    with pytest.raises(local_runner.PipelineFailed) as raised:
        local_runner.run_local(run, run_id=run_id)
    assert raised.value.step == "evaluate"
    (row,) = lineage.list_runs(run.metadata)
    assert row["state"] == "FAILED"
    assert lineage.failure_of(run.metadata, run_id) == ("evaluate", local_runner.DIED_UNRECORDED)


def test_a_local_run_takes_only_the_signals_that_would_end_it_and_gives_them_back(monkeypatch):
    """SIGTERM and SIGHUP end the run as Ctrl-C does, but one already ignored (`nohup`, a
    shell's background job) stays ignored, and every handler is as it was afterwards."""
    import signal

    from pipelines.runners.local import runner as local_runner

    monkeypatch.setattr(local_runner, "_steps", list)  # no step runs: signal nothing of ours

    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {s: signal.getsignal(s) for s in sigs}
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with local_runner._stopped_as_by_ctrl_c():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
            assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
            with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
                signal.raise_signal(signal.SIGTERM)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def test_a_local_corpus_glob_is_recorded_absolute(tmp_path, monkeypatch):
    """Lineage keeps the corpus for `gptpipe reproduce`, which may list it from elsewhere."""
    from pipelines.runners.local import runner as local_runner

    monkeypatch.chdir(tmp_path)
    assert local_runner._absolute("data/*.txt") == str(tmp_path / "data" / "*.txt")
    assert local_runner._absolute("*.txt") == str(tmp_path / "*.txt")
    assert local_runner._absolute("data/a.txt") == str(tmp_path / "data" / "a.txt")
    assert local_runner._absolute("gs://b/data/*.txt") == "gs://b/data/*.txt"


# ---- the table in a terminal ---------------------------------------------------------------


def row(run_id: str = "local-fb31075708ae", **changed) -> lineage.RunRow:
    found = {
        "run_id": run_id,
        "pipeline_name": "gptpipe",
        "state": "COMPLETE",
        "start_time_ms": 1_700_000_000_000,
        "end_time_ms": 1_700_000_754_000,
        "dataset_version": "ab" * 32,
        "eval_nats_per_char": 2.0345,
        "blessed": True,
        "pushed": True,
        "pushed_version": 12,
        "pushed_destination": "/s",
        "steps": {},
    }
    return {**found, **changed}  # type: ignore[return-value]


ROWS = [
    row(),
    row("local-0123456789ab", state="CANCELED", end_time_ms=1_700_108_000_000, blessed=False),
    row("rollback-1700000000-abcdef", dataset_version=None, eval_nats_per_char=None),
]


def shown(rows: list, width: int) -> list[str]:
    """The table's lines as a `width`-column terminal (or a pipe, at 80) shows them."""
    from rich.console import Console

    console = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(runs_cmd.runs_table(rows, "/home/me/project/runs/metadata.sqlite", width))
    console.file.close()
    return console.export_text().splitlines()


@pytest.mark.parametrize("width", [80, 60])
def test_the_table_fits_the_terminal_and_breaks_no_word(width):
    lines = shown(ROWS, width)
    assert max(len(line) for line in lines) <= width
    header = next(line for line in lines if line.startswith("run "))
    kept = header.split()
    assert set(kept) <= set(runs_cmd.COLUMNS)  # each header whole, on one line
    assert kept == [name for name in runs_cmd.COLUMNS if name in kept]
    for run in ROWS:  # each run on one line, its id whole
        assert sum(run["run_id"] in line for line in lines) == 1
    left_out = [name for name in runs_cmd.COLUMNS if name not in kept]
    assert set(left_out) == set(runs_cmd.LEFT_OUT_FIRST[: len(left_out)])
    caption = " ".join(" ".join(lines).split())
    assert f"left out to fit: {', '.join(left_out)} (--json has all)" in caption


def test_a_wide_terminal_shows_every_column_and_an_80_column_one_all_but_took():
    assert shown(ROWS[:2], 120)[1].split() == list(runs_cmd.COLUMNS)
    assert shown(ROWS[:2], 80)[1].split() == [c for c in runs_cmd.COLUMNS if c != "took"]


def test_cells_are_short_enough_to_keep_whole():
    now = datetime.datetime.fromtimestamp(1_700_000_000).astimezone()
    cells = runs_cmd.table_cells(ROWS[1], now)
    assert cells[1:3] == (now.strftime("%m-%d %H:%M"), "30h00m")  # this year: to the minute
    next_year = now.replace(year=now.year + 1)
    assert runs_cmd.table_cells(ROWS[0], next_year)[1:3] == (now.strftime("%Y-%m-%d"), "12m34s")
