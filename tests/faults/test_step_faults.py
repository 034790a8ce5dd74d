"""Fault rows of the reliability matrix for the steps themselves (docs/reliability.md).

A damaged TFRecord shard, a loss that becomes NaN, an evaluate that crashes, a disk that fills
while tokenize writes shards, and tokenize killed between two shards. Each row checks the one
line a user reads, that nothing half-written is left where a later step or run would take it,
and, where it applies, that running again succeeds.

The two tokenize rows run the step in a child process: one under a file size limit
(RLIMIT_FSIZE, with SIGXFSZ ignored so that writes fail with EFBIG, as on a full disk), one
killed with SIGKILL once its first shard is written.
"""

from __future__ import annotations

import errno
import io
import json
import math
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components import kfp_metadata, serving
from components.evaluate import executor as evaluate
from components.jobs.errors import LaunchError
from components.jobs.local import LocalLauncher
from components.push import executor as push
from components.tokenize import executor as tokenize
from components.train import executor as train_step
from contracts.artifacts import (
    EVAL_TEXT,
    EXAMPLES_MANIFEST,
    SAVED_MODEL_FILE,
    SERVING_DIR,
    TRAIN_METRICS,
)
from contracts.blessing import ModelBlessing
from contracts.errors import UserError
from contracts.params import EvalPolicy
from tests.processes import signal_group
from tests.tiny import SEQ_LEN, TINY_OVERRIDES, VOCAB_SIZE, tiny_corpus
from trainer import data, shard_check
from trainer.config import config_to_dict, resolve_config
from trainer.task import main as trainer_main

REPO = Path(__file__).resolve().parents[2]
TOKENIZE = {"vocab_size": VOCAB_SIZE, "seq_len": SEQ_LEN, "progress": False}
SHARD_WINDOWS = 256  # the tiny corpus's 860 train windows make 4 shards


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tokenize.Dataset:
    """The tiny corpus tokenized by the tokenize step, in 4 train shards and 1 eval shard."""
    root = tmp_path_factory.mktemp("tokenized")
    corpus = root / "corpus.txt"
    corpus.write_text(tiny_corpus(), encoding="utf-8")
    found = tokenize.run_content_addressed(
        str(corpus), str(root / "datasets"), shard_windows=SHARD_WINDOWS, **TOKENIZE
    )
    assert len(found.manifest.splits["train"].shards) == 4
    return found


# ---- a damaged TFRecord shard: the trainer names it ----------------------------------------


def _flip_middle(shard: Path) -> None:
    blob = bytearray(shard.read_bytes())
    middle = len(blob) // 2
    blob[middle : middle + 16] = bytes(b ^ 0xFF for b in blob[middle : middle + 16])
    shard.write_bytes(bytes(blob))


def _cut_half(shard: Path) -> None:
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


def _cut_trailer(shard: Path) -> None:
    # TensorFlow reads a GZIP file without its CRC-32 and length trailer without any error.
    shard.write_bytes(shard.read_bytes()[:-8])


def _empty(shard: Path) -> None:
    shard.write_bytes(b"")


def _damaged_copy(dataset: tokenize.Dataset, tmp_path: Path, damage) -> tuple[Path, Path]:
    """A copy of the Examples whose second train shard `damage` changed; (examples, shard)."""
    examples = tmp_path / "examples"
    shutil.copytree(dataset.uri, examples)
    shard = examples / dataset.manifest.splits["train"].shards[1]
    damage(shard)
    return examples, shard


@pytest.mark.parametrize(
    "damage, why",
    [
        pytest.param(
            _flip_middle,
            "while decompressing data",
            marks=pytest.mark.fault("a train shard with 16 bytes flipped in its middle"),
        ),
        pytest.param(
            _cut_half,
            "truncated",
            marks=pytest.mark.fault("a train shard cut in half"),
        ),
        pytest.param(
            _cut_trailer,
            "truncated",
            marks=pytest.mark.fault("a train shard cut at its GZIP trailer"),
        ),
        pytest.param(
            _empty,
            "the file is empty",
            marks=pytest.mark.fault("a train shard emptied"),
        ),
    ],
    ids=["flipped", "cut-half", "cut-trailer", "empty"],
)
def test_the_trainer_names_a_damaged_shard_in_one_line_before_any_step(
    dataset, tmp_path, capsys, damage, why
):
    examples, shard = _damaged_copy(dataset, tmp_path, damage)
    cfg = resolve_config("tiny", TINY_OVERRIDES)
    code = trainer_main(
        [
            "--examples",
            str(examples),
            "--model-dir",
            str(tmp_path / "model"),
            "--work-dir",
            str(tmp_path / "work"),
            "--config-json",
            json.dumps(config_to_dict(cfg)),
        ]
    )
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(said) == 1, err
    assert said[0].startswith(f"error: corrupt TFRecord shard {shard}: "), said[0]
    assert why in said[0] and f"delete the folder {examples} and run again" in said[0]
    assert "Traceback" not in err
    assert not (tmp_path / "model").exists()


