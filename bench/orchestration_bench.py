"""Orchestration overhead of a local pipeline run: wall time not spent inside a step, over wall.

One local run (`run_local`, what `gptpipe run --local` and `make run` run) on the
bundled corpus with the `tiny` preset cut to STEPS steps and the default 2 workers, into a fresh
root. Wall time is that call's. A step's own time is its ML Metadata execution's
`start_time_ms` to `end_time_ms`: the span of the step's `lineage.step` block, which encloses
all its work (the train step's includes its worker processes). What is left is kfp.local's
own work and each step's process start and imports before its block begins (a fresh Python
that imports kfp, and TensorFlow where the step needs it). Overlapping steps are counted once.

How long `make run` takes in total is not measured here: only this ratio.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from bench import trainer_run
from bench.results import Figure, Target

TIER = "quick"
TARGET = Target("<=", 0.10)
STEPS = 30


def step_spans(summary: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Each step's (start, end) in seconds since the epoch, from a run summary's executions."""
    spans = {}
    for step, view in summary["steps"].items():
        props = view.get("properties", {})
        if "start_time_ms" in props and "end_time_ms" in props:
            spans[step] = (int(props["start_time_ms"]) / 1000, int(props["end_time_ms"]) / 1000)
    return spans


def covered_seconds(spans: list[tuple[float, float]]) -> float:
    """Total length of the union of [start, end] intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def overhead(wall_s: float, spans: list[tuple[float, float]]) -> float:
    """The share of `wall_s` outside every step's span."""
    return max(0.0, wall_s - covered_seconds(spans)) / wall_s


def figures(full: bool) -> list[Figure]:
    from pipelines.runners.local import runner
    from trainer.config import config_to_dict

    overrides = (
        f"train.train_steps={STEPS}",
        f"train.checkpoint_every={STEPS}",
        "train.warmup_steps=5",
        "train.eval_batches=2",
    )
    cfg = trainer_run.config("tiny", overrides)
    with tempfile.TemporaryDirectory(prefix="orchestration-bench-") as tmp:
        root = Path(tmp)
        run = runner.LocalRun(root=root, corpus=str(trainer_run.CORPUS), config=cfg)
        with runner.captured_output(root / "kfp-local.log"):
            started = time.time()
            summary = runner.run_local(run)
            ended = time.time()
    spans = step_spans(summary)
    wall = ended - started
    return [
        Figure(
            name="orchestration overhead of a local run (wall outside steps / wall), tiny",
            value=overhead(wall, list(spans.values())),
            unit="%",
            target=TARGET,
            inputs={
                "config": config_to_dict(cfg),
                "workers": run.train_job.workers,
                "tokens_trained": STEPS
                * cfg.train.batch_size
                * run.train_job.workers
                * cfg.model.seq_len,
                "corpus": str(trainer_run.CORPUS.relative_to(trainer_run.REPO)),
            },
            details={
                "wall_s": wall,
                "steps_s": {k: round(e - s, 2) for k, (s, e) in spans.items()},
                "gaps_s": _gaps(started, ended, spans),
            },
        )
    ]


def _gaps(started: float, ended: float, spans: dict[str, tuple[float, float]]) -> dict:
    """Seconds before each step's span began (since the previous one ended), and after."""
    gaps, last = {}, started
    for step, (start, end) in sorted(spans.items(), key=lambda kv: kv[1]):
        gaps[f"before {step}"] = round(start - last, 2)
        last = max(last, end)
    gaps["after the last"] = round(ended - last, 2)
    return gaps


if __name__ == "__main__":
    from bench.results import markdown_table

    print(markdown_table(figures(full=False)))
