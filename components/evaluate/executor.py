"""Evaluate: score the candidate and the model in service on the same eval text, and bless.

Both models score the eval split's raw text through their own in-graph tokenizer (the
SavedModel's `score` signature), so the comparison holds across tokenizers; the text is
streamed, document by document, in bounded memory (`scoring.py`). nats/char is the
tokenizer-independent number the blessing uses; nats/token and perplexity are reported too.
The outcome is written as a Markdown report, an HTML report (`report.py`) and the blessing.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components import model_artifact, overlap, serving, storage
from components.evaluate import report
from components.evaluate.results import SEEN_MEANS, EvalResult, RunFacts, Scores
from components.evaluate.scoring import score_eval_text, signature_scorer
from contracts.artifacts import (
    EVAL_TEXT,
    MODEL_TEXT_SKETCH,
    SAVED_MODEL_FILE,
    SERVING_DIR,
    SIGNATURES,
    TRAIN_HISTORY,
    TRAIN_METRICS,
)
from contracts.blessing import EvalTextSeen, ModelBlessing, write_blessing
from contracts.errors import UserError
from contracts.params import EvalPolicy
from contracts.training import parse_metrics

if TYPE_CHECKING:
    from components.step import Step

log = logging.getLogger(__name__)

SAMPLE_PROMPTS = ("ROMEO:", "First Citizen:\n", "The king")  # prompts for the report's samples
# Prompts both models continue, side by side, in the HTML report; greedily, so each model
# always writes the same continuation and runs compare.
COMPARE_PROMPTS = ("ROMEO:", "JULIET:\n", "First Citizen:\n", "To be, or not to be", "The king")
COMPARE_TOKENS = 64  # new tokens per continuation: enough to read, quick on CPU
# What to do when a SavedModel is missing or damaged: the candidate's, or the one in service.
_RETRAIN = "run the pipeline again to train it anew"
_RESERVE = "run evaluate again; if it stays so, serve a healthy version (gptpipe rollback)"
# A model that trained on this share of the eval text or more gets a note in the reason: its
# score is flattered (components/overlap.py).
SEEN_NOTE = 0.01


def execute(
    step: Step,
    *,
    examples_uri: str,
    dataset_version: str,
    model: Any,
    serving_dir: str,
    eval_policy: dict,
    metrics: Any,
    report: Any,
    blessing: Any,
    html_report: Any,
) -> None:
    """The evaluate step: `run` on the candidate, then its numbers, report and blessing as
    KFP artifacts and lineage. The Examples arrive as their content-addressed URI, as train's
    do: evaluate reads only their eval text. The HTML report also tells this run's steps so
    far, read back from lineage."""
    from components import kfp_metadata, lineage

    policy = EvalPolicy.from_dict(eval_policy)
    # The serving folder is shared with TF Serving and later runs: gs:// in a cluster.
    step.check_shared(serving_dir, "serving_dir")
    step.rec.input("examples", lineage.EXAMPLES_TYPE, examples_uri, upstream=True)
    step.rec.input("model", lineage.MODEL_TYPE, model.uri, upstream=True)
    facts = RunFacts(
        dataset_version=dataset_version,
        code_version=str(step.edge.provenance.get("code_version", "")),
        executions=list(lineage.run_summary(step.edge.store, step.edge.run_id)["steps"].values()),
    )
    result = run(
        model.path,
        examples_uri,
        serving_dir,
        blessing.path,
        report.path,
        policy=policy,
        html_report_path=html_report.path,
        run_facts=facts,
    )
    numbers = key_metrics(result)
    for name, value in kfp_metadata.recordable(numbers).items():
        metrics.log_metric(name, value)
    decided = model_blessing(result, model.uri)
    blessing.metadata.update(kfp_metadata.recordable(decided.properties()))
    step.rec.output("evaluation", lineage.MODEL_EVALUATION_TYPE, metrics.uri, numbers)
    step.rec.output("blessing", lineage.MODEL_BLESSING_TYPE, blessing.uri, dict(blessing.metadata))
    html = {"media_type": "text/html"}
    step.rec.output("html_report", lineage.MODEL_EVALUATION_TYPE, html_report.uri, html)
    step.rec.dataset_version = dataset_version


def run(
    model_dir: str,
    examples_uri: str,
    serving_dir: str,
    blessing_dir: str,
    report_path: str,
    *,
    policy: EvalPolicy,
    num_samples: int = 3,
    sample_tokens: int = 48,
    html_report_path: str = "",
    run_facts: RunFacts | None = None,
    compare_tokens: int = COMPARE_TOKENS,
) -> EvalResult:
    """Score candidate and baseline on the eval split, decide the blessing, write the outputs.

    `examples_uri` is the content-addressed Examples folder (local or gs://); only its eval text
    is read, so nothing else of the dataset is downloaded.

    The candidate is blessed when its nats/char is at most `policy.max_nats_per_char` and, if
    a model is in service at `serving_dir`, at most the baseline's times `1 + policy.tolerance`.
    A model whose training diverged (a NaN or infinite loss) never is.

    The blessing is written last, whole or not at all: a failure before it (an incomplete
    Model, a damaged SavedModel, a baseline removed meanwhile) raises a UserError naming the
    model and leaves no ModelBlessing, which push refuses.

    With `html_report_path`, the HTML report is written there too: both models' training
    curves, `COMPARE_PROMPTS` continued by each, and this run's steps from `run_facts`.
    """
    eval_uri = _eval_text_uri(examples_uri)
    model_artifact.require_complete(model_dir)
    candidate_model = _load(Path(model_dir) / SERVING_DIR, "the candidate model", _RETRAIN)
    candidate, candidate_seen = _measure(
        candidate_model, eval_uri, storage.join(model_dir, SERVING_DIR)
    )
    baseline_uri = serving.latest_version_uri(serving_dir)
    prompts = COMPARE_PROMPTS if html_report_path else ()
    baseline, baseline_seen, baseline_says = (
        _evaluate_baseline(baseline_uri, eval_uri, prompts, compare_tokens)
        if baseline_uri
        else (None, None, None)
    )
    diverged = _diverged(model_dir)
    blessed, reason = decide(candidate, baseline, policy, diverged)
    reason += _flattered(candidate_seen, baseline_seen)
    facts = run_facts or RunFacts()
    steps = report.step_records(facts.executions, int(time.time() * 1000))
    histories = {
        "candidate": read_history(storage.join(model_dir, SERVING_DIR)),
        "baseline": read_history(baseline_uri) if baseline_uri else None,
    }
    numbers = report.key_numbers(histories["candidate"], steps)
    result = EvalResult(
        candidate,
        baseline,
        baseline_uri or "",
        blessed,
        reason,
        numbers,
        candidate_seen,
        baseline_seen,
    )
    # A diverged model's logits are NaN: sampling from them is meaningless, so show none.
    healthy = not diverged and math.isfinite(candidate.nats_per_char)
    samples = generate_samples(candidate_model, num_samples, sample_tokens) if healthy else []
    storage.write_text_atomic(report_path, render_report(result, samples))
    if html_report_path:
        candidate_says = (
            continue_prompts(candidate_model, prompts, compare_tokens) if healthy else None
        )
        page = report.Report(
            result=result,
            policy=policy,
            histories=histories,
            comparisons=_comparisons(prompts, candidate_says, baseline_says),
            max_new_tokens=compare_tokens,
            steps=steps,
            dataset_version=facts.dataset_version,
            code_version=facts.code_version,
        )
        storage.write_text_atomic(html_report_path, report.render_html(page))
    _write_blessing(blessing_dir, result, model_dir)  # last: push acts on it
    log.info("eval: %s", reason)
    return result


def decide(
    candidate: Scores,
    baseline: Scores | None,
    policy: EvalPolicy,
    diverged: str = "",
) -> tuple[bool, str]:
    """Return (blessed, reason) from the scores: absolute threshold, then change vs baseline."""
    ours = candidate.nats_per_char
    threshold, tolerance = policy.max_nats_per_char, policy.tolerance
    if diverged:
        return False, f"training diverged: {diverged}"
    if not math.isfinite(ours):
        return False, f"eval loss is not finite ({ours})"
    if ours > threshold:
        return False, f"eval {ours:.4f} nats/char is above the threshold {threshold:.4f}"
    if baseline is None:
        return True, f"eval {ours:.4f} nats/char meets the threshold; no baseline in service"
    limit = baseline.nats_per_char * (1.0 + tolerance)
    if ours > limit:
        return False, (
            f"eval {ours:.4f} nats/char is worse than the baseline's "
            f"{baseline.nats_per_char:.4f} by more than {tolerance:.1%}"
        )
    return True, (
        f"eval {ours:.4f} nats/char meets the threshold and is within {tolerance:.1%} "
        f"of the baseline's {baseline.nats_per_char:.4f}"
    )


def _measure(model, eval_uri: str, saved_model_uri: str) -> tuple[Scores, overlap.Seen | None]:
    """Score the eval text at `eval_uri` with `model`, loaded from `saved_model_uri`, and on the
    same streamed pass, how much of it the model trained on (None where that is unknown)."""
    seen = _seen_count(saved_model_uri)
    scores = score_eval_text(signature_scorer(model), eval_uri, seen)
    return scores, seen.result() if seen else None


def _seen_count(saved_model_uri: str) -> overlap.SeenCount | None:
    """A count of how much of an eval text the SavedModel at `saved_model_uri` trained on, from
    the sketch it carries (MODEL_TEXT_SKETCH); None without one (exported before it was
    written), or with a warning for an unreadable one: it only informs."""
    uri = storage.join(saved_model_uri, MODEL_TEXT_SKETCH)
    if not storage.has_content(uri):
        return None
    try:
        return overlap.SeenCount.of(storage.read_bytes(uri))
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("ignoring the unreadable train-text sketch %s: %s", uri, err)
        return None


def _flattered(candidate: overlap.Seen | None, baseline: overlap.Seen | None) -> str:
    """Notes for the reason on each model that trained on SEEN_NOTE or more of the eval text:
    its score is flattered, so the comparison leans its way."""
    notes = []
    if baseline and baseline.share >= SEEN_NOTE:
        notes.append(
            f"the model in service trained on {baseline.describe()}, which flatters its score "
            "(the split changed since it trained: eval_fraction, or an edited corpus file)"
        )
    if candidate and candidate.share >= SEEN_NOTE:
        notes.append(
            f"the candidate trained on {candidate.describe()}, which flatters its score (the "
            "corpus repeats that text in its train split)"
        )
    return "".join(f"; note: {note}" for note in notes)


def generate_samples(model, num_samples: int, max_new_tokens: int) -> list[tuple[str, str]]:
    """Return (prompt, completion) pairs from the model's `generate` signature."""
    prompts = [SAMPLE_PROMPTS[i % len(SAMPLE_PROMPTS)] for i in range(num_samples)]
    if not prompts:
        return []
    completions = _generate(model, prompts, max_new_tokens, temperature=0.8)
    return list(zip(prompts, completions, strict=True))


def continue_prompts(model, prompts: Sequence[str], max_new_tokens: int) -> list[str] | None:
    """Greedy continuations (temperature 0: the same every time) through `generate`.

    None when there is nothing to ask, or the SavedModel has no `generate` signature.
    """
    if not prompts or "generate" not in model.signatures:
        return None
    return _generate(model, prompts, max_new_tokens, temperature=0.0)


def read_history(saved_model_uri: str) -> dict[str, Any] | None:
    """A SavedModel's training curve (TRAIN_HISTORY, local or gs://), or None without one.

    Models exported before the trainer wrote it have none; an unreadable one is treated alike,
    with a warning: it only feeds the report.
    """
    uri = storage.join(saved_model_uri, TRAIN_HISTORY)
    if not storage.has_content(uri):
        return None
    try:
        history = json.loads(storage.read_bytes(uri))  # Python's json reads NaN and Infinity
    except ValueError as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        log.warning("ignoring the unreadable training history %s: %s", uri, err)
        return None
    return history if isinstance(history, dict) else None


def render_report(result: EvalResult, samples: list[tuple[str, str]]) -> str:
    """Render the Markdown report shown in the KFP UI."""
    rows = [("candidate", result.candidate)]
    if result.baseline:
        rows.append(("baseline", result.baseline))
    lines = [
        "# Evaluation",
        "",
        f"**{'Blessed' if result.blessed else 'Not blessed'}**: {result.reason}",
        "",
        "| model | nats/token | nats/char | perplexity | tokens | chars | eval text trained on |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in rows:
        lines.append(
            f"| {name} | {s.nats_per_token:.4f} | {s.nats_per_char:.4f} | "
            f"{s.perplexity:.2f} | {s.tokens} | {s.chars} | {result.seen_text(name)} |"
        )
    lines += ["", SEEN_MEANS, ""]
    if result.baseline is None:
        lines += [
            "No model is in service yet, so the change check against a baseline was skipped.",
            "",
        ]
    else:
        lines += [f"Baseline: `{result.baseline_model}`", ""]
    lines += ["## Samples", ""]
    if not samples:
        lines += ["No samples: the model's loss is not finite.", ""]
    for prompt, completion in samples:
        lines += ["```text", prompt + completion, "```", ""]
    return "\n".join(lines)


def model_blessing(result: EvalResult, current_model: str) -> ModelBlessing:
    """The ModelBlessing of `result` for the candidate at `current_model`: what the blessing
    folder holds (its local path) and, with its URI, the artifact's KFP metadata."""
    return ModelBlessing(
        blessed=int(result.blessed),
        reason=result.reason,
        current_model=current_model,
        baseline_model=result.baseline_model,
        candidate=result.candidate,
        baseline=result.baseline,
        eval_text_seen=EvalTextSeen(result.candidate_seen, result.baseline_seen),
    )


def _write_blessing(blessing_dir: str, result: EvalResult, model_dir: str) -> None:
    with storage.atomic_dir(blessing_dir) as tmp:
        write_blessing(tmp, model_blessing(result, model_dir))


def _evaluate_baseline(
    uri: str, eval_uri: str, prompts: Sequence[str], max_new_tokens: int
) -> tuple[Scores, overlap.Seen | None, list[str] | None]:
    """Score the SavedModel at `uri` on the eval text at `eval_uri`, with the share of it that
    model trained on, and continue `prompts` with it.

    A gs:// model is downloaded to a temporary folder first. TensorFlow's built-in GCS file
    system ignores STORAGE_EMULATOR_HOST (it always calls www.googleapis.com), and the
    tensorflow-io-gcs-filesystem plugin, which honours CLOUD_STORAGE_EMULATOR_ENDPOINT,
    crashes TensorFlow 2.19; a local copy through the storage layer works against GCS and the
    emulator alike and checks crc32c.
    """
    with storage.local_copy(uri) as local:
        needs = SIGNATURES if prompts else ("score",)
        model = _load(local, f"the model in service at {uri}", _RESERVE, needs)
        scores, seen = _measure(model, eval_uri, str(local))
        return scores, seen, continue_prompts(model, prompts, max_new_tokens)


def _score_baseline(uri: str, eval_uri: str) -> Scores:
    """Score the SavedModel at `uri` (local or gs://) on the eval text at `eval_uri`, without
    continuations."""
    return _evaluate_baseline(uri, eval_uri, (), 0)[0]


def _generate(model, prompts: Sequence[str], max_new_tokens: int, temperature: float) -> list[str]:
    """Continuations through `generate`, each ending at its document's end (EOS), when the
    model can tell it: one exported before `stop_at_eos` existed has no such input."""
    import tensorflow as tf

    generate = model.signatures["generate"]
    inputs = {
        "prompt": tf.constant(list(prompts)),
        "max_new_tokens": tf.constant(max_new_tokens, tf.int32),
        "temperature": tf.constant(temperature, tf.float32),
    }
    if "stop_at_eos" in generate.structured_input_signature[1]:
        inputs["stop_at_eos"] = tf.constant(True)
    out = generate(**inputs)
    return [c.decode("utf-8", errors="replace") for c in out["completion"].numpy()]


def _comparisons(
    prompts: Sequence[str], candidate: list[str] | None, baseline: list[str] | None
) -> list[report.Comparison]:
    return [
        report.Comparison(
            prompt, candidate[i] if candidate else None, baseline[i] if baseline else None
        )
        for i, prompt in enumerate(prompts)
    ]


def _diverged(model_dir: str) -> str:
    """Why training diverged, from the Model's train_metrics.json, or "" if it did not."""
    metrics_path = Path(model_dir) / TRAIN_METRICS
    if not metrics_path.is_file():
        return ""
    metrics = parse_metrics(metrics_path.read_text(), str(metrics_path))
    if metrics.diverged:
        return (
            f"the loss became {metrics.final_loss} at step {metrics.diverged_at_step}; lower "
            "train.learning_rate or set train.grad_clip_norm"
        )
    return ""


def _eval_text_uri(examples_uri: str) -> str:
    """The Examples' eval text file (local or gs://); a UserError when it is missing."""
    uri = storage.join(examples_uri, EVAL_TEXT)
    if not storage.has_content(uri):
        raise UserError(f"Examples folder has no eval text: {uri} is missing")
    return uri


def _load(saved_model_dir: Path, what: str, fix: str, needs: Sequence[str] = SIGNATURES):
    """Load a SavedModel; a missing or damaged one, or one without the signatures it `needs`,
    is a UserError naming `what` and `fix`."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 -- registers the in-graph SentencePiece ops

    if not (saved_model_dir / SAVED_MODEL_FILE).is_file():
        raise UserError(f"{what}: no SavedModel at {saved_model_dir}; {fix}")
    try:
        model = tf.saved_model.load(str(saved_model_dir))
    except (OSError, ValueError, IndexError, tf.errors.OpError) as err:
        raise UserError(
            f"{what}: the SavedModel at {saved_model_dir} is damaged and cannot be loaded "
            f"({_first_line(err)}); {fix}"
        ) from None
    missing = [name for name in needs if name not in model.signatures]
    if missing:
        raise UserError(
            f"{what}: the SavedModel at {saved_model_dir} has no {' or '.join(missing)} "
            f"signature, so it is not a gptpipe model; {fix}"
        )
    return model


def _first_line(err: BaseException) -> str:
    """An error's message on one line, without TensorFlow's `{{function_node ...}}` prefix."""
    text = str(getattr(err, "message", "") or err).strip()
    if text.startswith("{{function_node"):
        text = text.split("}}", 1)[-1].strip()
    return text.splitlines()[0] if text else type(err).__name__


def key_metrics(result: EvalResult) -> dict[str, float]:
    """Flatten the outcome into the named numbers logged to the KFP Metrics artifact."""
    numbers = {
        "eval_nats_per_token": result.candidate.nats_per_token,
        "eval_nats_per_char": result.candidate.nats_per_char,
        "eval_perplexity": result.candidate.perplexity,
        "blessed": float(result.blessed),
    }
    if result.baseline:
        numbers["baseline_nats_per_token"] = result.baseline.nats_per_token
        numbers["baseline_nats_per_char"] = result.baseline.nats_per_char
    for name, seen in (("candidate", result.candidate_seen), ("baseline", result.baseline_seen)):
        if seen:
            numbers[f"eval_text_seen_by_{name}"] = seen.share
    numbers.update(result.run_numbers)
    return numbers
