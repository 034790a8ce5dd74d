"""The whole pipeline through kfp.local, twice, on a slice of the bundled corpus.

The first run has no baseline and is pushed as version 1. The second run diverges on purpose
(NaN loss): it finds version 1 as its baseline, is not blessed, and pushes nothing.

The first runs as `gptpipe run --local` on a terminal (a pseudo-terminal), so its screen shows
the live run view; the second through the CLI with `--json`.
"""

import contextlib
import fcntl
import io
import json
import os
import re
import select
import sqlite3
import struct
import subprocess
import sys
import termios
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from ml_metadata.proto import metadata_store_pb2 as mlmd

from components import lineage
from contracts.params import EvalPolicy, TrainJob
from pipelines.cli import main as cli
from pipelines.runners.local.view import STEPS
from tests.tiny import PIPELINE_SMALL
from trainer.config import config_to_dict, resolve_config

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SMALL = PIPELINE_SMALL


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    text = (REPO / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")
    path = tmp_path_factory.mktemp("corpus") / "slice.txt"
    path.write_text(text[:120_000], encoding="utf-8")
    return path


# `gptpipe run --local` once its options are parsed, with the blessing threshold of these
# tests (the CLI has no option for it), so that the first model is pushed.
ON_A_TERMINAL = (
    "import sys\n"
    "from contracts.params import EvalPolicy\n"
    "from pipelines.cli import run as run_cmd\n"
    "from pipelines.runners.local import runner\n"
    "from trainer.config import resolve_config\n"
    "root, corpus, *overrides = sys.argv[1:]\n"
    "run = runner.LocalRun(root=root, corpus=corpus, eval_policy=EvalPolicy(5.0),\n"
    "                      config=resolve_config('tiny', overrides))\n"
    "sys.exit(run_cmd.run_and_report(run, 'auto'))\n"
)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
ERASE_LINE = "\x1b[2K"  # rich's Live erases its last frame line by line before drawing the next


@dataclass(frozen=True)
class Runs:
    root: Path
    first: dict  # lineage's run summaries
    second: dict
    screen: str  # everything the first run wrote to its terminal
    reported: dict  # what the second run printed with --json


def on_a_terminal(argv: list[str], columns: int = 120, timeout: float = 900) -> tuple[int, str]:
    """Run `argv` with a pseudo-terminal as its stdin, stdout and stderr; its exit status and
    everything it wrote there."""
    screen, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PYTHONWARNINGS": "ignore::FutureWarning",  # as `gptpipe` filters google's
        "TERM": "xterm-256color",
    }
    for name in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE"):
        env.pop(name, None)
    proc = subprocess.Popen(argv, stdin=terminal, stdout=terminal, stderr=terminal, env=env)
    os.close(terminal)
    written, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([screen], [], [], 0.5)[0]:
            try:
                data = os.read(screen, 1 << 16)
            except OSError:  # EIO: the terminal's last writer closed it
                break
            if not data:
                break
            written.append(data)
        elif proc.poll() is not None:
            break
    proc.kill()
    code = proc.wait()
    os.close(screen)
    return code, b"".join(written).decode("utf-8", errors="replace").replace("\r", "")


def final_frame(screen: str) -> list[str]:
    """The lines the live view drew last (what the terminal keeps), then what followed."""
    return ANSI.sub("", screen[screen.rindex(ERASE_LINE) :]).splitlines()


def sets(overrides: tuple[str, ...]) -> list[str]:
    return [arg for override in overrides for arg in ("--set", override)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus) -> Runs:
    root = tmp_path_factory.mktemp("runs")
    code, screen = on_a_terminal(
        [sys.executable, "-c", ON_A_TERMINAL, str(root), str(corpus), *SMALL]
    )
    assert code == 0, screen[-3000:]
    store = str(root / "metadata.sqlite")
    first = lineage.run_summary(store, lineage.latest_run_id(store, "gptpipe"))
    diverging = SMALL + ("train.learning_rate=1e9",)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = cli.main(
            ["run", "--local", "--root", str(root), "--corpus", str(corpus), "--workers", "2"]
            + sets(diverging)
            + ["--json"]
        )
    assert code == 0, printed.getvalue()
    reported = json.loads(printed.getvalue())  # stdout holds the one JSON object, nothing else
    second = lineage.run_summary(store, reported["run_id"])
    return Runs(root, first, second, screen, reported)


