"""Bad input through `gptpipe run --local`: one clear message, and nothing half-written."""

import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.cli import main as cli
from pipelines.cli import run as run_cmd

SHAKESPEARE = (Path(__file__).resolve().parents[3] / "data" / "tinyshakespeare.txt").read_bytes()


def run_cli(tmp_path, capsys, corpus, *extra):
    root = tmp_path / "runs"
    code = cli.main(["run", "--local", "--root", str(root), "--corpus", str(corpus), *extra])
    return code, capsys.readouterr().err, root


def artifacts(root: Path, name: str) -> list[Path]:
    return [p for p in root.rglob(name) if p.is_dir()]


def write(tmp_path, data: bytes) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["--set", "model.n_heads=2"], "unknown key 'model.n_heads'"),
        (["--set", "model.n_head=3"], "n_head=3 must divide"),
        (["--set", "model.seq_len=lots"], "model.seq_len"),
    ],
)
def test_bad_config_fails_before_any_step(tmp_path, capsys, overrides, message):
    code, err, root = run_cli(tmp_path, capsys, write(tmp_path, b"hello\n" * 100), *overrides)
    assert code == 2
    assert message in err and err.count("\n") == 1
    assert not root.exists()


def test_missing_corpus_is_named(tmp_path, capsys):
    code, err, root = run_cli(tmp_path, capsys, tmp_path / "nope.txt")
    assert code == 2 and "nope.txt" in err and "not found" in err
    assert not root.exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "empty"),
        (b"caf\xe9 au lait\n" * 50, "not UTF-8"),
        (SHAKESPEARE[:20_000], "fewer than one window"),
    ],
    ids=["empty", "not-utf8", "smaller-than-a-window"],
)
def test_bad_corpus_fails_tokenize_with_its_message_and_no_examples(
    tmp_path, capsys, data, message
):
    # A window of 8192 tokens is longer than 20 kB of text, yet the model config stays valid:
    # one sequence a micro-batch keeps its attention scores under TensorFlow's int32 bound
    # (trainer/shapes.py), one worker keeps it in a small machine's memory.
    longer = ["--set", "model.seq_len=8192", "--set", "train.batch_size=1", "--workers", "1"]
    code, err, root = run_cli(tmp_path, capsys, write(tmp_path, data), *longer)
    assert code == 1
    assert "step 'tokenize' failed" in err and message in err and "corpus.txt" in err
    assert artifacts(root, "examples") == []
    assert list(root.rglob(".*.tmp-*")) == []


def test_rollback_republishes_and_is_recorded_as_a_push(tmp_path, capsys):
    from components import lineage

    serving = tmp_path / "serving"
    for version, graph in ((1, b"model one"), (2, b"model two")):
        (serving / str(version)).mkdir(parents=True)
        (serving / str(version) / "saved_model.pb").write_bytes(graph)
    store = str(tmp_path / "metadata.sqlite")
    missing = cli.main(
        ["rollback", "--destination", str(serving), "--to", "1", "--metadata", store]
    )
    assert missing == 2 and "no metadata store" in capsys.readouterr().err
    lineage.open_store(store)  # an empty store, as a first run would create it
    code = cli.main(["rollback", "--destination", str(serving), "--to", "1", "--metadata", store])
    assert code == 0 and "now served as version 3" in capsys.readouterr().out
    assert (serving / "3" / "saved_model.pb").read_bytes() == b"model one"
    pushed = lineage.find_artifact(store, str(serving / "3"), "PushedModel")
    assert pushed["properties"]["pushed_version"] == "3"
    assert "rollback to version 1" in pushed["properties"]["reason"]
    assert lineage.producer_of(store, pushed)["step"] == "push"


def test_the_summary_prints_a_non_finite_metric_as_lineage_stored_it():
    # SQL has no NaN: lineage keeps a diverged model's loss as the string "nan".
    summary = {
        "run_id": "r",
        "dataset_version": "d",
        "steps": {
            "evaluate": {
                "outputs": {
                    "evaluation": [
                        {
                            "properties": {
                                "eval_nats_per_token": "nan",
                                "eval_nats_per_char": "nan",
                                "eval_perplexity": "inf",
                                "baseline_nats_per_char": 1.5,
                            }
                        }
                    ],
                    "blessing": [{"properties": {"blessed": 0, "reason": "diverged"}}],
                }
            }
        },
    }
    rows = dict(run_cmd.summary_rows(summary))
    assert rows["eval loss"] == "nan nats/token, nan nats/char (perplexity inf)"
    assert "(1.5000 nats/char)" in rows["baseline"]


def _stderr_of(code: str) -> str:
    repo = Path(__file__).resolve().parents[3]
    return subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=120
    ).stderr


