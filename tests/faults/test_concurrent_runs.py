"""Two whole local runs started at the same moment on one run root, the same data and the same
serving folder: both finish, the data is tokenized once, and every served version is whole.

The runs are two real processes released together (`processes.run_together`); they share the
run root's metadata.sqlite, its content-addressed datasets and its serving destination.
"""

import json
import os

import pytest

from components import serving, storage
from tests.processes import REPO, run_together
from tests.tiny import PIPELINE_SMALL

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SMALL = (*PIPELINE_SMALL, "train.train_steps=20", "train.checkpoint_every=10")

RUN = """
import json
from pipelines.runners.local import runner as local_runner
from contracts.params import EvalPolicy, TrainJob
from trainer.config import resolve_config
config = resolve_config("tiny", {small!r})
run = local_runner.LocalRun(
    root={root!r}, corpus={corpus!r}, config=config, eval_policy=EvalPolicy(5.0),
    train_job=TrainJob(launcher="local", gpus_per_worker=0, workers=1),
)
WAIT()
summary = local_runner.run_local(run)
print(json.dumps(summary, default=str))
"""


def outputs(summary, step, key):
    return summary["steps"][step]["outputs"][key][0]["properties"]


@pytest.mark.heavy
@pytest.mark.fault("two whole local runs start at the same moment on one run root")
def test_two_runs_at_once_both_finish_tokenize_once_and_serve_whole_versions(tmp_path, ledger):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text((REPO / "data" / "tinyshakespeare.txt").read_text()[:60_000])
    root = tmp_path / "runs"
    script = RUN.format(small=SMALL, root=str(root), corpus=str(corpus))
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore::FutureWarning"}

    results = run_together([script, script], env, timeout=900)

    # A string, so pytest shows it whole (a list is cut to a short repr): the failing step's
    # own error sits above the runner's traceback.
    tails = "\n\n".join(f"run {i}:\n{r.stderr[-8000:]}" for i, r in enumerate(results))
    assert [r.returncode for r in results] == [0, 0], tails
    summaries = [json.loads(r.stdout.strip().splitlines()[-1]) for r in results]
    assert len({s["run_id"] for s in summaries}) == 2
    assert {s["dataset_version"] for s in summaries} == {summaries[0]["dataset_version"]}
    reused = sorted(s["steps"]["tokenize"]["properties"]["reused"] for s in summaries)
    assert reused == [0, 1]  # one run tokenized, the other waited for it and reused it
    datasets = [p for p in (root / "pipeline_root" / "datasets").iterdir()]
    assert [p.name for p in datasets if not p.name.startswith(".")] == [
        summaries[0]["dataset_version"]
    ]

    dest = str(root / "serving" / "gpt")
    pushes = [outputs(s, "push", "pushed_model") for s in summaries]
    for push in pushes:
        assert push["pushed"] == 1 or "served model changed since evaluation" in push["reason"]
    versions = serving.serving_versions(dest)
    ledger("served versions", sum(p["pushed"] for p in pushes), len(versions))
    for version in versions:  # each version is one whole model: loadable, with its variables
        files = storage.list_tree(storage.join(dest, str(version)))
        assert "saved_model.pb" in files and "variables/variables.index" in files
    assert not [n for n in os.listdir(dest) if n.startswith(".") and n != serving.CLAIMS_DIR]
