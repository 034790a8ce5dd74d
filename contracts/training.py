"""The training result the chief writes into the Model artifact (`TRAIN_METRICS`), typed.

The trainer writes it; the train step reads it back into the Model's lineage properties and
evaluate reads whether training diverged. It crosses from the trainer's image to the pipeline's,
which may be of another gptpipe version, so it round-trips JSON strictly (contracts/records.py).
A diverged loss is NaN or infinite: JSON cannot say so, and the file carries it as Python's
json writes it (NaN, Infinity), as it always has.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from contracts import records
from contracts.errors import UserError


@dataclass(frozen=True)
class TrainMetrics:
    """What training reports, and the chief writes to the Model artifact (docs/design.md)."""

    steps: int  # optimizer steps taken, resumed ones included
    # the training loss Keras logged at the last step (the epoch's running mean); NaN or
    # infinite when training diverged
    final_loss: records.AnyFloat
    diverged: bool  # the loss became NaN or infinite and training stopped there
    diverged_at_step: int | None  # the step it did, or None
    tokens_per_second: float  # this worker's clock, after its first step, pauses left out
    global_batch_size: int  # sequences per step across all replicas
    replicas: int  # replicas in sync
    workers: int  # worker processes
    precision_policy: str  # the Keras policy it trained in (train.precision, as the workers agreed)


def metrics_json(metrics: TrainMetrics) -> str:
    """The file's text, as the chief has always written it: indented, keys sorted."""
    return json.dumps(records.to_dict(metrics), indent=2, sort_keys=True)


def parse_metrics(text: str | bytes, where: str) -> TrainMetrics:
    """The TRAIN_METRICS file at `where`: one UserError, naming it and the field, for a field
    missing or of the wrong type."""
    raw = text.decode("utf-8") if isinstance(text, bytes) else text
    try:
        return records.from_json(TrainMetrics, raw, "train_metrics")
    except UserError as err:
        raise UserError(f"{where}: {err}") from None
