"""The whole local pipeline with the corpus and the push destination on a GCS API server.

kfp.local keeps step artifacts and metadata.sqlite on local disk (`state_dir`); the corpus is
read from, and the model is published to, gcp-storage-emulator over HTTP.
"""

from pathlib import Path

import pytest

from components import serving
from contracts.params import EvalPolicy, TrainJob
from pipelines.runners.local import runner
from tests.tiny import PIPELINE_SMALL as SMALL
from trainer.config import resolve_config

pytestmark = [pytest.mark.e2e, pytest.mark.heavy]
REPO = Path(__file__).resolve().parents[2]


def test_run_reads_corpus_from_gcs_and_pushes_to_gcs(gcs, tmp_path):
    text = (REPO / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")[:120_000]
    gcs.bucket.blob("corpus/shakespeare.txt").upload_from_string(text.encode("utf-8"))
    root = gcs.uri("runs")
    run = runner.LocalRun(
        root=root,
        corpus=gcs.uri("corpus/"),
        state_dir=tmp_path,
        config=resolve_config("tiny", SMALL),
        train_job=TrainJob(launcher="local", gpus_per_worker=0, workers=1),
        eval_policy=EvalPolicy(max_nats_per_char=5.0),
    )
    summary = runner.run_local(run)

    pushed = summary["steps"]["push"]["outputs"]["pushed_model"][0]["properties"]
    assert pushed["pushed"] == 1 and pushed["pushed_destination"] == f"{root}/serving/gpt"
    objects = gcs.names("runs/serving/gpt/1/")
    assert "runs/serving/gpt/1/saved_model.pb" in objects
    assert any(name.startswith("runs/serving/gpt/1/variables/") for name in objects)
    assert not gcs.names("runs/serving/gpt/.staging")
    assert serving.serving_versions(f"{root}/serving/gpt") == [1]
    sources = summary["steps"]["tokenize"]["outputs"]["examples"][0]["properties"]
    assert sources["dataset_version"] == summary["dataset_version"]
