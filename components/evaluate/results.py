"""What an evaluation found: each model's scores, the blessing, and the run's facts for the
report. Plain data, shared by the executor (which computes it) and the report (which draws it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from components import lineage
from components.overlap import MIN_LINE_BYTES
from contracts.blessing import Scores, Seen

# What the reports' "eval text trained on" column means.
SEEN_MEANS = (
    "eval text trained on: the share of the eval text (by bytes of its lines of "
    f"{MIN_LINE_BYTES} bytes or more, each occurrence counted) that was in the model's training "
    "text. A model in service that trained on some of it (the split changed since: "
    "eval_fraction, an edited corpus file) scores better than it should; unknown for a model "
    "exported without a sketch of its training text (one trained on Examples tokenized before "
    "the sketch existed)."
)


@dataclass(frozen=True)
class EvalResult:
    """The evaluation outcome: the candidate's scores, the baseline's, and the blessing."""

    candidate: Scores
    baseline: Scores | None  # None when nothing is in service yet
    baseline_model: str  # the baseline SavedModel folder, or "" when there is none
    blessed: bool  # the candidate may be pushed
    reason: str  # why it was or was not blessed
    # training and run numbers for the Metrics artifact (report.key_numbers): tokens/s, MFU,
    # each step's wall time and GPU-hours
    run_numbers: dict[str, float] = field(default_factory=dict)
    # How much of the eval text each model trained on (components/overlap.py); None where it
    # cannot be told (a model exported before its SavedModel carried the sketch).
    candidate_seen: Seen | None = None
    baseline_seen: Seen | None = None

    def seen_text(self, name: str) -> str:
        """`name`'s (candidate or baseline) share of the eval text it trained on, in words."""
        seen = self.candidate_seen if name == "candidate" else self.baseline_seen
        return f"{seen.share:.1%}" if seen else "unknown"


@dataclass(frozen=True)
class RunFacts:
    """What the HTML report tells about the run besides the models: the step's edge, lineage."""

    dataset_version: str = ""  # the Examples' content-addressed version
    code_version: str = ""  # the evaluate step's git commit
    executions: Sequence[lineage.ExecutionView] = ()  # latest per step so far, in start order
