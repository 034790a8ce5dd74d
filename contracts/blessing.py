"""The ModelBlessing artifact as one typed record: evaluate writes it, push reads it.

TFX's contract, kept on disk as it always was: an empty `BLESSED` or `NOT_BLESSED` file says
the outcome (the marker is the truth), and `blessing.json` the reason and the numbers behind it;
the artifact's `blessed` property is 1 or 0, TFX's custom property. The JSON round-trips strictly
(contracts/records.py); a field an older evaluate did not write takes its default.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from contracts import records
from contracts.artifacts import BLESSED, BLESSING_FILE, NOT_BLESSED
from contracts.errors import UserError


@dataclass(frozen=True)
class Scores:
    """Corpus-level loss of one model on the eval text (NaN for a diverged model)."""

    nats_per_token: records.AnyFloat  # mean next-token loss over the model's own tokens
    nats_per_char: records.AnyFloat  # total loss over total UTF-8 characters (tokenizer-free)
    perplexity: records.AnyFloat  # exp(nats_per_token); infinite past float's range
    tokens: int  # tokens predicted
    chars: int  # characters scored


@dataclass(frozen=True)
class Seen:
    """The share of an eval text a model trained on (components/overlap.py measures it)."""

    share: float  # 0..1, by bytes of the eval text's lines of overlap.MIN_LINE_BYTES or more
    sampled: int  # eval lines the share is measured on (all of them when `exact`)
    exact: bool  # the train sketch held every train line

    def describe(self) -> str:
        """The share in words, saying when it is an estimate."""
        how = "" if self.exact else f", estimated from {self.sampled} of its lines"
        return f"{self.share:.1%} of the eval text{how}"


@dataclass(frozen=True)
class EvalTextSeen:
    """How much of the eval text each model trained on; None where it cannot be told."""

    candidate: Seen | None = None
    baseline: Seen | None = None


@dataclass(frozen=True)
class ModelBlessing:
    """Whether the candidate may be pushed, why, and what it was compared with."""

    blessed: int = 0  # 1: it may be pushed; 0: it may not (the marker file says the same)
    reason: str = ""  # why, in words
    current_model: str = ""  # the candidate Model's folder
    # the SavedModel it was compared with; "" when none was in service; None when the blessing
    # does not say (written before evaluate recorded it): push then takes any served version
    baseline_model: str | None = None
    candidate: Scores | None = None  # the candidate's scores (None: not recorded)
    baseline: Scores | None = None  # the baseline's; None without one
    eval_text_seen: EvalTextSeen = field(default_factory=EvalTextSeen)

    def __post_init__(self) -> None:
        if self.blessed not in (0, 1):
            raise UserError(f"blessing.blessed={self.blessed}: takes 1 or 0")

    def properties(self) -> dict[str, Any]:
        """The artifact's properties in KFP and lineage (TFX's `blessed` among them)."""
        return {
            "blessed": self.blessed,
            "reason": self.reason,
            "current_model": self.current_model,
            "baseline_model": self.baseline_model,
        }


def write_blessing(folder: Path, blessing: ModelBlessing) -> None:
    """Write a ModelBlessing's files into `folder`; the caller publishes the folder atomically."""
    (folder / (BLESSED if blessing.blessed else NOT_BLESSED)).write_text("")
    (folder / BLESSING_FILE).write_text(json.dumps(records.to_dict(blessing), indent=2) + "\n")


def read_blessing(blessing_dir: str | Path) -> ModelBlessing:
    """Read a ModelBlessing folder on local disk; its marker file decides `blessed`.

    A folder with no marker, or a `blessing.json` that is not one, is a UserError naming it.
    """
    folder = Path(blessing_dir)
    if (folder / BLESSED).is_file():
        blessed = 1
    elif (folder / NOT_BLESSED).is_file():
        blessed = 0
    else:
        raise UserError(
            f"not a ModelBlessing folder (no {BLESSED} or {NOT_BLESSED} file): {folder}"
        )
    info_path = folder / BLESSING_FILE
    if not info_path.is_file():
        return ModelBlessing(blessed)
    try:
        found = records.from_json(ModelBlessing, info_path.read_text(), "blessing")
    except UserError as err:
        raise UserError(f"{info_path}: {err}; run evaluate again") from None
    return replace(found, blessed=blessed)