@pytest.fixture(scope="module")
def two_runs(runs):
    return runs.root, runs.first, runs.second


def outputs(summary, step, key):
    return summary["steps"][step]["outputs"][key][0]["properties"]


def test_first_run_is_blessed_and_pushed(two_runs):
    root, first, _ = two_runs
    assert len(first["dataset_version"]) == 64
    assert [e["state"] for e in first["executions"]] == ["COMPLETE"] * 4
    blessing = outputs(first, "evaluate", "blessing")
    assert blessing["blessed"] == 1 and "no baseline" in blessing["reason"]
    pushed = outputs(first, "push", "pushed_model")
    assert (pushed["pushed"], pushed["pushed_version"]) == (1, "1")
    version = root / "serving" / "gpt" / "1"
    assert (version / "saved_model.pb").is_file() and (version / "variables").is_dir()


def test_pushed_model_answers_generate_and_score(two_runs):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    root, _, _ = two_runs
    model = tf.saved_model.load(str(root / "serving" / "gpt" / "1"))
    out = model.signatures["generate"](
        prompt=tf.constant(["ROMEO:"]),
        max_new_tokens=tf.constant(8),
        temperature=tf.constant(0.0),
        stop_at_eos=tf.constant(False),
    )
    assert out["completion"].shape == (1,) and out["completion"][0].numpy()
    scored = model.signatures["score"](text=tf.constant(["To be, or not to be."]))
    assert 0 < float(scored["nats_per_char"][0]) < 10


def test_second_run_uses_first_as_baseline_and_divergence_is_not_blessed(two_runs):
    root, first, second = two_runs
    assert second["dataset_version"] == first["dataset_version"]
    blessing = outputs(second, "evaluate", "blessing")
    assert blessing["blessed"] == 0 and "diverged" in blessing["reason"]
    assert blessing["baseline_model"] == str(root / "serving" / "gpt" / "1")
    assert outputs(second, "push", "pushed_model")["pushed"] == 0
    assert sorted(p.name for p in (root / "serving" / "gpt").iterdir()) == [".claims", "1"]


def test_lineage_links_the_pushed_model_to_its_data(two_runs):
    root, first, _ = two_runs
    from pipelines.cli import lineage as lineage_cmd

    store = str(root / "metadata.sqlite")
    chain = lineage_cmd.trace(store, str(root / "serving" / "gpt" / "1"))
    assert chain["examples"]["properties"]["dataset_version"] == first["dataset_version"]
    assert chain["train"]["properties"]["run_id"] == first["run_id"]
    assert len(lineage.models_for_dataset(store, first["dataset_version"])) == 2
    with sqlite3.connect(store) as db:
        (count,) = db.execute("select count(*) from Execution").fetchone()
    assert count == 8


def test_artifacts_follow_tfx_layouts(two_runs):
    root, first, _ = two_runs
    examples_uri = first["steps"]["tokenize"]["outputs"]["examples"][0]["uri"]
    examples = Path(examples_uri)
    manifest = json.loads((examples / "manifest.json").read_text())
    assert manifest["dataset_version"] == first["dataset_version"]
    assert list((examples / "Split-train").glob("data_tfrecord-*.gz"))
    assert list((examples / "Split-eval").glob("data_tfrecord-*.gz"))
    model_uri = first["steps"]["train"]["outputs"]["model"][0]["uri"]
    assert (Path(model_uri) / "Format-Serving" / "saved_model.pb").is_file()
    leftovers = [p for p in root.rglob(".*.tmp-*")]
    assert leftovers == []


