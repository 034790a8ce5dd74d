"""The real trainer, run for a benchmark: Examples made by the tokenize step, `python -m
trainer.task` started by the local launcher, tokens/s read back from its train_metrics.json.

Every benchmark that needs the trainer's speed goes through `run_trainer`, so they all measure
the same program the pipeline runs, with its input pipeline, callbacks and host syncs, and not a
re-creation of it. Tokenized Examples and finished runs are cached for the life of the process,
so `python -m bench` tokenizes each (vocabulary, window) once and trains each configuration
once even when several benchmarks report on it.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import io
import itertools
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "data" / "tinyshakespeare.txt"
DEADLINE_S = 1200  # a trainer run that takes longer than this is a failure, not a figure
_JOBS = itertools.count()  # numbers the job folders of this process


@functools.cache
def scratch() -> Path:
    """A folder for this process's Examples and runs, removed when the process exits."""
    folder = Path(tempfile.mkdtemp(prefix="gptpipe-bench-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def examples(
    vocab_size: int, seq_len: int, eval_fraction: float = 0.1, corpus: Path = CORPUS
) -> Path:
    """`corpus` (the bundled one) tokenized by the tokenize step (its BPE at `vocab_size`),
    once."""
    return _examples_cached(vocab_size, seq_len, eval_fraction, corpus.resolve())


@functools.cache
def _examples_cached(vocab_size: int, seq_len: int, eval_fraction: float, corpus: Path) -> Path:
    from components.tokenize import executor as tokenize

    # another corpus's folder: its name and a digest of its path, so two of one name differ
    digest = hashlib.sha256(str(corpus).encode()).hexdigest()[:8]
    tag = "" if corpus == CORPUS.resolve() else f"-{corpus.stem}-{digest}"
    folder = scratch() / f"examples-v{vocab_size}-t{seq_len}-e{eval_fraction}{tag}"
    tokenize.run(
        str(corpus),
        str(folder),
        vocab_size=vocab_size,
        seq_len=seq_len,
        eval_fraction=eval_fraction,
        progress=False,
    )
    return folder


def config(preset: str, overrides: Sequence[str]) -> Any:
    """The trainer's Config, resolved as the CLI resolves it."""
    from trainer.config import resolve_config

    return resolve_config(preset, list(overrides))


def run_trainer(
    preset: str,
    overrides: Sequence[str],
    *,
    workers: int = 1,
    threads: int = 2,
    eval_fraction: float = 0.1,
    attempt: int = 0,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """train_metrics.json of one trainer job, plus `wall_s`; cached by the resolved config (so
    two benchmarks asking for the same configuration share one run) and the other arguments.

    `threads` is the total the job gets: each worker runs with threads // workers intra-op and
    inter-op threads. A different `attempt` trains again. `env` is set in the workers'
    environment over the train step's (components/train/executor.py's WORKER_ENV). Raises
    LaunchError when the job fails.
    """
    from trainer.config import config_to_dict

    cfg = config(preset, overrides)
    key = json.dumps(config_to_dict(cfg), sort_keys=True)
    extra = tuple(sorted((env or {}).items()))
    return dict(_run_cached(key, workers, threads, eval_fraction, attempt, extra))


@functools.cache
def _run_cached(
    config_json: str,
    workers: int,
    threads: int,
    eval_fraction: float,
    attempt: int,
    env: tuple[tuple[str, str], ...],
) -> dict[str, Any]:
    from trainer.config import config_from_dict

    cfg = config_from_dict(json.loads(config_json))
    folder = examples(cfg.model.vocab_size, cfg.model.seq_len, eval_fraction)
    job = new_job_dir()
    started = time.perf_counter()
    launch(cfg, folder, job, workers, threads, dict(env))
    wall = time.perf_counter() - started
    metrics = read_metrics(job / "model")
    return {**metrics, "wall_s": wall, "job": str(job)}


def new_job_dir(prefix: str = "job") -> Path:
    """A fresh folder for one trainer job, named as a JobSpec name must be (lowercase, '-')."""
    job = scratch() / f"{prefix}-{next(_JOBS)}"
    job.mkdir()
    return job


def launch(
    cfg: Any,
    examples_dir: Path,
    job: Path,
    workers: int,
    threads: int,
    env: Mapping[str, str] | None = None,
) -> None:
    """Run the trainer on `examples_dir` into `job/model` and `job/work` (the local launcher),
    its workers in the train step's environment (WORKER_ENV) with `env` over it."""
    from components.jobs.local import LocalLauncher
    from components.jobs.spec import JobSpec
    from components.train.executor import WORKER_ENV, trainer_command

    per_worker = str(max(1, threads // workers))
    command = trainer_command(
        sys.executable, str(examples_dir), str(job / "model"), str(job / "work"), cfg
    )
    command += ["--intra-op-threads", per_worker, "--inter-op-threads", per_worker]
    spec = JobSpec(
        name=job.name,
        command=command,
        workers=workers,
        backoff_limit=0,
        active_deadline_seconds=DEADLINE_S,
        env={**WORKER_ENV, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})},
    )
    LocalLauncher(log_dir=job / "logs", out=io.StringIO()).run(spec)


def read_metrics(model_dir: Path) -> dict[str, Any]:
    """The Model artifact's train_metrics.json (checked as contracts.training reads it), as
    plain values the benchmarks add to."""
    from contracts import records
    from contracts.artifacts import TRAIN_METRICS
    from contracts.training import parse_metrics

    path = model_dir / TRAIN_METRICS
    return records.to_dict(parse_metrics(path.read_text(), str(path)))


def tokens_per_second(preset: str, overrides: Sequence[str], **kwargs: Any) -> float:
    """The trainer's steady-state tokens/s (its train_metrics.json) for one job."""
    return float(run_trainer(preset, overrides, **kwargs)["tokens_per_second"])
