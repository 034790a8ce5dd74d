"""Evaluate's HTML report: one self-contained page that the KFP UI shows for the HTML artifact.

The page holds everything inline (CSS in a <style>, plots as base64 PNGs from `plots`), because
the KFP UI serves the artifact's file alone, in a sandboxed frame, and a local copy must open
offline. Every string that comes from data (prompts, continuations, URIs, step names) is
HTML-escaped: only `Markup` built here is trusted.

What it shows comes in as values (`Report`); the rows about the run's steps are derived here
from the executions lineage recorded (`step_records`), and the key numbers the Metrics
artifact logs come from the same values (`key_numbers`), so the page and the metrics agree.
"""

from __future__ import annotations

import base64
import html
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from components import lineage
from components.evaluate import plots
from components.evaluate.plots import History, is_number
from components.evaluate.results import SEEN_MEANS, EvalResult, Scores
from contracts.params import EvalPolicy, TrainJob

NO_CURVE = "no training curve recorded"


class Markup(str):
    """An HTML fragment built here from escaped parts: written out as it is."""


@dataclass(frozen=True)
class Comparison:
    """One prompt and what each model continues it with; None where a model did not write."""

    prompt: str
    candidate: str | None  # None: not sampled (its loss is not finite)
    baseline: str | None  # None: no baseline, or it has no `generate` signature


@dataclass(frozen=True)
class StepRecord:
    """One step of this run as lineage recorded it: time, GPUs and what it ran on."""

    step: str  # tokenize, train, evaluate...
    state: str  # the execution's state: COMPLETE, CACHED, RUNNING (this step), FAILED
    wall_s: float  # end minus start; until now for a RUNNING step; 0 for a CACHED one
    gpus: int  # workers x gpus_per_worker where the step records them, else 0
    gpu_hours: float  # as the step recorded it, else wall_s x gpus / 3600
    image: str  # the image reference the step ran
    image_digest: str  # the digest the pod ran, else the pinned one, else ""
    code_version: str  # git commit of the step's code
    cached_from: str = ""  # the run whose output KFP reused, for a CACHED step
    worker_digests: dict[str, str] = field(default_factory=dict)  # train's worker pods


@dataclass(frozen=True)
class Report:
    """Everything the HTML report shows."""

    result: EvalResult  # the scores and the blessing
    policy: EvalPolicy  # the blessing's threshold and allowed regression
    histories: Mapping[str, History | None]  # "candidate", "baseline": train_history.json
    comparisons: Sequence[Comparison]  # prompts with both models' continuations
    max_new_tokens: int  # the length of those continuations, in tokens
    steps: Sequence[StepRecord]  # this run's steps so far, in start order
    dataset_version: str  # the Examples' content-addressed version
    code_version: str  # the evaluate step's git commit


# ---- values derived from the records --------------------------------------------------------


def step_records(executions: Sequence[lineage.ExecutionView], now_ms: int) -> list[StepRecord]:
    """The report's rows for a run's executions (one per step, as `lineage.run_summary` has)."""
    return [_step_record(view, now_ms) for view in executions]


def _step_record(view: lineage.ExecutionView, now_ms: int) -> StepRecord:
    props = view["properties"]
    params = lineage.parameters_of(view)
    start = _int(props.get("start_time_ms"), view["create_time_ms"])
    end = now_ms if view["state"] == "RUNNING" else _int(props.get("end_time_ms"), start)
    cached = view["state"] == "CACHED"
    wall_s = 0.0 if cached else max(end - start, 0) / 1000
    job = TrainJob.from_dict(params[TrainJob.NAME]) if TrainJob.NAME in params else None
    gpus = job.workers * job.gpus_per_worker if job else 0
    recorded = props.get("gpu_hours")
    gpu_hours = recorded if is_number(recorded) else wall_s * gpus / 3600
    digests = props.get("worker_image_digests") or "{}"
    return StepRecord(
        step=view["step"],
        state=view["state"],
        wall_s=wall_s,
        gpus=gpus,
        gpu_hours=0.0 if cached else float(gpu_hours),
        image=str(props.get("image", "")),
        image_digest=str(props.get("image_digest_observed") or props.get("image_digest") or ""),
        code_version=str(props.get("code_version", "")),
        cached_from=str(props.get("cached_from_run_id", "")) if cached else "",
        worker_digests=json.loads(digests) if isinstance(digests, str) else dict(digests),
    )