def test_raw_mlmd_from_the_pushed_uri_reaches_examples_and_train_provenance(two_runs):
    root, first, second = two_runs
    store = lineage.open_store(str(root / "metadata.sqlite"))

    def producer(artifact_id):
        (event,) = [
            e
            for e in store.get_events_by_artifact_ids([artifact_id])
            if e.type == mlmd.Event.OUTPUT
        ]
        return store.get_executions_by_id([event.execution_id])[0]

    def inputs(execution_id):
        events = [
            e
            for e in store.get_events_by_execution_ids([execution_id])
            if e.type == mlmd.Event.INPUT
        ]
        by_id = {a.id: a for a in store.get_artifacts_by_id([e.artifact_id for e in events])}
        return {e.path.steps[0].key: by_id[e.artifact_id] for e in events}

    (pushed,) = store.get_artifacts_by_uri(str(root / "serving" / "gpt" / "1"))
    train = producer(inputs(producer(pushed.id).id)["model"].id)
    props = train.custom_properties
    assert props["run_id"].string_value == first["run_id"]
    assert props["image"].string_value == "local-python-environment"
    assert props["unpinned"].int_value == 1 and "image_digest" not in props
    assert json.loads(props["worker_image_digests"].string_value) == {}  # local processes
    assert props["trainer_image"].string_value == "local-python-environment"
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?|unknown", props["code_version"].string_value)
    assert props["config_hash"].string_value == outputs(first, "train", "model")["config_hash"]
    examples = inputs(train.id)["examples"]
    assert examples.custom_properties["dataset_version"].string_value == first["dataset_version"]
    (source,) = json.loads(examples.custom_properties["sources"].string_value)
    assert source["size"] == 120_000 and len(source["sha256"]) == 64
    assert examples.custom_properties["tokens"].int_value > 0
    # Every execution of both runs carries its provenance and times.
    for execution in store.get_executions():
        p = execution.custom_properties
        assert {
            "image",
            "code_version",
            "environment_digest",
            "parameters",
            "start_time_ms",
            "end_time_ms",
        } <= set(p), p["step"].string_value
    # Two runs on the same data share one dataset context.
    context = store.get_context_by_type_and_name("dataset_version", first["dataset_version"])
    runs = {
        e.custom_properties["run_id"].string_value
        for e in store.get_executions_by_context(context.id)
    }
    assert runs == {first["run_id"], second["run_id"]}


