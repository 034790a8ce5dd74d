"""Evaluate: score the candidate and the model in service on the same eval text, and bless.

Both models score the eval split's raw text through their own in-graph tokenizer (the
SavedModel's `score` signature), so the comparison holds across tokenizers. nats/char is the
tokenizer-independent number the blessing uses; nats/token and perplexity are reported too.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from components import serving, storage
from contracts.artifacts import (
    EVAL_TEXT,
    SAVED_MODEL_FILE,
    SERVING_DIR,
    TRAIN_METRICS,
    write_blessing,
)
from contracts.errors import UserError

log = logging.getLogger(__name__)

CHUNK_CHARS = 2048  # eval text is scored in line-aligned chunks of about this many characters
BATCH_CHUNKS = 8  # chunks per call of the `score` signature
SAMPLE_PROMPTS = ("ROMEO:", "First Citizen:\n", "The king")  # prompts for the report's samples
# What to do when a SavedModel is missing or damaged: the candidate's, or the one in service.
_RETRAIN = "run the pipeline again to train it anew"
_RESERVE = "run evaluate again; if it stays so, serve a healthy version (gptpipe rollback)"


@dataclass(frozen=True)
class Scores:
    """Corpus-level loss of one model on the eval text."""

    nats_per_token: float  # mean next-token loss over the model's own tokens
    nats_per_char: float  # total loss over total UTF-8 characters (tokenizer-independent)
    perplexity: float  # exp(nats_per_token)
    tokens: int  # tokens predicted
    chars: int  # characters scored


@dataclass(frozen=True)
class EvalResult:
    """The evaluation outcome: the candidate's scores, the baseline's, and the blessing."""

    candidate: Scores
    baseline: Scores | None  # None when nothing is in service yet
    baseline_model: str  # the baseline SavedModel folder, or "" when there is none
    blessed: bool  # the candidate may be pushed
    reason: str  # why it was or was not blessed


def run(
    model_dir: str,
    examples_uri: str,
    serving_dir: str,
    blessing_dir: str,
    report_path: str,
    *,
    max_nats_per_char: float,
    tolerance: float,
    num_samples: int = 3,
    sample_tokens: int = 48,
) -> EvalResult:
    """Score candidate and baseline on the eval split, decide the blessing, write the outputs.

    `examples_uri` is the content-addressed Examples folder (local or gs://); only its eval text
    is read, so nothing else of the dataset is downloaded.

    The candidate is blessed when its nats/char is at most `max_nats_per_char` and, if a model
    is in service at `serving_dir`, at most the baseline's times `1 + tolerance`. A model whose
    training diverged (a NaN or infinite loss) never is.

    The blessing is written last, whole or not at all: a failure before it (a damaged
    SavedModel, a baseline removed meanwhile) raises a UserError naming the model and leaves no
    ModelBlessing, which push refuses.
    """
    eval_text = _read_eval_text(examples_uri)
    candidate_model = _load(Path(model_dir) / SERVING_DIR, "the candidate model", _RETRAIN)
    candidate = score_text(candidate_model, eval_text)
    baseline_uri = serving.latest_version_uri(serving_dir)
    baseline = _score_baseline(baseline_uri, eval_text) if baseline_uri else None
    diverged = _diverged(model_dir)
    blessed, reason = decide(candidate, baseline, max_nats_per_char, tolerance, diverged)
    result = EvalResult(candidate, baseline, baseline_uri or "", blessed, reason)
    # A diverged model's logits are NaN: sampling from them is meaningless, so show none.
    healthy = not diverged and math.isfinite(candidate.nats_per_char)
    samples = generate_samples(candidate_model, num_samples, sample_tokens) if healthy else []
    storage.write_text_atomic(report_path, render_report(result, samples))
    _write_blessing(blessing_dir, result, model_dir)  # last: push acts on it
    log.info("eval: %s", reason)
    return result


def decide(
    candidate: Scores,
    baseline: Scores | None,
    max_nats_per_char: float,
    tolerance: float,
    diverged: str = "",
) -> tuple[bool, str]:
    """Return (blessed, reason) from the scores: absolute threshold, then change vs baseline."""
    ours = candidate.nats_per_char
    if diverged:
        return False, f"training diverged: {diverged}"
    if not math.isfinite(ours):
        return False, f"eval loss is not finite ({ours})"
    if ours > max_nats_per_char:
        return False, f"eval {ours:.4f} nats/char is above the threshold {max_nats_per_char:.4f}"
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


def score_text(model, text: str) -> Scores:
    """Score `text` with a loaded SavedModel's `score` signature, in line-aligned chunks."""
    import tensorflow as tf

    score = model.signatures["score"]
    nats, tokens, chars = 0.0, 0, 0
    for batch in _batches(chunk_text(text, CHUNK_CHARS), BATCH_CHUNKS):
        out = score(text=tf.constant(batch))
        nats += float(tf.reduce_sum(tf.cast(out["nats"], tf.float64)))
        tokens += int(tf.reduce_sum(out["tokens"]))
        chars += int(tf.reduce_sum(out["chars"]))
    if tokens == 0:
        raise UserError("eval split has no text to score: its raw/eval.txt is empty")
    per_token = nats / tokens
    return Scores(per_token, nats / chars, _safe_exp(per_token), tokens, chars)


def chunk_text(text: str, max_chars: int) -> list[str]:
    """Split text into consecutive chunks of whole lines, each at most about `max_chars`."""
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for line in text.splitlines(keepends=True):
        if current and size + len(line) > max_chars:
            chunks.append("".join(current))
            current, size = [], 0
        current.append(line)
        size += len(line)
    if current:
        chunks.append("".join(current))
    return chunks


def generate_samples(model, num_samples: int, max_new_tokens: int) -> list[tuple[str, str]]:
    """Return (prompt, completion) pairs from the model's `generate` signature."""
    import tensorflow as tf

    prompts = [SAMPLE_PROMPTS[i % len(SAMPLE_PROMPTS)] for i in range(num_samples)]
    if not prompts:
        return []
    out = model.signatures["generate"](
        prompt=tf.constant(prompts),
        max_new_tokens=tf.constant(max_new_tokens, tf.int32),
        temperature=tf.constant(0.8, tf.float32),
    )
    completions = [c.decode("utf-8", errors="replace") for c in out["completion"].numpy()]
    return list(zip(prompts, completions, strict=True))


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
        "| model | nats/token | nats/char | perplexity | tokens | chars |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in rows:
        lines.append(
            f"| {name} | {s.nats_per_token:.4f} | {s.nats_per_char:.4f} | "
            f"{s.perplexity:.2f} | {s.tokens} | {s.chars} |"
        )
    lines.append("")
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


def _write_blessing(blessing_dir: str, result: EvalResult, model_dir: str) -> None:
    info = {
        "blessed": int(result.blessed),
        "reason": result.reason,
        "current_model": model_dir,
        "baseline_model": result.baseline_model,
        "candidate": asdict(result.candidate),
        "baseline": asdict(result.baseline) if result.baseline else None,
    }
    with storage.atomic_dir(blessing_dir) as tmp:
        write_blessing(tmp, result.blessed, info)


def _score_baseline(uri: str, eval_text: str) -> Scores:
    """Score the SavedModel at `uri`; a gs:// one is downloaded to a temporary folder first.

    TensorFlow's built-in GCS file system ignores STORAGE_EMULATOR_HOST (it always calls
    www.googleapis.com), and the tensorflow-io-gcs-filesystem plugin, which honours
    CLOUD_STORAGE_EMULATOR_ENDPOINT, crashes TensorFlow 2.19; a local copy through the
    storage layer works against GCS and the emulator alike and checks crc32c.
    """
    with storage.local_copy(uri) as local:
        return score_text(_load(local, f"the model in service at {uri}", _RESERVE), eval_text)


def _diverged(model_dir: str) -> str:
    """Why training diverged, from the Model's train_metrics.json, or "" if it did not."""
    metrics_path = Path(model_dir) / TRAIN_METRICS
    if not metrics_path.is_file():
        return ""
    metrics = json.loads(metrics_path.read_text())  # Python's json reads NaN and Infinity
    if metrics.get("diverged"):
        return (
            f"the loss became {metrics.get('final_loss')} at step "
            f"{metrics.get('diverged_at_step')}; lower train.learning_rate or set "
            "train.grad_clip_norm"
        )
    return ""


def _read_eval_text(examples_uri: str) -> str:
    uri = storage.join(examples_uri, EVAL_TEXT)
    if not storage.has_content(uri):
        raise UserError(f"Examples folder has no eval text: {uri} is missing")
    return storage.read_bytes(uri).decode("utf-8")


def _load(saved_model_dir: Path, what: str, fix: str):
    """Load a SavedModel; a missing or damaged one is a UserError naming `what` and `fix`."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 -- registers the in-graph SentencePiece ops

    if not (saved_model_dir / SAVED_MODEL_FILE).is_file():
        raise UserError(f"{what}: no SavedModel at {saved_model_dir}; {fix}")
    try:
        return tf.saved_model.load(str(saved_model_dir))
    except (OSError, ValueError, IndexError, tf.errors.OpError) as err:
        raise UserError(
            f"{what}: the SavedModel at {saved_model_dir} is damaged and cannot be loaded "
            f"({_first_line(err)}); {fix}"
        ) from None


def _first_line(err: BaseException) -> str:
    """An error's message on one line, without TensorFlow's `{{function_node ...}}` prefix."""
    text = str(getattr(err, "message", "") or err).strip()
    if text.startswith("{{function_node"):
        text = text.split("}}", 1)[-1].strip()
    return text.splitlines()[0] if text else type(err).__name__


def _batches(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _safe_exp(x: float) -> float:
    return math.exp(x) if math.isfinite(x) and x < 700 else float("inf")


def metrics(result: EvalResult) -> dict[str, float]:
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
    return numbers