def training_summary(history: History | None) -> dict[str, Any]:
    """A history's headline numbers: steps, wall time, s/step, median tokens/s, MFU, device."""
    if not history:
        return {}
    points = history.get("points") or []
    steps = max((p["step"] for p in points if _finite(p.get("step"))), default=None)
    rates = [p["tokens_per_s"] for p in points if _finite(p.get("tokens_per_s"))]
    mfus = [p["mfu"] for p in points if _finite(p.get("mfu"))]
    wall_s = history.get("wall_s")
    summary: dict[str, Any] = {
        "steps": steps,
        "wall_s": wall_s if _finite(wall_s) else None,
        "tokens_per_s": statistics.median(rates) if rates else None,
        "mfu": history["mfu"] if _finite(history.get("mfu")) else _median(mfus),
        "device": history.get("device"),
    }
    if summary["wall_s"] is not None and steps:
        summary["s_per_step"] = summary["wall_s"] / steps
    return summary


def key_numbers(candidate_history: History | None, steps: Sequence[StepRecord]) -> dict[str, float]:
    """Training and run numbers for the KFP Metrics artifact, beside the eval scores.

    Steps still running (evaluate itself) are left out: their time is not final.
    """
    numbers: dict[str, float] = {}
    summary = training_summary(candidate_history)
    for key in ("steps", "wall_s", "s_per_step", "tokens_per_s", "mfu"):
        if is_number(summary.get(key)):
            numbers[f"train_{key}"] = float(summary[key])
    done = [s for s in steps if s.state != "RUNNING"]
    for record in done:
        numbers[f"{record.step}_step_wall_s"] = record.wall_s
        numbers[f"{record.step}_step_gpu_hours"] = record.gpu_hours
    if done:
        numbers["run_wall_s"] = sum(s.wall_s for s in done)
        numbers["run_gpu_hours"] = sum(s.gpu_hours for s in done)
    return numbers


# ---- the page -------------------------------------------------------------------------------


def render_html(report: Report) -> str:
    """The whole report as one HTML document."""
    body = "".join(
        [
            _verdict(report),
            _scores_section(report),
            _training_section(report),
            _steps_section(report.steps),
            _samples_section(report),
            _provenance_section(report),
        ]
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>gptpipe evaluation</title><style>{_CSS}</style></head>"
        f"<body><h1>gptpipe evaluation</h1>{body}</body></html>\n"
    )


def _verdict(report: Report) -> Markup:
    result = report.result
    word, css = ("Blessed", "blessed") if result.blessed else ("Not blessed", "not-blessed")
    return Markup(f'<p class="verdict {css}"><strong>{word}</strong>: {_esc(result.reason)}</p>')


def _scores_section(report: Report) -> Markup:
    result = report.result
    rows = [_score_row("candidate", result.candidate, "") + [result.seen_text("candidate")]]
    if result.baseline is not None:
        rows.append(
            _score_row("baseline", result.baseline, result.baseline_model)
            + [result.seen_text("baseline")]
        )
    header = ["model", "nats/char", "nats/token", "perplexity", "tokens", "chars", "SavedModel"]
    table = _table([*header, "eval text trained on"], rows)
    rules = [
        f"max_nats_per_char: the candidate's nats/char is at most "
        f"{_num(report.policy.max_nats_per_char, '.4f')}",
        f"tolerance: it is at most the baseline's times 1 + {_num(report.policy.tolerance, '.2%')}",
    ]
    if result.baseline is not None:
        limit = result.baseline.nats_per_char * (1 + report.policy.tolerance)
        rules[1] += f" = {_num(limit, '.4f')}"
    else:
        rules[1] += ": skipped, no model is in service yet"
    items = "".join(f"<li>{_esc(rule)}</li>" for rule in rules)
    seen = f"<p>{_esc(SEEN_MEANS)}</p>"
    return _section(
        "scores",
        "Eval loss",
        Markup(f"{table}<p>Blessed when both hold:</p><ul>{items}</ul>{seen}"),
    )


def _score_row(name: str, scores: Scores, uri: str) -> list[str]:
    return [
        name,
        _num(scores.nats_per_char, ".4f"),
        _num(scores.nats_per_token, ".4f"),
        _num(scores.perplexity, ".2f"),
        str(scores.tokens),
        str(scores.chars),
        uri or "this run's Model",
    ]


def _training_section(report: Report) -> Markup:
    histories = report.histories
    parts = [_image(plots.loss_curves(histories), "train and eval loss against tokens seen")]
    parts.append(_image(plots.throughput(histories), "tokens per second against tokens seen"))
    rows = []
    for name, history in histories.items():
        if name == "baseline" and report.result.baseline is None:
            continue
        summary = training_summary(history)
        if not summary:
            rows.append([name, NO_CURVE, "", "", "", "", ""])
            continue
        rows.append(
            [
                name,
                _num(summary["steps"], "d"),
                _duration(summary["wall_s"]),
                _num(summary.get("s_per_step"), ".3f"),
                _num(summary["tokens_per_s"], ",.0f"),
                _num(summary["mfu"], ".1%"),
                str(summary["device"] or "n/a"),
            ]
        )
    headers = ["model", "steps", "wall time", "s/step", "tokens/s (median)", "MFU", "device"]
    return _section("training", "Training", Markup("".join(parts) + _table(headers, rows)))


