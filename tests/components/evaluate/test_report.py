"""Evaluate's HTML report: a valid, self-contained page that renders, and `gptpipe report`.

The page is checked with `html.parser` (structure, inline PNGs, nothing external, escaping)
and rendered by headless Chromium (Debian's `chromium`, which `make test` installs where it
can). The evaluate component then runs on one tiny trained model, its training curve written
into the SavedModel as the trainer exports it, and `gptpipe report` finds the page it wrote
through lineage.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import math
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from kfp import dsl

from components import lineage, provenance
from components.evaluate import executor, plots, report
from components.evaluate.executor import EvalResult, Scores
from contracts.artifacts import SERVING_DIR, TRAIN_HISTORY
from contracts.errors import UserError
from contracts.params import EvalPolicy, TrainJob
from pipelines.cli import report as report_cmd

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EVIL = '<script>alert("x")</script> & "quotes"'
VOID = {"meta", "img", "br", "hr", "link", "input", "col", "area", "base", "source", "wbr"}
JOB_2X4 = TrainJob(workers=2, gpus_per_worker=4).to_dict()
PROVENANCE = {"image": provenance.LOCAL_IMAGE, "unpinned": 1, "code_version": "c0ffee"}


def history(speed: float = 1.0, mfu: bool = False) -> dict:
    """A plausible train_history.json: loss falling over 40 steps of 128 tokens."""
    points = [
        {
            "step": s,
            "tokens": s * 128,
            "loss": 1.5 + 4.0 * math.exp(-s / (12 * speed)),
            "learning_rate": 1e-3,
            "tokens_per_s": 900 * speed + 60 * math.sin(s),
            **({"mfu": 0.3 + 0.01 * math.cos(s)} if mfu else {}),
        }
        for s in range(1, 41)
    ]
    evals = [{"step": s, "tokens": s * 128, "val_loss": 1.7 + 3.0 / s} for s in (10, 20, 30, 40)]
    return {"points": points, "eval_points": evals, "wall_s": 12.5, "device": "CPU"}


def scores(nats_per_char: float) -> Scores:
    return Scores(nats_per_char * 3, nats_per_char, math.exp(nats_per_char * 3), 100, 300)


def page(histories: dict, *, baseline: bool = True, steps: tuple = ()) -> report.Report:
    result = EvalResult(
        scores(1.9), scores(2.0) if baseline else None, "/srv/gpt/1" if baseline else "", True, "ok"
    )
    comparisons = [
        report.Comparison(EVIL, "a continuation", "the baseline's" if baseline else None),
        report.Comparison("ROMEO:", None, None),
    ]
    return report.Report(
        result=result,
        policy=EvalPolicy(max_nats_per_char=2.2, tolerance=0.01),
        histories=histories,
        comparisons=comparisons,
        max_new_tokens=64,
        steps=list(steps),
        dataset_version="d" * 64,
        code_version="c0ffee",
    )


class Tree(HTMLParser):
    """Parses a page, keeping what the checks need: tags in order, attributes, text, errors."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str, str]] = []  # (tag, name, value)
        self.text: list[str] = []
        self.errors: list[str] = []
        self.doctype = ""

    def handle_decl(self, decl: str) -> None:
        self.doctype = decl

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append(tag)
        self.attrs += [(tag, name, value or "") for name, value in attrs]
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:]}")
        else:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(text: str) -> Tree:
    tree = Tree()
    tree.feed(text)
    tree.close()
    return tree


# ---- the page -------------------------------------------------------------------------------