@pytest.mark.slow
@pytest.mark.fault("a train shard with bytes flipped, trained by 2 workers of the train step")
def test_the_train_step_fails_with_the_damaged_shard_as_its_first_line(dataset, tmp_path):
    examples, shard = _damaged_copy(dataset, tmp_path, _flip_middle)
    model, work = tmp_path / "model", tmp_path / "work"
    cfg = resolve_config("tiny", TINY_OVERRIDES)
    spec = train_step.job_spec(
        str(examples), str(model), str(work), cfg, launcher="local", run_id="shard", workers=2
    )
    launcher = LocalLauncher(log_dir=tmp_path / "logs", out=io.StringIO(), kill_grace_seconds=2)
    with pytest.raises(LaunchError) as raised:
        train_step.run(spec, cfg, str(model), str(work), launcher)
    failed = raised.value
    first = str(failed).splitlines()[0]
    # The 4 train shards hold 3 full ones and a remainder: too uneven to give each worker its
    # own (data.pipeline_shards), so both read every shard and either may find the damage first.
    who = failed.replica
    assert who in ("worker-0", "worker-1")
    assert first.startswith(f"job {spec.name} failed: {who} exited with code 2: "), first
    assert f"corrupt TFRecord shard {shard}: " in first and "while decompressing data" in first
    assert f"delete the folder {examples} and run again" in first
    assert (failed.reason, failed.exit_code) == ("WorkerInputError", 2)
    assert not any("Traceback" in line for line in failed.log_tail), failed.log_tail
    assert not model.exists()


def test_every_shard_the_tokenize_step_writes_passes_the_check(dataset):
    for split in ("train", "eval"):  # each shard holds the windows the manifest gives it
        shards = data.split_shards(dataset.uri, dataset.manifest, split)
        shard_check.verify_shards(dataset.uri, shards.files, windows=shards.windows)


# ---- a NaN loss: not blessed, not pushed -----------------------------------------------------


@pytest.fixture(scope="module")
def diverged(dataset, tmp_path_factory) -> tuple[Path, train_step.TrainResult]:
    """A Model the train step trained with a learning rate of 1e9 and no clipping."""
    root = tmp_path_factory.mktemp("diverged")
    model, work = root / "model", root / "work"
    absurd = ("train.learning_rate=1e9", "train.grad_clip_norm=0")
    cfg = resolve_config("tiny", TINY_OVERRIDES + absurd)
    spec = train_step.job_spec(
        dataset.uri, str(model), str(work), cfg, launcher="local", run_id="nan", workers=1
    )
    launcher = LocalLauncher(log_dir=root / "logs", out=io.StringIO(), kill_grace_seconds=2)
    return model, train_step.run(spec, cfg, str(model), str(work), launcher)


def _evaluate(model: Path, examples: str, tmp_path: Path) -> evaluate.EvalResult:
    return evaluate.run(
        str(model),
        examples,
        str(tmp_path / "serving"),
        str(tmp_path / "blessing"),
        str(tmp_path / "report.md"),
        policy=EvalPolicy(max_nats_per_char=10.0, tolerance=0.01),
        num_samples=2,
        sample_tokens=4,
    )


