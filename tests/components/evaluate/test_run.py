"""Evaluate's run() on local disk: scores, baseline resolution, blessing and report files."""

import json
import shutil

import pytest

from components import overlap
from components.evaluate import executor
from contracts.params import EvalPolicy
from tests.tiny import read_eval_documents

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(examples, tiny_model):
    return examples, tiny_model


def run(tmp_path, examples, model, serving, **kwargs):
    options = {"policy": EvalPolicy(max_nats_per_char=10.0), "num_samples": 2, "sample_tokens": 4}
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
    assert result.candidate.chars == len("".join(read_eval_documents(examples)))
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
    result = run(
        tmp_path, examples, model, tmp_path / "serving", policy=EvalPolicy(max_nats_per_char=0.01)
    )
    assert not result.blessed and "above the threshold" in result.reason
    assert (tmp_path / "blessing" / "NOT_BLESSED").is_file()


def _serve(model, serving, version, sketch_of=None):
    """Copy the candidate into service as `version`; with `sketch_of`, as a model that trained
    on that text (its carried sketch replaced, as an older split's training would have made)."""
    target = serving / str(version)
    shutil.copytree(model / "Format-Serving", target)
    sketch = target / "assets.extra" / "train_text_sketch.bin"
    if sketch_of is None:
        sketch.unlink()
    elif sketch_of != "damaged":
        made = overlap.Sketch()
        made.add(sketch_of.encode("utf-8"))
        sketch.write_bytes(made.to_bytes())
    else:
        cut_short = b'{"format": 2, "min_line_bytes": 32, "hashes": 9}\n\x00'
        sketch.write_bytes(overlap.MAGIC + cut_short)
    return target


def test_the_report_says_how_much_of_the_eval_text_each_model_trained_on(tmp_path, trained):
    """A model in service that trained on the eval text (the split moved since) is named in the
    reason, the blessing, the Metrics and both reports; the decision is the scores' alone."""
    examples, model = trained
    eval_text = "".join(read_eval_documents(examples))  # its documents end with newlines
    _serve(model, tmp_path / "serving", 1, sketch_of=eval_text)
    result = run(
        tmp_path, examples, model, tmp_path / "serving", html_report_path=str(tmp_path / "r.html")
    )
    # The candidate carries its Examples' sketch. The fixture's corpus repeats its lines, so
    # most eval windows are in its train split too, and the reason says so.
    examples_sketch = (examples / "train_text_sketch.bin").read_bytes()
    assert result.candidate_seen == overlap.seen_share(examples_sketch, eval_text.encode())
    assert result.candidate_seen.exact and result.candidate_seen.share > 0.9
    assert "note: the candidate trained on" in result.reason
    assert result.baseline_seen.share == 1.0
    assert result.blessed  # the same weights score the same: the note does not decide
    assert "note: the model in service trained on 100.0% of the eval text" in result.reason
    info = json.loads((tmp_path / "blessing" / "blessing.json").read_text())
    assert info["eval_text_seen"]["baseline"]["share"] == 1.0
    assert info["eval_text_seen"]["candidate"]["share"] == result.candidate_seen.share
    assert executor.key_metrics(result)["eval_text_seen_by_baseline"] == 1.0
    report = (tmp_path / "report.md").read_text()
    assert f"| {result.candidate_seen.share:.1%} |" in report and "| 100.0% |" in report
    assert "eval text trained on" in report
    assert "100.0%" in (tmp_path / "r.html").read_text()


def test_a_baseline_without_a_sketch_or_with_a_damaged_one_is_unknown(tmp_path, trained, caplog):
    examples, model = trained
    for sketch_of in (None, "damaged"):
        out = tmp_path / str(sketch_of)
        _serve(model, out / "serving", 1, sketch_of=sketch_of)
        result = run(out, examples, model, out / "serving")
        assert result.baseline_seen is None and "the model in service trained" not in result.reason
        assert "| unknown |" in (out / "report.md").read_text()
        assert "eval_text_seen_by_baseline" not in executor.key_metrics(result)
    assert "ignoring the unreadable train-text sketch" in caplog.text


def _old_baseline(folder):
    """A SavedModel as exported before `stop_at_eos` existed: `generate` without that input,
    continuing every prompt with "old", and a `score` of 0.5 nats per char."""
    import tensorflow as tf

    class Old(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec([None], tf.string, name="prompt"),
                tf.TensorSpec([], tf.int32, name="max_new_tokens"),
                tf.TensorSpec([], tf.float32, name="temperature"),
            ]
        )
        def generate(self, prompt, max_new_tokens, temperature):
            return {"completion": tf.fill(tf.shape(prompt), "old")}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def score(self, text):
            chars = tf.strings.length(text, unit="UTF8_CHAR")
            return {"nats": tf.cast(chars, tf.float32) * 0.5, "tokens": chars, "chars": chars}

    old = Old()
    signatures = {"generate": old.generate, "score": old.score}
    tf.saved_model.save(old, str(folder), signatures=signatures)
    return folder


def test_a_baseline_exported_before_stop_at_eos_still_continues_the_prompts(tmp_path, trained):
    examples, model = trained
    _old_baseline(tmp_path / "serving" / "1")
    result = run(
        tmp_path, examples, model, tmp_path / "serving", html_report_path=str(tmp_path / "r.html")
    )
    assert result.baseline.nats_per_char == pytest.approx(0.5)
    assert result.baseline.chars == result.candidate.chars
    page = (tmp_path / "r.html").read_text()
    assert page.count('<pre class="sample">old</pre>') == len(executor.COMPARE_PROMPTS)