def test_the_page_is_valid_html_with_every_image_inline():
    text = report.render_html(page({"candidate": history(mfu=True), "baseline": history(0.6)}))
    tree = parse(text)
    assert tree.doctype.lower() == "doctype html"
    assert not tree.errors and not tree.stack, (tree.errors, tree.stack)
    assert tree.tags[:3] == ["html", "head", "meta"] and "body" in tree.tags
    images = [value for tag, name, value in tree.attrs if tag == "img" and name == "src"]
    assert len(images) == 2  # the loss curves and the throughput
    for src in images:
        prefix = "data:image/png;base64,"
        assert src.startswith(prefix)
        assert base64.b64decode(src[len(prefix) :], validate=True).startswith(PNG_SIGNATURE)
    linked = [(t, n, v) for t, n, v in tree.attrs if n in ("src", "href", "srcset", "action")]
    assert all(v.startswith("data:image/png;base64,") for _, _, v in linked), linked
    assert not {"script", "link", "iframe", "object", "embed"} & set(tree.tags)
    assert "url(" not in text and "@import" not in text
    for anchor in ("scores", "training", "steps", "samples", "provenance"):
        assert ("section", "id", anchor) in tree.attrs


def test_data_is_escaped_not_run():
    text = report.render_html(page({"candidate": history(), "baseline": None}))
    tree = parse(text)
    assert "script" not in tree.tags
    assert EVIL in "".join(tree.text)  # shown as text, exactly as the prompt was
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &quot;quotes&quot;" in text


def test_without_a_training_curve_the_page_says_so():
    text = report.render_html(page({"candidate": None, "baseline": None}, baseline=False))
    tree = parse(text)
    assert "img" not in tree.tags and not tree.errors
    body = "".join(tree.text)
    assert body.count(report.NO_CURVE) == 3  # two missing plots and the candidate's row
    assert "skipped, no model is in service yet" in body
    assert "not sampled: training diverged" in body


def test_a_diverged_curve_still_draws():
    diverged = history()
    for point in diverged["points"][20:]:
        point["loss"] = float("nan")
    del diverged["eval_points"]
    png = plots.loss_curves({"candidate": diverged, "baseline": None})
    assert png is not None and png.startswith(PNG_SIGNATURE)
    assert plots.series(diverged["points"], "tokens", "loss")[0][-1] == 40 * 128
    assert plots.throughput({"candidate": {"points": []}}) is None


def test_step_records_time_and_gpu_hours_from_lineage_views():
    hour_ms = 3_600_000

    def view(step, state, start, end, params, **props):
        properties = {
            "start_time_ms": start,
            "end_time_ms": end,
            "parameters": json.dumps(params),
            **PROVENANCE,
            **props,
        }
        return {"step": step, "state": state, "properties": properties, "create_time_ms": start}

    views = [
        view("tokenize", "COMPLETE", 0, 90_000, {"corpus": "c"}),
        view("train", "COMPLETE", 0, hour_ms, {"train_job": JOB_2X4}),
        view("evaluate", "RUNNING", hour_ms, hour_ms, {}),
    ]
    records = report.step_records(views, now_ms=hour_ms + 30_000)
    tokenize, train, evaluate = records
    assert (tokenize.wall_s, tokenize.gpus, tokenize.gpu_hours) == (90.0, 0, 0.0)
    assert (train.wall_s, train.gpus, train.gpu_hours) == (3600.0, 8, 8.0)
    assert evaluate.wall_s == 30.0  # running: until now
    recorded = view("train", "COMPLETE", 0, hour_ms, {"train_job": JOB_2X4}, gpu_hours=7.5)
    assert report.step_records([recorded], 0)[0].gpu_hours == 7.5  # the launcher's own figure
    cached = view("train", "CACHED", 5, 5, {"train_job": JOB_2X4}, gpu_hours=7.5)
    cached["properties"]["cached_from_run_id"] = "run-0"
    assert report.step_records([cached], 0)[0].gpu_hours == 0.0
    numbers = report.key_numbers(history(), records)
    assert numbers["train_step_gpu_hours"] == 8.0 and "evaluate_step_wall_s" not in numbers
    assert numbers["run_wall_s"] == 3690.0 and numbers["train_steps"] == 40
    assert numbers["train_tokens_per_s"] == pytest.approx(900, abs=60)


