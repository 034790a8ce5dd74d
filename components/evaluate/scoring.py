"""Scoring a model on the eval text in bounded memory, streamed through its `score` signature.

The eval text (contracts/eval_text.py) is read a line of the file at a time. Each document's
lines are grouped into strings of whole lines of at most about CHUNK_CHARS (a longer line is a
string alone), and a document's end ends its last string: no string joins two documents, as the
model saw each end with EOS and the next start afresh. Only a batch of strings is held at once,
whatever the eval text's size; the share of it a model trained on (components/overlap.py) is
counted on the same pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from components import overlap, storage
from contracts.artifacts import EVAL_TEXT
from contracts.blessing import Scores
from contracts.errors import UserError
from contracts.eval_text import EvalPiece, read_pieces

CHUNK_CHARS = 2048  # eval text is scored in line-aligned strings of about this many characters
BATCH_CHUNKS = 8  # strings per call of the `score` signature
# Scores a batch of strings: their summed (nats, tokens, chars).
ScoreBatch = Callable[[list[str]], tuple[float, int, int]]


def score_eval_text(score: ScoreBatch, uri: str, seen: overlap.SeenCount | None = None) -> Scores:
    """Score the eval text file at `uri` (local or gs://) with `score` (`signature_scorer` of a
    loaded SavedModel), streaming it; with `seen`, count on the same pass how much of it the
    model trained on."""
    with storage.open_read(uri) as f:
        return score_pieces(score, read_pieces(f, uri), seen, uri)


def score_text(score: ScoreBatch, text: str) -> Scores:
    """Score `text` as one document with `score` (`signature_scorer` of a loaded SavedModel, or
    `outputs_scorer` over a served one), as evaluate scores its eval text."""
    return score_pieces(score, [EvalPiece(text, True)])


def score_pieces(
    score: ScoreBatch,
    pieces: Iterable[EvalPiece],
    seen: overlap.SeenCount | None = None,
    where: str = "the text",
) -> Scores:
    """Score the documents of `pieces` a batch of strings at a time (`score` scores a batch),
    feeding each string to `seen` too. Scores are the corpus rates: Σnats/Σtokens, Σnats/Σchars.
    """
    nats, tokens, chars = 0.0, 0, 0
    for batch in batches(document_strings(pieces, CHUNK_CHARS, where), BATCH_CHUNKS):
        batch_nats, batch_tokens, batch_chars = score([s.text for s in batch])
        nats, tokens, chars = nats + batch_nats, tokens + batch_tokens, chars + batch_chars
        if seen is not None:
            for s in batch:
                seen.add(s.text.encode("utf-8"))
                if s.end:
                    seen.end_document()
    if tokens == 0:
        raise UserError(f"eval split has no text to score: its {EVAL_TEXT} is empty")
    per_token = nats / tokens
    return Scores(per_token, nats / chars, _safe_exp(per_token), tokens, chars)


def signature_scorer(model: Any) -> ScoreBatch:
    """A loaded SavedModel's `score` signature as a ScoreBatch (sums in float64)."""
    import tensorflow as tf

    score = model.signatures["score"]

    def outputs(batch: list[str]) -> Mapping[str, Any]:
        return {name: value.numpy() for name, value in score(text=tf.constant(batch)).items()}

    return outputs_scorer(outputs)


def outputs_scorer(score: Callable[[list[str]], Mapping[str, Any]]) -> ScoreBatch:
    """A ScoreBatch over anything that runs the `score` signature on a batch of strings and
    returns its outputs as arrays of their dtypes: the loaded SavedModel, or a server of it
    (`server.client`). The sums are of the float32 outputs, in float64, in one order, so both
    give the same Scores to the last bit."""
    import numpy as np

    def run(batch: list[str]) -> tuple[float, int, int]:
        out = score(batch)
        return (
            float(np.sum(np.asarray(out["nats"], dtype=np.float32), dtype=np.float64)),
            int(np.sum(np.asarray(out["tokens"]), dtype=np.int64)),
            int(np.sum(np.asarray(out["chars"]), dtype=np.int64)),
        )

    return run


def document_strings(
    pieces: Iterable[EvalPiece], max_chars: int, where: str = "the text"
) -> Iterator[EvalPiece]:
    """Regroup `pieces` into strings of whole lines of at most about `max_chars`, each within
    one document (`end` on a document's last); a file whose last document does not end is cut
    short, a UserError naming `where`."""
    current: list[str] = []
    size = 0
    ended = True
    for piece in pieces:
        for line in piece.text.splitlines(keepends=True):
            if current and size + len(line) > max_chars:
                yield EvalPiece("".join(current), False)
                current, size = [], 0
            current.append(line)
            size += len(line)
        if piece.end and current:
            yield EvalPiece("".join(current), True)
            current, size = [], 0
        ended = piece.end
    if not ended:
        raise UserError(
            f"examples: {where} ends inside a document (no piece with end: true after its "
            "last); tokenize the corpus again"
        )


def chunk_text(text: str, max_chars: int) -> list[str]:
    """Split `text`, one document, into consecutive strings of whole lines, each at most about
    `max_chars`: the strings evaluate scores."""
    return [s.text for s in document_strings([EvalPiece(text, True)], max_chars)]


def batches(items: Iterable[EvalPiece], size: int) -> Iterator[list[EvalPiece]]:
    """`items` in lists of `size` (the last may be shorter), one list held at a time."""
    batch: list[EvalPiece] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _safe_exp(x: float) -> float:
    return math.exp(x) if math.isfinite(x) and x < 700 else float("inf")