@pytest.mark.slow
@pytest.mark.fault("a learning rate of 1e9 without gradient clipping: the loss becomes NaN")
def test_a_diverged_model_is_neither_blessed_nor_pushed(dataset, diverged, tmp_path):
    model, trained = diverged
    metrics = json.loads((model / TRAIN_METRICS).read_text())
    loss, step = metrics["final_loss"], metrics["diverged_at_step"]
    assert metrics["diverged"] is True and not math.isfinite(loss)
    assert 1 <= step == metrics["steps"] < 40  # training stopped there, and the step succeeded
    assert trained.model_properties["diverged"] == 1

    result = _evaluate(model, dataset.uri, tmp_path)
    assert not result.blessed
    assert result.reason.startswith(f"training diverged: the loss became {loss} at step {step}")
    assert "lower train.learning_rate" in result.reason
    blessing = tmp_path / "blessing"
    assert (blessing / "NOT_BLESSED").is_file() and not (blessing / "BLESSED").exists()
    assert json.loads((blessing / "blessing.json").read_text())["reason"] == result.reason
    # The NaN weights score NaN; KFP and lineage keep such a number as its string.
    numbers = evaluate.key_metrics(result)
    assert not math.isfinite(numbers["eval_nats_per_char"])
    assert kfp_metadata.recordable(numbers)["eval_nats_per_char"] == "nan"
    report = (tmp_path / "report.md").read_text()
    assert f"**Not blessed**: {result.reason}" in report and "| candidate | nan | nan |" in report

    destination = tmp_path / "serving"
    pushed = push.run(str(model), str(blessing), str(destination), str(tmp_path / "pushed"))
    assert (pushed.pushed, pushed.pushed_version) == (0, "")
    assert pushed.reason == f"not blessed: {result.reason}"
    assert (tmp_path / "pushed" / "NOT_PUSHED").is_file()
    assert not destination.exists()


# ---- evaluate crashing: one error, no blessing, push refuses -------------------------------


def _cut_variables(model: Path, tmp_path: Path, monkeypatch) -> None:
    variables = model / SERVING_DIR / "variables" / "variables.data-00000-of-00001"
    _cut_half(variables)


def _cut_graph(model: Path, tmp_path: Path, monkeypatch) -> None:
    _cut_half(model / SERVING_DIR / SAVED_MODEL_FILE)


def _baseline_vanishes(model: Path, tmp_path: Path, monkeypatch) -> None:
    shutil.copytree(model / SERVING_DIR, tmp_path / "serving" / "1")
    listed = serving.latest_version_uri

    def then_removed(serving_dir: str) -> str | None:
        uri = listed(serving_dir)
        assert uri is not None
        shutil.rmtree(uri)  # a rollback or a clean-up removes it while evaluate runs
        return uri

    monkeypatch.setattr(serving, "latest_version_uri", then_removed)


def _foreign_model_in_service(model: Path, tmp_path: Path, monkeypatch) -> None:
    """A SavedModel that loads, but not one of ours: no `score` signature to compare with."""
    import tensorflow as tf

    class Doubler(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def predict(self, x):
            return {"y": 2.0 * x}

    doubler = Doubler()
    folder = str(tmp_path / "serving" / "1")
    tf.saved_model.save(doubler, folder, signatures={"serving_default": doubler.predict})


def _disk_full_at_the_blessing(model: Path, tmp_path: Path, monkeypatch) -> None:
    def half_written(folder: Path, blessing: ModelBlessing) -> None:
        (folder / "NOT_BLESSED").write_text("")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder / "blessing.json"))

    monkeypatch.setattr(evaluate, "write_blessing", half_written)


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault, error, says",
    [
        pytest.param(
            _cut_variables,
            UserError,
            "the candidate model: the SavedModel at {model}/Format-Serving is damaged",
            marks=pytest.mark.fault("the candidate's variables cut in half"),
        ),
        pytest.param(
            _cut_graph,
            UserError,
            "the candidate model: the SavedModel at {model}/Format-Serving is damaged",
            marks=pytest.mark.fault("the candidate's saved_model.pb cut in half"),
        ),
        pytest.param(
            _baseline_vanishes,
            UserError,
            "the model in service at {tmp}/serving/1: no SavedModel at {tmp}/serving/1; "
            "run evaluate again",
            marks=pytest.mark.fault("the model in service removed while evaluate runs"),
        ),
        pytest.param(
            _foreign_model_in_service,
            UserError,
            "the model in service at {tmp}/serving/1: the SavedModel at {tmp}/serving/1 has "
            "no score signature, so it is not a gptpipe model; run evaluate again",
            marks=pytest.mark.bad_input("a SavedModel in service that is not a gptpipe model"),
        ),
        pytest.param(
            _disk_full_at_the_blessing,
            UserError,  # the storage layer's one line for ENOSPC, EDQUOT and EFBIG
            "while writing {tmp}/blessing: No space left on device",
            marks=pytest.mark.fault("a full disk while evaluate writes the blessing"),
        ),
    ],
    ids=["variables-cut", "graph-cut", "baseline-gone", "foreign-baseline", "disk-full"],
)
def test_a_crashed_evaluate_leaves_no_blessing_and_push_refuses(
    dataset, diverged, tmp_path, monkeypatch, fault, error, says
):
    model = tmp_path / "model"
    shutil.copytree(diverged[0], model)
    fault(model, tmp_path, monkeypatch)
    with pytest.raises(error) as raised:
        _evaluate(model, dataset.uri, tmp_path)
    message = str(raised.value)
    assert "\n" not in message and says.format(model=model, tmp=tmp_path) in message, message
    _assert_no_blessing_and_push_refuses(model, tmp_path)