def test_the_page_renders_in_headless_chromium(tmp_path):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip(
            "headless Chromium is not installed: `make test` installs Debian's `chromium` "
            "package when it runs as root with apt-get; install it to run this check"
        )
    steps = report.step_records(
        [
            {
                "step": "train",
                "state": "COMPLETE",
                "create_time_ms": 0,
                "properties": {"start_time_ms": 0, "end_time_ms": 95_000, **PROVENANCE},
            }
        ],
        0,
    )
    html_file = tmp_path / "report.html"
    html_file.write_text(
        report.render_html(page({"candidate": history(), "baseline": history(0.6)}, steps=steps))
    )
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            # No network (the page needs none) and no profile outside tmp_path.
            "--disable-background-networking",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1200,2000",
            html_file.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    pixels = _image(shot.read_bytes())
    assert pixels.shape[:2] == (2000, 1200)
    colors = np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)
    assert len(colors) > 64  # plot lines, text antialiasing, the verdict's green
    non_white = np.any(pixels[..., :3] < 0.95, axis=-1).mean()
    assert non_white > 0.02, f"only {non_white:.1%} of the screenshot is not white"


def _image(png: bytes) -> np.ndarray:
    from matplotlib import image

    return image.imread(io.BytesIO(png), format="png")


# ---- `gptpipe report` on a store a test records ---------------------------------------------


def gptpipe_report(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="gptpipe")
    report_cmd.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["report", *argv])
    return int(args.func(args))


def record_evaluate(store: str, run_id: str, report_file: Path | None) -> None:
    """An evaluate execution as the component records it: with its HTML report, or failed."""
    try:
        with lineage.step(store, "evaluate", "gptpipe", run_id, {}, PROVENANCE) as rec:
            if report_file is None:
                raise UserError("the candidate model: no SavedModel")
            report_file.parent.mkdir(parents=True, exist_ok=True)
            report_file.write_text("<!DOCTYPE html><html><body>report</body></html>")
            rec.output("html_report", "ModelEvaluation", str(report_file))
    except SystemExit:
        pass  # a failed step exits 2, as in its pod


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    store = str(root / "metadata.sqlite")
    record_evaluate(store, "run-1", root / "pipeline_root" / "run-1" / "html_report")
    record_evaluate(store, "run-2", None)  # newer, its evaluate failed
    return root


def test_report_prints_an_html_copy_of_the_run_s_report(runs, capsys):
    assert gptpipe_report("run-1", "--root", str(runs)) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed == (runs / "reports" / "run-1.html").resolve()
    artifact = runs / "pipeline_root" / "run-1" / "html_report"
    assert printed.read_bytes() == artifact.read_bytes()
    artifact.write_text("<!DOCTYPE html><html><body>rewritten</body></html>")
    gptpipe_report("--latest", "--root", str(runs))  # run-2 has none: the newest with one
    assert Path(capsys.readouterr().out.strip()) == printed
    assert "rewritten" in printed.read_text()


def test_report_open_hands_the_copy_to_a_browser(runs, capsys, monkeypatch):
    opened = []
    monkeypatch.setattr(report_cmd.webbrowser, "open", lambda url: opened.append(url) or True)
    gptpipe_report("--root", str(runs), "--open")
    assert opened == [(runs / "reports" / "run-1.html").resolve().as_uri()]


@pytest.mark.bad_input("gptpipe report: unknown run, run without report, no store, no runs")
def test_report_errors_are_one_line(runs, tmp_path):
    cases = [
        (("nope", "--root", str(runs)), "no run 'nope' in metadata store"),
        (
            ("run-2", "--root", str(runs)),
            "run 'run-2' has no HTML report: its step 'evaluate' failed: the candidate model",
        ),
        (("run-1", "--latest", "--root", str(runs)), "give a RUN or --latest, not both"),
        (("--root", str(tmp_path / "empty")), "no metadata store at"),
    ]
    for argv, message in cases:
        with pytest.raises(UserError, match=message) as raised:
            gptpipe_report(*argv)
        assert "\n" not in str(raised.value)
    no_reports = tmp_path / "other"
    record_evaluate(str(no_reports / "metadata.sqlite"), "run-9", None)
    with pytest.raises(UserError, match="no run with an HTML report"):
        gptpipe_report("--latest", "--root", str(no_reports))


