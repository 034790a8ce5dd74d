"""Evaluate's run() on local disk: scores, baseline resolution, blessing and report files."""

import json
import shutil

import pytest
from trainer_fixtures import make_examples_dir, make_model_dir

from components.evaluate import executor

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    examples = make_examples_dir(root / "examples")
    return examples, make_model_dir(root, examples)


def run(tmp_path, examples, model, serving, **kwargs):
    options = {"max_nats_per_char": 10.0, "tolerance": 0.01, "num_samples": 2, "sample_tokens": 4}
    return executor.run(
        str(model),
        str(examples),
        str(serving),
        str(tmp_path / "blessing"),
        str(tmp_path / "report.md"),
        **{**options, **kwargs},
    )


def test_first_model_is_blessed_without_a_baseline(tmp_path, trained):
    examples, model = trained
    result = run(tmp_path, examples, model, tmp_path / "serving")
    assert result.blessed and result.baseline is None
    assert 0 < result.candidate.nats_per_char < result.candidate.nats_per_token
    assert result.candidate.chars == len((examples / "raw" / "eval.txt").read_text())
    assert (tmp_path / "blessing" / "BLESSED").is_file()
    report = (tmp_path / "report.md").read_text()
    assert "change check against a baseline was skipped" in report
    assert report.count("```text") == 2


def test_same_model_in_service_is_the_baseline_and_scores_the_same(tmp_path, trained):
    examples, model = trained
    serving = tmp_path / "serving"
    shutil.copytree(model / "Format-Serving", serving / "3")
    (serving / "4").mkdir()  # half-written: no saved_model.pb, so not a baseline
    result = run(tmp_path, examples, model, serving)
    assert result.baseline_model == str(serving / "3")
    assert result.baseline.nats_per_char == pytest.approx(result.candidate.nats_per_char)
    assert result.blessed
    info = json.loads((tmp_path / "blessing" / "blessing.json").read_text())
    assert info["baseline"]["nats_per_char"] == pytest.approx(result.baseline.nats_per_char)


def test_threshold_failure_writes_not_blessed(tmp_path, trained):
    examples, model = trained
    result = run(tmp_path, examples, model, tmp_path / "serving", max_nats_per_char=0.01)
    assert not result.blessed and "above the threshold" in result.reason
    assert (tmp_path / "blessing" / "NOT_BLESSED").is_file()
