"""Two real local pipeline runs, made once per test session, for the command tests to read.

- `local_runs` (session): a `LocalRuns`. The whole pipeline runs twice through
  `run_local` (pipelines/runners/local; kfp.local, real subprocess steps, ML Metadata on SQLite)
  into one run root, with the e2e tests' smallest config (tests/tiny.py's `PIPELINE_SMALL`) and
  one trainer worker. Each run reads its own slice of the bundled corpus, so the two have different
  dataset versions. Both are blessed and pushed: the first as version 1 (no baseline), the
  second as version 2 (version 1 its baseline). The blessing threshold is loose
  (`MAX_NATS_PER_CHAR`, `TOLERANCE`) so that a few dozen training steps always pass it: these
  runs are material to read, and the blessing rules have their own tests.

Treat the runs as read-only: copy what you change (the serving folder, the store) into
tmp_path first, since other modules read the same files after you.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from contracts.params import EvalPolicy, TrainJob
from pipelines.runners.local import runner
from tests.tiny import PIPELINE_SMALL as SMALL
from tests.tiny import read_eval_documents
from trainer.config import resolve_config

REPO = Path(__file__).resolve().parents[3]
CORPUS_CHARS = 100_000  # each run's slice of data/tinyshakespeare.txt
MAX_NATS_PER_CHAR = 5.0  # what 30 steps of SMALL reach with room to spare (about 3.6)
TOLERANCE = 1.0  # the second run may be twice as bad as the first and still be pushed
WORKERS = 1  # one trainer process: the cheapest run on the 2 cores tests share


@dataclass(frozen=True)
class LocalRuns:
    """Two finished local runs in one run root, oldest first."""

    root: Path  # the run root: metadata.sqlite, serving/gpt/<N>/, pipeline_root/
    summaries: tuple[dict, dict]  # what run_local returned for each run (lineage's run summary)

    @property
    def metadata(self) -> str:
        """The ML Metadata store both runs recorded into."""
        return str(self.root / "metadata.sqlite")

    @property
    def serving_dir(self) -> Path:
        """The TF Serving folder both runs pushed to: versions 1 and 2."""
        return self.root / "serving" / "gpt"

    def run_id(self, index: int) -> str:
        return str(self.summaries[index]["run_id"])

    def dataset_version(self, index: int) -> str:
        return str(self.summaries[index]["dataset_version"])

    def output(self, index: int, step: str, key: str) -> dict:
        """The properties of a step's output artifact in run `index` (0 or 1)."""
        return dict(self.summaries[index]["steps"][step]["outputs"][key][0]["properties"])

    def eval_nats_per_char(self, index: int) -> float:
        return float(self.output(index, "evaluate", "evaluation")["eval_nats_per_char"])

    def pushed_version(self, index: int) -> int:
        return int(self.output(index, "push", "pushed_model")["pushed_version"])

    def pushed_model(self, index: int) -> Path:
        """The serving version folder run `index` pushed."""
        return self.serving_dir / str(self.pushed_version(index))

    def examples(self, index: int) -> Path:
        """The Examples folder run `index` trained and evaluated on."""
        return Path(self.summaries[index]["steps"]["tokenize"]["outputs"]["examples"][0]["uri"])

    def eval_text(self, index: int, folder: Path) -> Path:
        """The eval split's text that evaluate scored in run `index`, written into `folder` as a
        plain text file (its documents joined: the run's corpus slice is one document)."""
        path = folder / f"eval-text-{index}.txt"
        path.write_text("".join(read_eval_documents(self.examples(index))), encoding="utf-8")
        return path


@pytest.fixture(scope="session")
def local_runs(tmp_path_factory: pytest.TempPathFactory) -> LocalRuns:
    text = (REPO / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")
    corpora = tmp_path_factory.mktemp("local-runs-corpus")
    root = tmp_path_factory.mktemp("local-runs")
    config = resolve_config("tiny", SMALL)
    summaries = []
    for index in range(2):
        corpus = corpora / f"slice-{index}.txt"
        corpus.write_text(text[index * CORPUS_CHARS : (index + 1) * CORPUS_CHARS], "utf-8")
        run = runner.LocalRun(
            root=root,
            corpus=str(corpus),
            config=config,
            train_job=TrainJob(launcher="local", gpus_per_worker=0, workers=WORKERS),
            eval_policy=EvalPolicy(max_nats_per_char=MAX_NATS_PER_CHAR, tolerance=TOLERANCE),
        )
        summaries.append(runner.run_local(run))
    runs = LocalRuns(root, (summaries[0], summaries[1]))
    # Later tests rely on these; a run that was not pushed would fail them obscurely.
    pushed = [runs.output(i, "push", "pushed_model") for i in range(2)]
    assert [p["pushed"] for p in pushed] == [1, 1], json.dumps(pushed, indent=2)
    assert [runs.pushed_version(i) for i in range(2)] == [1, 2]
    return runs