def test_lineage_json_and_reproduce_from_a_local_run(two_runs, tmp_path, capsys):
    root, first, _ = two_runs
    pushed = str(root / "serving" / "gpt" / "1")
    assert cli.main(["lineage", pushed, "--root", str(root), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["pushed_model"]["uri"], out["pushed_model"]["version"]) == (pushed, "1")
    assert out["train"]["run_id"] == first["run_id"]
    assert (out["train"]["image"], out["train"]["unpinned"]) == ("local-python-environment", 1)
    # The config travels resolved: lineage holds its values, not a preset name and overrides.
    assert out["train"]["parameters"]["config"] == config_to_dict(resolve_config("tiny", SMALL))
    assert out["train"]["gpu_hours"] == 0
    assert out["examples"]["dataset_version"] == first["dataset_version"]
    assert out["tokenize"]["state"] == "COMPLETE"
    assert out["evaluation"]["blessed"] == 1 and out["evaluation"]["baseline_model"] is None
    assert out["evaluation"]["metrics"]["eval_nats_per_char"] == pytest.approx(
        outputs(first, "evaluate", "evaluation")["eval_nats_per_char"]
    )
    assert cli.main(["lineage", "--latest", "--root", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pushed_model"]["uri"] == pushed

    target = tmp_path / "again.yaml"
    assert cli.main(["reproduce", pushed, "--root", str(root), "--output", str(target)]) == 2
    assert "has no digest" in capsys.readouterr().err
    assert (
        cli.main(
            ["reproduce", pushed, "--root", str(root), "--output", str(target), "--allow-unpinned"]
        )
        == 0
    )
    arguments = json.loads(target.with_suffix(".params.json").read_text())["arguments"]
    assert arguments["config"] == config_to_dict(resolve_config("tiny", SMALL))
    assert "overrides" not in arguments
    job, policy = TrainJob.from_dict(arguments["train_job"]), arguments["eval_policy"]
    assert (job.workers, job.launcher, job.gpus_per_worker) == (2, "local", 0)
    assert EvalPolicy.from_dict(policy).max_nats_per_char == 5.0


def test_second_run_reuses_the_content_addressed_examples(two_runs):
    root, first, second = two_runs
    uri = first["steps"]["tokenize"]["outputs"]["examples"][0]["uri"]
    assert uri == str(root / "pipeline_root" / "datasets" / first["dataset_version"])
    assert second["steps"]["tokenize"]["outputs"]["examples"][0]["uri"] == uri
    assert first["steps"]["tokenize"]["properties"]["reused"] == 0
    assert second["steps"]["tokenize"]["properties"]["reused"] == 1


# ---- what the runs showed -------------------------------------------------------------------

# What kfp.local prints of each task: its executor input as JSON, its output artifacts.
DUMP_MARKERS = (
    "executor_input",
    "executorInput",
    '"parameterValues"',
    "inputs.parameters",
    '"outputFile"',
    '"artifacts"',
    "Streamed logs",
    "uri='",
)


def test_a_run_on_a_terminal_shows_its_steps_not_kfp_local_output(runs):
    lines = ANSI.sub("", runs.screen).splitlines()
    assert [line for line in lines if any(m in line for m in DUMP_MARKERS)] == []
    assert not [line for line in lines if "[worker-" in line or "tensorflow" in line]
    frame = final_frame(runs.screen)
    assert runs.first["run_id"] in frame[0] and "done" in frame[0]
    for step in STEPS:
        assert [line for line in frame if re.match(rf"^\S +{step} +done +\d+:\d\d ", line)], frame
    assert "pushed as version 1" in "\n".join(frame)
    logs = runs.root / "logs" / runs.first["run_id"]
    assert f"kfp.local's output: {logs / 'kfp-local.log'}" in lines
    workers = runs.root / "pipeline_root" / "work" / runs.first["run_id"] / "train" / "worker-logs"
    assert f"trainer workers' logs: {workers}" in lines
    assert list(workers.glob("attempt-1/worker-*.log"))


def test_the_logs_hold_what_kfp_local_printed(runs):
    logs = runs.root / "logs" / runs.first["run_id"]
    kfp_local = ANSI.sub("", (logs / "kfp-local.log").read_text(encoding="utf-8"))
    for step in STEPS:
        assert f"Executing task '{step}'" in kfp_local
        assert f"Task '{step}' finished with status SUCCESS" in kfp_local
        own = (logs / f"{step}.log").read_text(encoding="utf-8")
        assert f"Executing task '{step}'" in own and '"pipeline_name": "gptpipe"' in own
    assert "Got executor_input" in kfp_local  # the dumps the terminal was spared
    assert "[worker-0]" in (logs / "train.log").read_text(encoding="utf-8")
    events = [json.loads(line) for line in (logs / "progress.jsonl").read_text().splitlines()]
    assert {e["step"] for e in events} >= {"tokenize", "push"}


def test_json_output_names_each_step_the_results_and_the_logs(runs):
    reported, second = runs.reported, runs.second
    assert reported["run_id"] == second["run_id"] and reported["state"] == "succeeded"
    assert reported["error"] is None
    assert {step: s["state"] for step, s in reported["steps"].items()} == dict.fromkeys(
        STEPS, "done"
    )
    assert all(s["duration_s"] > 0 for s in reported["steps"].values())
    assert reported["duration_s"] >= sum(s["duration_s"] for s in reported["steps"].values())
    assert reported["dataset_version"] == second["dataset_version"]
    assert reported["blessed"] is False and "diverged" in reported["blessing_reason"]
    assert reported["pushed_version"] is None and reported["pushed_to"] is None
    evaluation = outputs(second, "evaluate", "evaluation")
    assert str(reported["eval_nats_per_char"]) == str(evaluation["eval_nats_per_char"])
    for step in STEPS:
        assert Path(reported["steps"][step]["log"]).is_file()
    assert Path(reported["logs"]["kfp_local"]).is_file()
    assert Path(reported["logs"]["workers"]).is_dir()
