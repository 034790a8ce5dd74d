"""`gptpipe generate` and `gptpipe score` on the models two real local runs pushed.

The e2e tests read the session's two runs (`local_runs`): versions 1 and 2 of one serving
folder, locally and, copied with the storage layer, on the GCS emulator. The others check the
one-line errors on folders made in tmp_path, and load no trained model.
"""

import json
import math

import pytest

from components import serving, storage
from contracts.artifacts import MODEL_COMPLETE, SERVING_DIR
from contracts.errors import UserError
from pipelines.cli import model as model_cmd
from tests.pipelines.cli import commands

PROMPT = "ROMEO:"


def run(argv: list[str]) -> int:
    return commands.run(model_cmd.add_parser, argv)


def output(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    return commands.output(capsys, model_cmd.add_parser, argv)


def generate_argv(model: str, *extra: str) -> list[str]:
    return ["generate", "--model", model, "--max-new-tokens", "12", "--seed", "7", *extra, PROMPT]


# ---- on the pushed models ------------------------------------------------------------------


@pytest.mark.e2e
def test_generate_continues_a_prompt_the_same_way_each_time(local_runs, capsys):
    serving_dir = str(local_runs.serving_dir)
    assert model_cmd.resolve_model(serving_dir, None) == str(local_runs.pushed_model(1))
    first = output(capsys, generate_argv(serving_dir))
    again = output(capsys, generate_argv(serving_dir))
    assert first.rstrip("\n") and first == again
    # --version picks the other model; given as a SavedModel folder, the same one again.
    older = output(capsys, generate_argv(serving_dir, "--version", "1"))
    assert older.rstrip("\n")
    assert output(capsys, generate_argv(str(local_runs.pushed_model(0)))) == older


@pytest.mark.e2e
def test_the_seed_chooses_the_continuation(local_runs, capsys):
    """`generate_seeded` samples statelessly: a seed always gives its text, another seed other
    text (12 tokens sampled at temperature 0.8 from a barely trained model never coincide)."""
    serving_dir = str(local_runs.serving_dir)
    seven = output(capsys, generate_argv(serving_dir))
    eight = output(capsys, [*generate_argv(serving_dir)[:-1], "--seed", "8", PROMPT])
    assert seven == output(capsys, generate_argv(serving_dir)) and seven != eight


@pytest.mark.e2e
@pytest.mark.parametrize("index", [0, 1])
def test_score_of_the_eval_text_is_the_runs_evaluation(local_runs, capsys, index, tmp_path):
    version = str(local_runs.pushed_version(index))
    argv = ["score", "--model", str(local_runs.serving_dir), "--version", version, "--json"]
    eval_text = local_runs.eval_text(index, tmp_path)
    found = json.loads(output(capsys, [*argv, str(eval_text)]))
    assert found["model"] == str(local_runs.pushed_model(index))
    assert math.isfinite(found["nats_per_char"]) and found["nats_per_char"] > 0
    assert found["nats_per_char"] == pytest.approx(local_runs.eval_nats_per_char(index), rel=1e-3)
    text = eval_text.read_text(encoding="utf-8")
    assert found["chars"] == len(text) and found["tokens"] > 0


@pytest.mark.e2e
def test_score_prints_nats_per_char_first(local_runs, capsys):
    line = output(capsys, ["score", "--model", str(local_runs.serving_dir), __file__])
    value = float(line.split()[0])
    assert math.isfinite(value) and value > 0
    assert line.split()[1] == "nats/char" and str(local_runs.pushed_model(1)) in line


@pytest.mark.e2e
def test_a_model_on_gcs_is_read_through_the_storage_layer(local_runs, gcs, capsys):
    destination = gcs.uri("serving", "gpt")
    storage.publish_dir(
        str(local_runs.pushed_model(0)), storage.join(destination, "1"), ready=serving.READY
    )
    on_gcs = output(capsys, generate_argv(destination))
    assert on_gcs.rstrip("\n")
    assert on_gcs == output(capsys, generate_argv(str(local_runs.pushed_model(0))))
    folder = storage.join(destination, "1")  # a SavedModel folder, given directly
    found = json.loads(output(capsys, ["score", "--model", folder, "--json", __file__]))
    local = json.loads(
        output(capsys, ["score", "--model", str(local_runs.pushed_model(0)), "--json", __file__])
    )
    assert found["model"] == folder
    assert found["nats_per_char"] == pytest.approx(local["nats_per_char"], rel=1e-6)


# ---- which model ---------------------------------------------------------------------------


def fake_version(folder, name: str) -> None:
    (folder / name).mkdir(parents=True)
    (folder / name / "saved_model.pb").write_bytes(b"")


def test_the_newest_complete_version_is_used_unless_one_is_named(tmp_path):
    for name in ("1", "3", "10"):
        fake_version(tmp_path, name)
    (tmp_path / "11").mkdir()  # incomplete: no saved_model.pb yet
    (tmp_path / ".staging-12").mkdir()
    assert model_cmd.resolve_model(str(tmp_path), None) == str(tmp_path / "10")
    assert model_cmd.resolve_model(str(tmp_path), 3) == str(tmp_path / "3")
    # A SavedModel folder is itself the model.
    assert model_cmd.resolve_model(str(tmp_path / "3"), None) == str(tmp_path / "3")


def test_a_model_artifact_is_its_savedmodel_once_complete(tmp_path):
    """A run's Model folder, or its Format-Serving/ inside, is read only with the COMPLETE
    marker its export writes last: a half-exported Model is one line, not a half-read model."""
    fake_version(tmp_path / "model", SERVING_DIR)
    saved = str(tmp_path / "model" / SERVING_DIR)
    for given in (str(tmp_path / "model"), saved):
        with pytest.raises(UserError, match="incomplete: it has no COMPLETE file") as err:
            model_cmd.resolve_model(given, None)
        assert "\n" not in str(err.value) and str(tmp_path / "model") in str(err.value)
    (tmp_path / "model" / MODEL_COMPLETE).write_text("")
    assert model_cmd.resolve_model(str(tmp_path / "model"), None) == saved
    assert model_cmd.resolve_model(saved, None) == saved


def test_a_model_that_is_not_there_is_one_line_naming_it(tmp_path):
    (tmp_path / "empty").mkdir()
    fake_version(tmp_path / "served", "2")
    cases = {
        "no model at": [str(tmp_path / "missing")],
        "has no complete model versions": [str(tmp_path / "empty")],
        "version 5 of": [str(tmp_path / "served"), "--version", "5"],
    }
    for expected, where in cases.items():
        with pytest.raises(UserError, match=expected) as err:
            run(["generate", "--model", *where, PROMPT])
        assert "\n" not in str(err.value) and str(tmp_path) in str(err.value)
    with pytest.raises(UserError, match=r"its complete versions are \[2\]"):
        run(["score", "--model", str(tmp_path / "served"), "--version", "1", __file__])


def test_a_damaged_savedmodel_is_one_line_naming_it(tmp_path):
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "saved_model.pb").write_bytes(b"\x00not a protobuf\xff" * 8)
    with pytest.raises(UserError, match="is not a SavedModel that loads") as err:
        run(["generate", "--model", str(tmp_path), PROMPT])
    assert "\n" not in str(err.value) and str(tmp_path / "1") in str(err.value)