@pytest.mark.parametrize("package", ["pipelines", "components"])
def test_google_api_cores_python_end_of_life_notice_is_hidden_and_no_other_warning(package):
    """The notice (on every command and atop every step's log) asks nothing of a user of a
    stack pinned to Python 3.11; only it is hidden (contracts/process.py)."""
    notice = "_python_version_support"
    if notice not in _stderr_of("import google.cloud.storage"):
        pytest.skip("this google-api-core gives no end-of-life notice on this Python")
    other = "import warnings; warnings.warn('another notice', FutureWarning)"
    stderr = _stderr_of(f"import {package}; import google.cloud.storage; {other}")
    assert notice not in stderr and "FutureWarning: another notice" in stderr


@pytest.mark.parametrize(
    "argv, says",
    [
        (["rollback", "--destination", "serving", "--to", "1"], "gptpipe: interrupted\n"),
        (["kfp", "runs"], "gptpipe: interrupted\n"),
        (["kfp", "run"], "gptpipe: interrupted; a KFP run it started goes on"),
        (["run", "--kfp", "http://kfp"], "gptpipe: interrupted; a KFP run it started goes on"),
    ],
)
def test_an_interrupted_command_prints_one_line_and_exits_130(monkeypatch, capsys, argv, says):
    from pipelines.cli import kfp as kfp_cli
    from pipelines.cli import rollback

    def ctrl_c(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(rollback, "_cmd_rollback", ctrl_c)
    monkeypatch.setattr(kfp_cli, "_cmd_kfp_runs", ctrl_c)
    monkeypatch.setattr(kfp_cli, "cmd_run", ctrl_c)
    assert cli.main(argv) == 130
    err = capsys.readouterr().err
    assert err.startswith(says) and err.count("\n") == 1 and "Traceback" not in err


def _run_args(*argv: str):
    return cli._parser().parse_args(["run", *argv])


def test_a_local_run_resolves_each_steps_parameters_once_from_its_options(tmp_path):
    """--workers and --tokenizer are shortcuts for their fields; --param sets any field."""
    from contracts.params import EvalPolicy, TokenizeParams

    args = _run_args(
        "--local",
        "--workers",
        "3",
        "--tokenizer",
        "tok.model",
        "--param",
        "eval_policy.tolerance=0.05",
        "--param",
        "tokenize.eval_fraction=0.2",
    )
    run = run_cmd.local_run(args)
    assert (run.train_job.workers, run.train_job.launcher, run.train_job.gpus_per_worker) == (
        3,
        "local",
        0,
    )
    assert run.tokenize == TokenizeParams(
        eval_fraction=0.2, tokenizer="tok.model", launcher="local"
    )
    assert run.eval_policy == EvalPolicy(tolerance=0.05)


@pytest.mark.bad_input("a --param of a local run that names no field, or a bad value")
@pytest.mark.parametrize(
    "param, says",
    [
        (
            "train_job.wrokers=2",
            "train_job has no field 'wrokers' (did you mean train_job.workers?)",
        ),
        ("eval_policy.tolerance=2", "eval_policy.tolerance=2.0: the regression allowed"),
        ("workers=2", "--param 'workers=2' is not OBJECT.FIELD=VALUE"),
    ],
)
def test_a_bad_param_of_a_local_run_is_one_line_and_starts_nothing(tmp_path, capsys, param, says):
    code, err, root = run_cli(tmp_path, capsys, write(tmp_path, b"hello\n" * 100), "--param", param)
    assert code == 2 and says in err and err.count("\n") == 1
    assert not root.exists()


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--kfp", "http://kfp", "--workers", "2"], "--kfp run: pass --param train_job.workers=N"),
        (["--kfp", "http://kfp", "--corpus", "c.txt"], "--corpus is not an option of a --kfp run"),
        (["--local", "--wait"], "--wait is not an option of a --local run"),
        (["--local", "--version", "v1"], "--version is not an option of a --local run"),
    ],
)
def test_one_run_verb_refuses_the_other_places_options(capsys, argv, says):
    assert cli.main(["run", *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


def test_a_kfp_run_is_kfp_run_with_its_host(monkeypatch):
    """`run --kfp HOST` is `kfp run --host HOST`: the same command, the same options."""
    from pipelines.cli import kfp as kfp_cli

    seen = {}

    def started(args):
        seen.update(host=args.host, params=args.params, wait=args.wait)
        return 0

    monkeypatch.setattr(kfp_cli, "cmd_run", started)
    argv = ["--kfp", "http://kfp:8888", "--param", "train_job.workers=8", "--wait"]
    assert cli.main(["run", *argv]) == 0
    assert seen == {"host": "http://kfp:8888", "params": ["train_job.workers=8"], "wait": True}


def test_run_needs_a_place(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["run"])
    assert exited.value.code == 2
    assert "one of the arguments --local --kfp is required" in capsys.readouterr().err


# ---- what this machine, or TensorFlow, cannot hold: refused before any step ---------------


@pytest.fixture
def small_machine(monkeypatch):
    """This machine as `gptpipe run --local` reads it, made 2 CPUs and 1 GiB of memory."""
    from pipelines.runners.local import machine

    found = machine.Machine(cpus=2, memory_bytes=1 << 30)
    monkeypatch.setattr(machine, "this_machine", lambda: found)
    return found


@pytest.mark.bad_input("gptpipe run --local --workers past what the machine's CPUs run")
@pytest.mark.parametrize(
    "given",
    [["--workers", "500"], ["--param", "train_job.workers=5"]],
    ids=["workers-option", "workers-param"],
)
def test_more_local_workers_than_the_cpus_run_start_nothing(tmp_path, capsys, small_machine, given):
    code, err, root = run_cli(tmp_path, capsys, write(tmp_path, b"hello\n" * 100), *given)
    assert code == 2 and err.count("\n") == 1, err
    workers = given[1].rpartition("=")[2]
    assert f"train_job.workers={workers}: this machine runs at most 4 local workers" in err
    assert "(2 for each of its 2 CPUs); pass --workers 4 or fewer" in err
    assert not root.exists()  # no step, so no worker, started


@pytest.mark.bad_input("--set train.batch_size=50000000: tensors past TensorFlow's int32 bound")
def test_a_batch_past_tensorflows_int32_bound_is_one_line_with_its_numbers(tmp_path, capsys):
    corpus = write(tmp_path, b"hello\n" * 100)
    code, err, root = run_cli(tmp_path, capsys, corpus, "--set", "train.batch_size=50000000")
    assert code == 2 and err.count("\n") == 1, err
    for says in (
        "train.batch_size=50000000",
        "logits tensor (batch x seq_len x vocab_size = 50,000,000 x 64 x 512)",
        "TensorFlow's int32 limit of 2,147,483,647",
        "use train.batch_size=65535 or less",
    ):
        assert says in err
    assert not root.exists()


@pytest.mark.bad_input("--set train.batch_size past the machine's memory on a local run")
def test_a_micro_batch_past_the_machines_memory_is_refused_with_a_fix_that_fits(
    tmp_path, capsys, small_machine
):
    import re

    from pipelines.runners.local import runner

    corpus = write(tmp_path, b"hello\n" * 100)
    code, err, root = run_cli(tmp_path, capsys, corpus, "--set", "train.batch_size=4096")
    assert code == 2 and err.count("\n") == 1, err
    assert "train.batch_size=4096 on this machine: each of its 2 workers needs about" in err
    assert "more than its 1.0 GiB of memory" in err and not root.exists()
    fix = re.search(r"set (train.batch_size=\d+) and (train.global_batch_tokens=\d+)", err)
    assert fix is not None, err
    settings = ["--set", "train.batch_size=4096", "--set", fix[1], "--set", fix[2]]
    run = run_cmd.local_run(_run_args("--local", "--corpus", str(corpus), *settings))
    runner.preflight(run)  # the fix it names fits, and keeps the global batch
    assert run.config.train.global_batch_tokens == 4096 * 2 * run.config.model.seq_len


@pytest.mark.bad_input("gptpipe run --local --root or --state-dir naming a file")
@pytest.mark.parametrize(
    "option, under, says",
    [
        ("--root", "", "--root {file} is a file, not a folder: give a folder"),
        ("--root", "runs", "--root {file}/runs: {file} is a file, not a folder"),
        ("--state-dir", "", "--state-dir {file} is a file, not a folder: give a folder"),
    ],
    ids=["root-is-a-file", "root-under-a-file", "state-dir-is-a-file"],
)
def test_a_run_folder_that_is_a_file_is_one_line(tmp_path, capsys, option, under, says):
    file = tmp_path / "notes.txt"
    file.write_text("mine\n")
    folder = str(file / under) if under else str(file)
    corpus = write(tmp_path, b"hello\n" * 100)
    assert cli.main(["run", "--local", option, folder, "--corpus", str(corpus)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gptpipe: error: {says.format(file=file)}") and err.count("\n") == 1
    assert file.read_text() == "mine\n"


def test_version_prints_the_package_version_and_the_codes_commit(capsys, monkeypatch):
    import importlib.metadata

    from components import provenance

    def version() -> str:
        with pytest.raises(SystemExit) as exited:
            cli.main(["--version"])
        assert exited.value.code == 0
        return capsys.readouterr().out

    monkeypatch.delenv(provenance.CODE_VERSION_ENV, raising=False)
    repo = Path(__file__).resolve().parents[3]
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    package = importlib.metadata.version("gptpipe")
    assert version() in (f"gptpipe {package} (commit {head}{dirty})\n" for dirty in ("", "-dirty"))
    monkeypatch.setenv(provenance.CODE_VERSION_ENV, "0123abc")  # baked into an image
    assert version() == f"gptpipe {package} (commit 0123abc)\n"

    def not_found(*args, **kwargs):
        raise importlib.metadata.PackageNotFoundError("gptpipe")

    def no_git(*args, **kwargs):
        raise OSError("git: not found")

    monkeypatch.delenv(provenance.CODE_VERSION_ENV)
    monkeypatch.setattr(importlib.metadata, "version", not_found)
    monkeypatch.setattr(provenance, "_git", no_git)
    assert version() == "gptpipe unknown (commit unknown)\n"