def _steps_section(steps: Sequence[StepRecord]) -> Markup:
    rows = [
        [
            s.step,
            s.state.lower() + (f" (from run {s.cached_from})" if s.cached_from else ""),
            _duration(s.wall_s) + (" so far" if s.state == "RUNNING" else ""),
            str(s.gpus),
            _num(s.gpu_hours, ".3f"),
        ]
        for s in steps
    ]
    rows.append(
        [
            "total",
            "",
            _duration(sum(s.wall_s for s in steps)),
            "",
            _num(sum(s.gpu_hours for s in steps), ".3f"),
        ]
    )
    note = Markup(
        "<p>From ML Metadata. Push runs after this report; a cached step cost nothing in "
        "this run.</p>"
    )
    table = _table(["step", "state", "wall time", "GPUs", "GPU-hours"], rows)
    return _section("steps", "Steps of this run", Markup(table + note))


def _samples_section(report: Report) -> Markup:
    rows = [
        [
            Markup(f"<pre>{_esc(c.prompt)}</pre>"),
            _sample(c.candidate, "not sampled: training diverged or its loss is not finite"),
            _sample(c.baseline, "no baseline" if report.result.baseline is None else "none"),
        ]
        for c in report.comparisons
    ]
    intro = Markup(
        f"<p>Greedy continuations of {report.max_new_tokens} tokens, the same for every run of "
        "the same model.</p>"
    )
    table = _table(["prompt", "candidate", "baseline"], rows, css="samples")
    return _section("samples", "Samples", Markup(intro + table))


def _provenance_section(report: Report) -> Markup:
    facts = _table(
        ["what", "value"],
        [
            ["dataset version", report.dataset_version or "unknown"],
            ["code version", report.code_version or "unknown"],
        ],
    )
    rows = [[s.step, s.image, s.image_digest or "unpinned", s.code_version] for s in report.steps]
    rows += [
        [f"train worker {pod}", "", digest, ""]
        for s in report.steps
        for pod, digest in sorted(s.worker_digests.items())
    ]
    images = _table(["step", "image", "digest", "code version"], rows)
    return _section("provenance", "Provenance", Markup(facts + images))


# ---- HTML pieces ----------------------------------------------------------------------------


def _section(anchor: str, title: str, content: Markup) -> Markup:
    return Markup(f'<section id="{anchor}"><h2>{_esc(title)}</h2>{content}</section>')


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], css: str = "") -> Markup:
    """A table; every cell is escaped unless it is Markup."""
    head = "".join(f"<th>{_cell(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in row) + "</tr>" for row in rows)
    klass = f' class="{css}"' if css else ""
    return Markup(f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def _image(png: bytes | None, alt: str) -> Markup:
    if png is None:
        return Markup(f'<p class="missing">{_esc(alt)}: {NO_CURVE}.</p>')
    data = base64.b64encode(png).decode("ascii")
    return Markup(f'<img alt="{_esc(alt)}" src="data:image/png;base64,{data}">')


def _sample(text: str | None, missing: str) -> Markup:
    if text is None:
        return Markup(f'<span class="missing">{_esc(missing)}</span>')
    if not text.strip():  # a young model's favourite: newlines only
        return Markup(f'<span class="missing">only whitespace ({len(text)} characters)</span>')
    return Markup(f'<pre class="sample">{_esc(text)}</pre>')


def _cell(value: str) -> str:
    return value if isinstance(value, Markup) else _esc(value)


def _esc(text: str) -> str:
    return html.escape(str(text), quote=True)


def _num(value: Any, spec: str) -> str:
    """A number for the page: "n/a" when missing, "nan"/"inf" as Python writes them."""
    if not is_number(value):
        return "n/a"
    if not math.isfinite(value):
        return str(value)
    return format(int(value) if spec == "d" else value, spec)


def _duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _int(value: Any, default: int) -> int:
    return int(value) if _finite(value) else default


def _finite(value: object) -> TypeGuard[float]:
    return is_number(value) and math.isfinite(value)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#1b1f24;
max-width:1100px;line-height:1.4}
h1{font-size:1.6em;margin:0 0 12px}h2{font-size:1.2em;border-bottom:1px solid #d0d7de;
padding-bottom:4px;margin-top:28px}
table{border-collapse:collapse;margin:8px 0;font-size:0.92em}
th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa}
table.samples td{width:33%}
pre{margin:0;white-space:pre-wrap;word-break:break-word;font-family:ui-monospace,monospace}
pre.sample{max-height:18em;overflow:auto}
img{display:block;max-width:100%;margin:8px 0}
.verdict{padding:10px 14px;border-radius:6px;font-size:1.05em}
.blessed{background:#dafbe1;border:1px solid #2da44e}
.not-blessed{background:#ffebe9;border:1px solid #cf222e}
.missing{color:#57606a;font-style:italic}
"""