@pytest.mark.fault("the eval text missing from the Examples")
def test_evaluate_without_eval_text_leaves_no_blessing_and_push_refuses(dataset, tmp_path):
    examples = tmp_path / "examples"
    shutil.copytree(dataset.uri, examples)
    (examples / EVAL_TEXT).unlink()
    model = tmp_path / "model"  # never loaded: the eval text is read first
    missing = re.escape(f"no eval text: {examples / EVAL_TEXT} is missing")
    with pytest.raises(UserError, match=missing):
        _evaluate(model, str(examples), tmp_path)
    _assert_no_blessing_and_push_refuses(model, tmp_path)


def _assert_no_blessing_and_push_refuses(model: Path, tmp_path: Path) -> None:
    blessing, destination = tmp_path / "blessing", tmp_path / "serving"
    assert not blessing.exists() and not list(tmp_path.glob(".blessing*"))
    before = serving.serving_versions(destination)
    with pytest.raises(
        UserError, match=f"not a ModelBlessing folder .*: {re.escape(str(blessing))}$"
    ):
        push.run(str(model), str(blessing), str(destination), str(tmp_path / "pushed"))
    assert serving.serving_versions(destination) == before
    assert not (tmp_path / "pushed").exists()


# ---- tokenize: a full disk, and a SIGKILL between shards -------------------------------------

# The tokenize step's work in a child process: what its KFP component runs, at the edge that
# prints a UserError as one line. With a stop marker, a fault: once the first shard is written
# the child touches that file and stops, for the test to SIGKILL it.
_CHILD = """
import json, pathlib, sys, time
from components.tokenize import executor
from contracts.errors import one_line_errors

corpus, root, options, stop_marker = sys.argv[1:5]
if stop_marker:
    from components.tokenize import shards

    close = shards._GzipRecords.close

    def close_then_stop(self):  # the shard is closed, whole, when close returns
        close(self)
        pathlib.Path(stop_marker).touch()
        time.sleep(600)

    shards._GzipRecords.close = close_then_stop
with one_line_errors("gptpipe tokenize"):
    executor.run_content_addressed(corpus, root, **json.loads(options))
"""
FILE_LIMIT = 20_000  # bytes: the tokenizer (5 KB) and the first 2 shards (9 KB) fit, shard 3 not
FULL_DISK_SHARD_WINDOWS = 2048


def _child(corpus: Path, root: Path, shard_windows: int, stop_marker: str = "") -> list[str]:
    options = json.dumps({**TOKENIZE, "shard_windows": shard_windows})
    return [sys.executable, "-c", _CHILD, str(corpus), str(root), options, stop_marker]


def _child_env() -> dict[str, str]:
    # No .pyc writes, which the file size limit would fail as well.
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}


def _mixed_corpus(path: Path) -> Path:
    """Repetitive lines, then random words: the later shards compress far less than the first."""
    rng = random.Random(1)
    letters = "abcdefghijklmnopqrstuvwxyz"
    noise = "\n".join(
        " ".join("".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(8))
        for _ in range(1500)
    )
    path.write_text(tiny_corpus(2000) + "\n" + noise + "\n", encoding="utf-8")
    return path


def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))


