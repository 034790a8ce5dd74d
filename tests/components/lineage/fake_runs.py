"""One pipeline run as the steps record it (tokenize, train, evaluate, push), written straight
into an ML Metadata store, for the lineage tests to read back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from components import lineage
from components.lineage import ArtifactRecord

PIPELINE = "gptpipe"
DATASET = "d" * 64


def fake_run(store: str, root: Path, run_id: str, *, baseline: str = "") -> dict[str, Any]:
    """Record tokenize -> train -> evaluate -> push as the steps would, passing only URIs on."""
    examples_uri = str(root / "examples")
    model_uri = str(root / run_id / "model")
    pushed_uri = str(root / run_id / "pushed_model")
    ids = {}
    ids["tokenize"] = lineage.record_execution(
        store,
        step="tokenize",
        pipeline_name=PIPELINE,
        run_id=run_id,
        parameters={"corpus": "data/tiny.txt", "seq_len": 8, "eval_fraction": 0.1},
        inputs={},
        outputs={
            "examples": [
                ArtifactRecord(
                    "Examples",
                    examples_uri,
                    {
                        "split_names": ["train", "eval"],
                        "span": 0,
                        "version": 0,
                        "dataset_version": DATASET,
                    },
                )
            ]
        },
        properties={"image": "gptpipe:dev", "image_digest": "sha256:" + "a" * 64},
        start_time=1000.0,
        end_time=1002.5,
        dataset_version=DATASET,
    )
    # Train names its input by URI alone, as a downstream step knows it.
    ids["train"] = lineage.record_execution(
        store,
        step="train",
        pipeline_name=PIPELINE,
        run_id=run_id,
        parameters={"learning_rate": 3e-4, "steps": 20, "overrides": ["model.n_layer=1"]},
        inputs={"examples": [ArtifactRecord("Examples", examples_uri)]},
        outputs={"model": [ArtifactRecord("Model", model_uri, {"final_loss": 2.5})]},
        dataset_version=DATASET,
    )
    eval_inputs = {"model": [ArtifactRecord("Model", model_uri)]}
    if baseline:
        eval_inputs["baseline_model"] = [ArtifactRecord("Model", baseline)]
    ids["evaluate"] = lineage.record_execution(
        store,
        step="evaluate",
        pipeline_name=PIPELINE,
        run_id=run_id,
        parameters={"threshold": 0.0},
        inputs=eval_inputs,
        outputs={
            "evaluation": [
                ArtifactRecord("ModelEvaluation", str(root / run_id / "eval"), {"eval_loss": 2.4})
            ],
            "blessing": [
                ArtifactRecord(
                    "ModelBlessing",
                    str(root / run_id / "blessing"),
                    {"blessed": True, "current_model": model_uri, "baseline_model": baseline},
                )
            ],
        },
        dataset_version=DATASET,
    )
    ids["push"] = lineage.record_execution(
        store,
        step="push",
        pipeline_name=PIPELINE,
        run_id=run_id,
        parameters={"destination": str(root / "serving")},
        inputs={
            "model": [ArtifactRecord("Model", model_uri)],
            "model_blessing": [ArtifactRecord("ModelBlessing", str(root / run_id / "blessing"))],
        },
        outputs={
            "pushed_model": [
                ArtifactRecord(
                    "PushedModel",
                    pushed_uri,
                    {
                        "pushed": 1,
                        "pushed_destination": str(root / "serving"),
                        "pushed_version": "1",
                    },
                )
            ]
        },
    )
    return {"ids": ids, "model": model_uri, "pushed": pushed_uri, "examples": examples_uri}
