"""Training throughput on CPU: 2 workers x 1 thread against 1 worker x 2 threads, and XLA.

Every run is the real trainer (`python -m trainer.task`) started by the `local` launcher, on the
`tiny` preset over data/tinyshakespeare.txt tokenized by the tokenize step, with the same global
batch (GLOBAL_BATCH sequences of 64 tokens). tokens/s is the chief's `tokens_per_second` in
train_metrics.json: the steady-state steps, without start-up, tracing, compiling and export.

- `ratio_2w1t_vs_1w2t`: MultiWorkerMirrored (2 processes, RING all-reduce over loopback gRPC,
  1 intra-op and 1 inter-op thread each) against one process with 2+2 threads. Above 1 the
  distributed path is faster on the same cores; below 1 it pays for the all-reduce.
- `xla_speedup_1w`: jit_compile=on against off, one worker with 2 threads.
- `xla_2w`: what jit_compile=on does under MultiWorkerMirrored on CPU: the trainer refuses it
  (exit 2), because XLA cannot compile the cross-worker all-reduce on CPU (docs/training.md).

Numbers on a shared machine vary by tens of percent: compare within one run.
"""

from __future__ import annotations

import io
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "data" / "tinyshakespeare.txt"
GLOBAL_BATCH = 32  # sequences per step in every run
STEPS = 120  # long enough that the timed steps dominate the noise
CORES = 2  # the threads every configuration gets in total


def _examples(folder: Path) -> Path:
    from components.tokenize import executor as tokenize
    from trainer.config import resolve_config

    model = resolve_config("tiny").model
    tokenize.run(
        str(CORPUS), str(folder), vocab_size=model.vocab_size, seq_len=model.seq_len, progress=False
    )
    return folder


def _train(root: Path, name: str, examples: Path, workers: int, jit: str) -> float:
    """tokens/s of one job; raises LaunchError if it fails."""
    from components.train.executor import trainer_command
    from components.train.launcher import JobSpec
    from components.train.local_launcher import LocalLauncher
    from contracts.artifacts import TRAIN_METRICS
    from trainer.config import resolve_config

    threads = str(CORES // workers)
    overrides = [
        f"train.batch_size={GLOBAL_BATCH // workers}",
        f"train.train_steps={STEPS}",
        f"train.checkpoint_every={STEPS}",
        "train.warmup_steps=10",
        f"train.jit_compile={jit}",
    ]
    cfg = resolve_config("tiny", overrides)  # resolved once here; the workers get its JSON
    job = root / name
    command = trainer_command(
        sys.executable, str(examples), str(job / "model"), str(job / "work"), cfg
    )
    command += ["--intra-op-threads", threads, "--inter-op-threads", threads]
    spec = JobSpec(
        name=name,
        command=command,
        workers=workers,
        backoff_limit=0,
        active_deadline_seconds=600,
        env={"TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    LocalLauncher(log_dir=job / "logs", out=io.StringIO()).run(spec)
    metrics = json.loads((job / "model" / TRAIN_METRICS).read_text())
    return float(metrics["tokens_per_second"])


def main() -> dict[str, float | int | str]:
    from components.train.launcher import LaunchError

    with tempfile.TemporaryDirectory(prefix="train-bench-") as tmp:
        root = Path(tmp)
        examples = _examples(root / "examples")
        two_workers = _train(root, "w2-t1", examples, workers=2, jit="off")
        one_worker = _train(root, "w1-t2", examples, workers=1, jit="off")
        one_worker_xla = _train(root, "w1-t2-xla", examples, workers=1, jit="on")
        try:
            two_workers_xla: float | str = _train(root, "w2-t1-xla", examples, workers=2, jit="on")
        except LaunchError as e:
            two_workers_xla = f"failed: {e.reason}, exit {e.exit_code}"
    results: dict[str, float | int | str] = {
        "global_batch": GLOBAL_BATCH,
        "steps": STEPS,
        "tokens_per_s_2w_1t": two_workers,
        "tokens_per_s_1w_2t": one_worker,
        "ratio_2w1t_vs_1w2t": two_workers / one_worker,
        "tokens_per_s_1w_2t_xla": one_worker_xla,
        "xla_speedup_1w": one_worker_xla / one_worker,
    }
    if isinstance(two_workers_xla, float):
        results["tokens_per_s_2w_1t_xla"] = two_workers_xla
        results["xla_speedup_2w"] = two_workers_xla / two_workers
    else:
        results["xla_2w"] = two_workers_xla
    return results


if __name__ == "__main__":
    for key, value in main().items():
        print(f"{key}: {value}")
