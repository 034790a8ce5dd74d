"""The run view of `gptpipe run --local`: its state from kfp.local's lines, the steps' progress
events and lineage; its frames; the output it keeps off the terminal; what the steps report.

A real run's view is checked in tests/pipelines/test_pipeline_e2e.py, on the e2e tests' own runs.
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from components.push import executor as push
from components.tokenize import executor as tokenize
from contracts.artifacts import MODEL_COMPLETE
from contracts.progress import Progress, read_events
from pipelines.runners.local import runner, watch
from pipelines.runners.local import view as run_view
from pipelines.runners.local.view import RunView
from tests.tiny import saved_model_graph

REPO = Path(__file__).resolve().parents[4]
NOW = 1_800_000_000.0  # a fixed "now", so frames and durations do not depend on the clock


def kfp(at: float, message: str) -> str:
    """A line as kfp.local logs it: local time to the millisecond, level, coloured names."""
    clock = time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at * 1000) % 1000:03d}"
    coloured = re.sub(r"('[^']*')", "\x1b[96m\\1\x1b[0m", message, count=1)
    return f"{clock} - INFO - {coloured}\n"


def started_and_ended(view: RunView, step: str, start: float, end: float, ok=True) -> None:
    run_view.apply_kfp_line(
        view, run_view.parse_kfp_line(kfp(start, f"Executing task '{step}'"), NOW)
    )
    status = "SUCCESS" if ok else "FAILURE"
    line = kfp(end, f"Task '{step}' finished with status \x1b[92m{status}\x1b[0m")
    run_view.apply_kfp_line(view, run_view.parse_kfp_line(line, NOW))


def event(step: str, at: float, **fields) -> dict:
    return {"step": step, "time": at, **fields}


def final_frame(view: RunView) -> list[str]:
    console = Console(record=True, width=120)
    console.print(run_view.render(view, NOW))
    return console.export_text().splitlines()


def row(frame: list[str], step: str) -> str:
    (found,) = [line for line in frame if line.split()[1:2] == [step]]
    return found


def test_the_final_frame_of_a_run_names_every_step_with_its_state_and_duration():
    view = RunView.new("local-0123456789ab", NOW - 100)
    started_and_ended(view, "tokenize", NOW - 99, NOW - 90)
    for done in (0, 600_000, 1_115_394):
        stage = {"kind": "progress", "unit": "bytes", "total": 1_115_394, "stage": "write"}
        run_view.apply_event(view, event("tokenize", NOW - 95, done=done, **stage))
    started_and_ended(view, "train", NOW - 90, NOW - 30)
    progress = {"kind": "progress", "unit": "steps", "total": 300, "tokens_per_s": 12_345.0}
    run_view.apply_event(view, event("train", NOW - 40, done=300, loss=1.87654, **progress))
    started_and_ended(view, "evaluate", NOW - 30, NOW - 10)
    started_and_ended(view, "push", NOW - 10, NOW - 5)
    run_view.apply_event(view, event("push", NOW - 6, kind="note", text="pushed as version 3"))
    run_view.finish(view, succeeded=True, now=NOW)

    frame = final_frame(view)
    assert "local-0123456789ab" in frame[0] and "done" in frame[0]
    for step in run_view.STEPS:
        assert row(frame, step).split()[2] == "done", frame
    assert "0:09" in row(frame, "tokenize") and "write 1.1 MB/1.1 MB" in row(frame, "tokenize")
    train = row(frame, "train")
    assert "1:00" in train and "300/300 steps · loss 1.877 · 12.3k tokens/s" in train
    assert "pushed as version 3" in row(frame, "push")
    assert "eta" not in "\n".join(frame)  # nothing is left to wait for


def test_a_failed_step_shows_its_error_and_the_steps_after_it_are_skipped():
    view = RunView.new("local-x", NOW - 50)
    started_and_ended(view, "tokenize", NOW - 49, NOW - 40)
    run_view.apply_kfp_line(
        view, run_view.parse_kfp_line(kfp(NOW - 40, "Executing task 'train'"), NOW)
    )
    failed = {
        "state": "FAILED",
        "properties": {"start_time_ms": (NOW - 38) * 1000, "error": "training diverged at step 7"},
    }
    run_view.apply_lineage(view, {"tokenize": {"state": "COMPLETE"}, "train": failed}, NOW - 20)
    run_view.finish(view, succeeded=False, now=NOW, failed_step="train")

    frame = final_frame(view)
    assert "failed" in frame[0]
    assert [row(frame, step).split()[2] for step in run_view.STEPS] == [
        "done",
        "failed",
        "skipped",
        "skipped",
    ]
    assert "training diverged at step 7" in row(frame, "train")
    assert "0:20" in row(frame, "train")  # from kfp.local's start to the failure lineage saw


def test_kfp_lines_are_read_through_their_colours_and_a_steps_own_lines_carry_no_news():
    starts = run_view.parse_kfp_line(kfp(NOW - 5.25, "Executing task 'evaluate'"), NOW)
    assert (starts.starts, starts.at) == ("evaluate", NOW - 5.25)
    assert "\x1b" not in starts.text
    ends = run_view.parse_kfp_line(
        kfp(NOW - 1, "Task 'push' finished with status \x1b[91mFAILURE\x1b[0m"), NOW
    )
    assert (ends.ends, ends.status) == ("push", "FAILURE")
    own = run_view.parse_kfp_line("    Executing task 'train' (a step printed this)\n", NOW)
    assert (own.starts, own.ends, own.at) == ("", "", None)
    # A line stamped just before midnight and read just after it is from the day before.
    late = time.mktime(time.strptime("2027-01-14 23:59:59", "%Y-%m-%d %H:%M:%S"))
    line = run_view.parse_kfp_line("23:59:59.500 - INFO - Executing task 'train'", late + 1.0)
    assert line.at == late + 0.5


def test_progress_gives_an_eta_from_the_rate_of_the_current_stage():
    view = RunView.new("local-x", NOW - 60)
    started_and_ended(view, "tokenize", NOW - 60, NOW - 50)
    run_view.apply_kfp_line(
        view, run_view.parse_kfp_line(kfp(NOW - 50, "Executing task 'train'"), NOW)
    )
    steps = {"kind": "progress", "unit": "steps", "total": 1000}
    run_view.apply_event(view, event("train", NOW - 40, done=100, **steps))
    run_view.apply_event(view, event("train", NOW - 20, done=300, loss=4.5, **steps))
    train = view.steps["train"]
    assert train.eta(NOW - 20) == 70.0  # 700 steps at 10 steps/s
    assert train.eta(NOW) == 50.0  # 20 s later, with no news
    frame = final_frame(view)
    assert "300/1,000 steps · loss 4.5 · eta 0:50" in row(frame, "train")
    assert row(frame, "train").split()[2] == "running"
    # A new stage is measured afresh: its rate is unknown until its second report.
    run_view.apply_event(view, event("train", NOW - 1, done=5, stage="export", **steps))
    assert train.eta(NOW) is None


def test_lineage_marks_a_step_kfp_served_from_its_cache_as_cached():
    view = RunView.new("local-x", NOW - 10)
    started_and_ended(view, "train", NOW - 9, NOW - 8)
    cached = {"state": "CACHED", "properties": {"start_time_ms": 1, "end_time_ms": 1}}
    run_view.apply_lineage(view, {"train": cached}, NOW)
    assert view.steps["train"].state == "cached"
    assert view.steps["train"].duration(NOW) == 1.0  # kfp.local's own times are kept


def test_lineage_times_only_the_steps_kfp_local_has_said_nothing_of():
    view = RunView.new("local-x", NOW - 10)
    run_view.apply_kfp_line(
        view, run_view.parse_kfp_line(kfp(NOW - 9, "Executing task 'train'"), NOW)
    )
    complete = {"state": "COMPLETE", "properties": {"end_time_ms": (NOW - 5) * 1000}}
    running = {"state": "RUNNING", "properties": {"start_time_ms": (NOW - 3) * 1000}}
    run_view.apply_lineage(view, {"train": complete, "evaluate": running}, NOW - 4)
    # The train process is still exiting: kfp.local says when it finished.
    assert (view.steps["train"].state, view.steps["train"].ended) == ("running", None)
    assert view.steps["evaluate"].state == "running"
    assert view.steps["evaluate"].duration(NOW) == 3.0


def test_plain_lines_say_each_change_of_state_and_each_quarter_of_progress():
    view, plain = RunView.new("local-x", NOW - 10), run_view.PlainLines()
    run_view.apply_kfp_line(
        view, run_view.parse_kfp_line(kfp(NOW - 9, "Executing task 'train'"), NOW)
    )
    said = plain.lines(view, NOW)
    for done in (10, 20, 30, 60, 61, 100):
        run_view.apply_event(
            view, event("train", NOW - 5, kind="progress", done=done, total=100, unit="steps")
        )
        said += plain.lines(view, NOW)
    started_and_ended(view, "train", NOW - 9, NOW - 1)
    said += plain.lines(view, NOW)
    assert said == [
        "train: running",
        "train: 10/100 steps",
        "train: 30/100 steps",
        "train: 60/100 steps",
        "train: 100/100 steps",
        "train: done in 0:08",
    ]


def test_the_watcher_cuts_kfp_locals_output_into_one_log_per_step(tmp_path):
    logs = runner.RunLogs(tmp_path / "logs" / "local-x", tmp_path / "workers")
    logs.folder.mkdir(parents=True)
    logs.kfp_local.write_text(
        kfp(NOW - 9, "Running pipeline: 'gptpipe'")
        + kfp(NOW - 9, "Executing task 'tokenize'")
        + "    tokenize: reading\n"
        + kfp(NOW - 8, "Task 'tokenize' finished with status SUCCESS")
        + kfp(NOW - 8, "Executing task 'train'")
        + "    [worker-0] step 1\n"
        + "    [worker-0] step 2 still being writ",  # a line not yet whole waits
        encoding="utf-8",
    )
    Progress(str(logs.events), "train").update(2, 30, "steps", final=True, loss=5.5)
    shown = []
    watcher = watch.Watcher(
        RunView.new("local-x", NOW - 10),
        logs,
        str(tmp_path / "metadata.sqlite"),
        lambda view, now: shown.append(view.steps["train"].state),
    )
    watcher.poll(NOW, with_lineage=False)
    states = [s.state for s in watcher.view.steps.values()]
    assert states == ["done", "running", "waiting", "waiting"]
    assert watcher.view.steps["train"].numbers["loss"] == 5.5
    with logs.kfp_local.open("a", encoding="utf-8") as f:
        f.write("ten\n" + kfp(NOW - 1, "Task 'train' finished with status SUCCESS"))
    watcher.stop(succeeded=True)
    assert shown == ["done"]
    assert logs.step("tokenize").read_text().splitlines()[1] == "tokenize: reading"
    train = logs.step("train").read_text().splitlines()
    assert train[1:3] == ["[worker-0] step 1", "[worker-0] step 2 still being written"]
    assert "finished with status SUCCESS" in train[3] and "\x1b" not in train[3]


def test_captured_output_keeps_everything_but_the_view_off_the_terminal(tmp_path):
    # A process of its own, so that its stdout is file descriptor 1, as in a terminal.
    script = (
        "import logging, os, subprocess, sys\n"
        "from pathlib import Path\n"
        "from pipelines.runners.local.runner import captured_output\n"
        "with captured_output(Path(sys.argv[1])) as terminal:\n"
        "    print('print to sys.stdout')\n"
        "    print('print to sys.stderr', file=sys.stderr)\n"
        "    logging.getLogger().addHandler(logging.StreamHandler(sys.stdout))\n"
        "    logging.warning('a log record')\n"
        "    os.write(1, b'fd 1\\n'); os.write(2, b'fd 2\\n')\n"
        "    subprocess.run(['echo', 'a child'])\n"
        "    terminal.write('the view\\n')\n"
        "print('after the run')\n"
    )
    log = tmp_path / "kfp-local.log"
    done = subprocess.run(
        [sys.executable, "-c", script, str(log)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "the view\nafter the run\n"
    assert done.stderr == ""
    kept = log.read_text().splitlines()
    for line in ("print to sys.stdout", "print to sys.stderr", "a log record", "fd 1", "fd 2"):
        assert line in kept
    assert "a child" in kept


def test_json_outcome_of_a_failed_run_names_the_step_its_error_and_its_log(tmp_path):
    logs = runner.RunLogs(tmp_path / "logs" / "local-x", tmp_path / "workers")
    logs.folder.mkdir(parents=True)
    logs.step("tokenize").write_text("its output\n")
    view = RunView.new("local-x", NOW - 10)
    started_and_ended(view, "tokenize", NOW - 9, NOW - 2, ok=False)
    run_view.finish(view, succeeded=False, now=NOW)
    failure = runner.PipelineFailed(
        "step 'tokenize' failed: corpus 'x' is empty", "tokenize", "corpus 'x' is empty"
    )
    found = json.loads(json.dumps(watch.outcome_json(watch.Outcome(view, logs, None, failure))))
    assert found["state"] == "failed" and found["run_id"] == "local-x"
    assert found["error"] == {
        "step": "tokenize",
        "message": "corpus 'x' is empty",
        "log": str(logs.step("tokenize")),
    }
    assert found["steps"]["tokenize"] == {
        "state": "failed",
        "duration_s": 7.0,
        "log": str(logs.step("tokenize")),
    }
    assert found["steps"]["push"]["state"] == "skipped"
    assert found["steps"]["push"]["log"] == str(logs.kfp_local)  # it printed nothing
    assert found["logs"] == {"kfp_local": str(logs.kfp_local), "folder": str(logs.folder)}
    assert found["blessed"] is None and found["pushed_version"] is None


def test_a_failure_with_a_log_tail_is_told_by_its_summary(tmp_path):
    # A launcher's error: its summary, then the failing worker's last lines (format_failure).
    logs = runner.RunLogs(tmp_path / "logs" / "local-x", tmp_path / "workers")
    view = RunView.new("local-x", NOW - 10)
    error = (
        "job train-x did not finish within the launcher's timeout; deleted it\n"
        "last lines of worker-0's log:\n"
        "  | step 275 loss 2.31"
    )
    failure = runner.PipelineFailed(f"step 'train' failed: {error}", "train", error)
    outcome = watch.Outcome(view, logs, None, failure)
    assert outcome.error == "job train-x did not finish within the launcher's timeout; deleted it"


# ---- what the steps report ------------------------------------------------------------------


def test_tokenize_reports_the_corpus_bytes_through_each_stage(tmp_path):
    text = (REPO / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")[:30_000]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text[: text.rindex("\n") + 1], encoding="utf-8")
    size = corpus.stat().st_size
    events = tmp_path / "progress.jsonl"
    options = {"vocab_size": 340, "seq_len": 32, "progress": False}
    reporter = Progress(str(events), "tokenize")
    tokenize.run_content_addressed(str(corpus), str(tmp_path / "d"), reporter=reporter, **options)
    found, _ = read_events(str(events))
    bytes_ = [e for e in found if e["kind"] == "progress"]
    assert {e["unit"] for e in bytes_} == {"bytes"} and {e["total"] for e in bytes_} == {size}
    assert [e["stage"] for e in bytes_ if e["done"] == size] == ["read", "encode", "write"]
    assert all(0 <= e["done"] <= size for e in bytes_)
    assert any("training SentencePiece BPE" in e["text"] for e in found if e["kind"] == "note")

    again = tmp_path / "again.jsonl"
    reporter = Progress(str(again), "tokenize")
    tokenize.run_content_addressed(str(corpus), str(tmp_path / "d"), reporter=reporter, **options)
    found, _ = read_events(str(again))
    assert "reusing dataset" in found[0]["text"]
    assert (found[1]["done"], found[1]["total"], found[1]["stage"]) == (size, size, "reused")


def test_push_reports_the_objects_it_publishes(tmp_path):
    saved = tmp_path / "model" / "Format-Serving"
    (saved / "variables").mkdir(parents=True)
    (saved / "saved_model.pb").write_bytes(saved_model_graph("graph"))
    for name in ("variables/variables.index", "variables/variables.data"):
        (saved / name).write_bytes(b"bytes")
    (tmp_path / "model" / MODEL_COMPLETE).write_text("")  # the export's last write
    (tmp_path / "blessing").mkdir()
    (tmp_path / "blessing" / "BLESSED").write_text("")
    (tmp_path / "blessing" / "blessing.json").write_text(json.dumps({"reason": "better"}))
    events = tmp_path / "progress.jsonl"
    push.run(
        str(tmp_path / "model"),
        str(tmp_path / "blessing"),
        str(tmp_path / "serving"),
        str(tmp_path / "pushed"),
        reporter=Progress(str(events), "push"),
    )
    found, _ = read_events(str(events))
    assert [(e.get("done"), e.get("total"), e.get("unit")) for e in found[:2]] == [
        (0, 3, "objects"),
        (3, 3, "objects"),
    ]
    assert found[2]["text"] == "pushed as version 1"


def test_an_event_too_long_to_append_whole_is_shortened_and_the_next_one_still_read(tmp_path):
    """Events are appended in one write(2) of at most PIPE_BUF bytes; a longer note is shortened
    (a line cut there would lose its newline and take the next event with it)."""
    events = tmp_path / "progress.jsonl"
    reporter = Progress(str(events), "push")
    reporter.note("é" * 5000)
    reporter.note("pushed as version 3")
    found, _ = read_events(str(events))
    assert [e["text"][:3] for e in found] == ["ééé", "pus"]
    assert found[0]["text"].endswith("…") and len(events.read_bytes().split(b"\n")[0]) <= 4096
    reporter.update(5, 9, "objects", final=True, stage="x" * 5000)  # keeps what the bar needs
    last = read_events(str(events))[0][-1]
    assert (last["done"], last["total"], last["unit"]) == (5, 9, "objects") and "stage" not in last


def test_a_training_that_diverged_shows_where_it_stopped_not_a_full_bar():
    """A done step's bar is filled (its last progress may be unsent), but not past a divergence,
    where training stopped (the trainer sends that event unthrottled)."""
    view = RunView.new("local-x", NOW - 60)
    steps = {"kind": "progress", "unit": "steps", "total": 1000}
    run_view.apply_event(view, event("train", NOW - 30, done=300, loss=float("nan"), **steps))
    started_and_ended(view, "train", NOW - 50, NOW - 10)
    assert "300/1,000 steps · loss nan" in row(final_frame(view), "train")
    run_view.apply_event(view, event("tokenize", NOW - 30, done=3, loss=2.0, **steps))
    started_and_ended(view, "tokenize", NOW - 50, NOW - 10)
    assert "1,000/1,000 steps" in row(final_frame(view), "tokenize")