@pytest.fixture(scope="module")
def full_disk(tmp_path_factory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """Tokenize run under a file size limit that fails its third train shard midway."""
    root = tmp_path_factory.mktemp("full-disk")
    corpus, datasets = _mixed_corpus(root / "corpus.txt"), root / "datasets"
    ran = subprocess.run(
        _child(corpus, datasets, FULL_DISK_SHARD_WINDOWS),
        cwd=REPO,
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_file_size,
    )
    return corpus, datasets, ran


def _nothing_complete(datasets: Path) -> None:
    """No dataset folder or manifest at a final path; at most hidden temporaries."""
    assert not list(datasets.rglob(EXAMPLES_MANIFEST))
    assert all(entry.name.startswith(".") for entry in datasets.iterdir())


@pytest.mark.slow
@pytest.mark.fault("a disk that fills while tokenize writes shards (RLIMIT_FSIZE)")
def test_a_full_disk_leaves_no_dataset_and_a_rerun_succeeds(full_disk):
    corpus, datasets, ran = full_disk
    assert ran.returncode != 0, ran.stderr
    assert "File too large" in ran.stderr  # EFBIG: the limit, not something else, stopped it
    _nothing_complete(datasets)
    version, _ = tokenize.dataset_version_of(
        str(corpus), shard_windows=FULL_DISK_SHARD_WINDOWS, **_version_options()
    )
    again = tokenize.run_content_addressed(
        str(corpus), str(datasets), shard_windows=FULL_DISK_SHARD_WINDOWS, **TOKENIZE
    )
    assert (again.uri, again.reused) == (str(datasets / version), False)
    assert len(again.manifest.splits["train"].shards) == 5
    assert max(p.stat().st_size for p in Path(again.uri).rglob("*.gz")) > FILE_LIMIT


@pytest.mark.slow
@pytest.mark.fault("a disk that fills while tokenize writes shards: the message")
def test_a_full_disk_is_one_line_naming_the_folder(full_disk):
    _, datasets, ran = full_disk
    said = [line for line in ran.stderr.splitlines() if "error: " in line]
    assert "Traceback" not in ran.stderr, ran.stderr
    assert len(said) == 1 and said[0].startswith("gptpipe tokenize: error: "), ran.stderr
    assert str(datasets) in said[0]
    assert any(word in said[0].lower() for word in ("disk", "space", "too large"))


def _version_options() -> dict:
    return {k: v for k, v in TOKENIZE.items() if k != "progress"}


@pytest.mark.slow
@pytest.mark.fault("tokenize killed with SIGKILL between two shards")
def test_tokenize_killed_between_shards_leaves_no_dataset_and_a_rerun_succeeds(tmp_path):
    corpus, datasets = tmp_path / "corpus.txt", tmp_path / "datasets"
    corpus.write_text(tiny_corpus(), encoding="utf-8")
    version, _ = tokenize.dataset_version_of(
        str(corpus), shard_windows=SHARD_WINDOWS, **_version_options()
    )
    stopped = tmp_path / "first-shard-written"
    child = subprocess.Popen(
        _child(corpus, datasets, SHARD_WINDOWS, str(stopped)),
        cwd=REPO,
        env=_child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        until = time.monotonic() + 240
        while not stopped.exists() and child.poll() is None and time.monotonic() < until:
            time.sleep(0.05)
        assert stopped.exists(), child.stderr.read().decode() if child.poll() is not None else ""
        # the one unit's shards, in the temporary folder its part publishes when whole
        written = list(datasets.glob(f".{version}.work/encoded/.unit-*.tmp-*/Split-train/*.gz"))
        assert len(written) == 1  # one shard whole, three to go
    finally:
        signal_group(child, signal.SIGKILL)
        child.wait(timeout=30)
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    _nothing_complete(datasets)

    again = tokenize.run_content_addressed(
        str(corpus), str(datasets), shard_windows=SHARD_WINDOWS, **TOKENIZE
    )
    assert (again.uri, again.reused, again.manifest.dataset_version) == (
        str(datasets / version),
        False,
        version,
    )
    for split in ("train", "eval"):
        shards = data.split_shards(again.uri, again.manifest, split)
        shard_check.verify_shards(again.uri, shards.files, windows=shards.windows)
    visible = [entry.name for entry in datasets.iterdir() if not entry.name.startswith(".")]
    assert visible == [version]