# ---- what the user gives -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("--temperature", "0", "--temperature 0.0: pass a number above 0"),
        ("--temperature", "-1", "--temperature -1.0: pass a number above 0"),
        ("--temperature", "nan", "--temperature nan: pass a number above 0"),
        ("--temperature", "inf", "--temperature inf: pass a number above 0"),
        ("--max-new-tokens", "0", "--max-new-tokens 0: pass 1 or more"),
        ("--max-new-tokens", "-3", "--max-new-tokens -3: pass 1 or more"),
        ("--seed", str(2**63), f"--seed {2**63}: pass a whole number that fits in 64 bits"),
    ],
)
def test_bad_sampling_options_fail_before_any_model_is_read(tmp_path, option, value, expected):
    missing = str(tmp_path / "no-model-here")  # never looked at: the options fail first
    with pytest.raises(UserError) as err:
        run(["generate", "--model", missing, option, value, PROMPT])
    assert str(err.value).startswith(expected) and "\n" not in str(err.value)


def test_a_file_that_cannot_be_scored_is_one_line_naming_it(tmp_path):
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("To be, or not to be\nthat is the question: caf\xe9\n".encode("latin-1"))
    blank = tmp_path / "blank.txt"
    blank.write_text(" \n\n", encoding="utf-8")
    cases = {
        tmp_path / "missing.txt": "cannot read .*missing.txt: No such file or directory",
        tmp_path: "cannot read .*: Is a directory",
        latin1: r"latin1.txt is not UTF-8: byte 0xe9 at offset 45 \(line 2\)",
        blank: "blank.txt has no text to score",
    }
    for path, expected in cases.items():
        with pytest.raises(UserError, match=expected) as err:
            run(["score", "--model", str(tmp_path / "no-model-here"), str(path)])
        assert "\n" not in str(err.value)


class _Generate:
    """A `generate` signature that records its inputs; `inputs` names those it takes."""

    def __init__(self, inputs: tuple[str, ...]) -> None:
        self.structured_input_signature = ((), dict.fromkeys(inputs))
        self.calls: list[dict] = []

    def __call__(self, **inputs):
        import tensorflow as tf

        self.calls.append({name: value.numpy() for name, value in inputs.items()})
        return {"completion": tf.constant([b"continued"])}


@pytest.mark.slow
def test_generate_stops_at_eos_unless_through_eos_and_an_old_model_is_asked_without_it():
    base = ("prompt", "max_new_tokens", "temperature")
    new, old = _Generate((*base, "stop_at_eos")), _Generate(base)
    for signature in (new, old):
        model = type("Model", (), {"signatures": {"generate": signature}})()
        for stop in (True, False):
            assert model_cmd.generate(model, "p", 4, 0.8, None, stop_at_eos=stop) == "continued"
    assert [call["stop_at_eos"] for call in new.calls] == [True, False]
    assert all("stop_at_eos" not in call for call in old.calls)
    args = _parser().parse_args(["generate", "--through-eos", "p"])
    assert args.through_eos and not _parser().parse_args(["generate", "p"]).through_eos


def _parser():
    import argparse

    parser = argparse.ArgumentParser()
    model_cmd.add_parser(parser.add_subparsers())
    return parser