# ---- the evaluate step on a tiny trained model ----------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory, examples, tiny_model):
    """The session's tiny model, copied, with a training curve in its SavedModel."""
    model = tmp_path_factory.mktemp("report") / "model"
    shutil.copytree(tiny_model, model)
    curve = model / SERVING_DIR / TRAIN_HISTORY
    curve.parent.mkdir(parents=True, exist_ok=True)
    curve.write_text(json.dumps(history()))
    return examples, model


@pytest.mark.slow
def test_evaluate_writes_the_html_report_and_metrics(trained, tmp_path, monkeypatch, capsys):
    from components.evaluate import component

    examples, model = trained
    serving = tmp_path / "serving" / "gpt"
    shutil.copytree(model / SERVING_DIR, serving / "1")  # the same model is in service
    (serving / "1" / TRAIN_HISTORY).write_text(json.dumps(history(speed=0.5)))
    root = tmp_path / "runs"
    store = str(root / "metadata.sqlite")
    monkeypatch.setenv(provenance.RUN_ID_ENV, "run-1")
    monkeypatch.setenv(provenance.CODE_VERSION_ENV, "c0ffee")
    with lineage.step(
        store,
        "train",
        "gptpipe",
        "run-1",
        {"train_job": TrainJob(workers=2, gpus_per_worker=0).to_dict()},
        PROVENANCE,
    ):
        pass
    out = root / "pipeline_root" / "run-1" / "evaluate"
    metrics = dsl.Metrics(uri=str(out / "metrics"))
    html_report = dsl.HTML(uri=str(out / "html_report"))
    component.evaluate(
        examples_uri=str(examples),
        dataset_version="d" * 64,
        model=dsl.Model(uri=str(model)),
        serving_dir=str(serving),
        eval_policy=EvalPolicy(max_nats_per_char=10.0, tolerance=0.01).to_dict(),
        metadata=store,
        pipeline_name="gptpipe",
        image=provenance.LOCAL_IMAGE,
        metrics=metrics,
        report=dsl.Markdown(uri=str(out / "report")),
        blessing=dsl.Artifact(uri=str(out / "blessing")),
        html_report=html_report,
    )
    text = Path(html_report.path).read_text()
    tree = parse(text)
    assert not tree.errors and tree.tags.count("img") == 2
    shown = "".join(tree.text)
    for prompt in executor.COMPARE_PROMPTS:
        assert prompt.strip() in shown
    assert "Blessed" in shown and "d" * 64 in shown and "c0ffee" in shown
    assert str(serving / "1") in shown
    numbers = metrics.metadata
    assert numbers["blessed"] == 1.0 and numbers["baseline_nats_per_char"] > 0
    assert numbers["train_steps"] == 40 and numbers["train_tokens_per_s"] > 0
    assert "train_step_wall_s" in numbers and numbers["run_gpu_hours"] == 0.0

    assert gptpipe_report("--latest", "--root", str(root)) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed.read_text() == text


@pytest.mark.slow
def test_greedy_continuations_are_the_same_every_time(trained):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 -- registers the in-graph SentencePiece ops

    _, model = trained
    loaded = tf.saved_model.load(str(model / SERVING_DIR))
    first = executor.continue_prompts(loaded, executor.COMPARE_PROMPTS, 16)
    assert first is not None and len(first) == len(executor.COMPARE_PROMPTS)
    assert executor.continue_prompts(loaded, executor.COMPARE_PROMPTS, 16) == first
