"""Run the pipeline on this machine with `kfp.local`: subprocesses, SQLite metadata, local disk."""

from dataclasses import dataclass, field
from pathlib import Path

from kfp import local

from components import lineage
from pipelines.config import RunConfig
from pipelines.pipeline import PIPELINE_NAME, Images, build
from trainer.config import resolve_config
from trainer.errors import UserError

# SubprocessRunner runs every step in this Python environment; there is no image to pull.
LOCAL_IMAGES = Images(pipeline="local-python-environment", trainer="local-python-environment")
_DEFAULTS = RunConfig()


@dataclass(frozen=True)
class LocalRun:
    """What to run locally. Paths are resolved against the working directory."""

    root: Path  # run root: pipeline artifacts, metadata.sqlite and serving/ live here
    corpus: str  # text file, folder or glob
    config: str = _DEFAULTS.config  # trainer preset or YAML file
    overrides: tuple[str, ...] = ()  # key=value trainer overrides
    workers: int = _DEFAULTS.workers  # local trainer worker processes
    eval_fraction: float = _DEFAULTS.eval_fraction  # held-out share of the corpus
    max_nats_per_char: float = _DEFAULTS.max_nats_per_char  # blessing threshold
    tolerance: float = _DEFAULTS.tolerance  # allowed relative regression vs the baseline
    model_name: str = _DEFAULTS.model_name  # pushed to <root>/serving/<model_name>/
    extra: dict = field(default_factory=dict)  # further pipeline arguments, by name

    @property
    def metadata(self) -> Path:
        return self.root / "metadata.sqlite"

    @property
    def serving_dir(self) -> Path:
        return self.root / "serving" / self.model_name


def preflight(run: LocalRun) -> None:
    """Check what can be checked before any step starts, so mistakes fail fast and clearly."""
    resolve_config(run.config, run.overrides)
    if not any(ch in run.corpus for ch in "*?[") and not Path(run.corpus).exists():
        raise UserError(f"corpus not found: {run.corpus!r} (give a text file, folder or glob)")
    if run.workers < 1:
        raise UserError(f"--workers must be at least 1, got {run.workers}")


def run_local(run: LocalRun) -> dict:
    """Run the whole pipeline through kfp.local and return the run's summary from lineage."""
    preflight(run)
    root = run.root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(root / "pipeline_root"),
        raise_on_error=True,
    )
    corpus = run.corpus if any(ch in run.corpus for ch in "*?[") else str(Path(run.corpus).resolve())
    pipeline = build(LOCAL_IMAGES)
    try:
        pipeline(
            corpus=corpus,
            serving_dir=str(run.serving_dir.resolve()),
            config=run.config,
            overrides=list(run.overrides),
            eval_fraction=run.eval_fraction,
            max_nats_per_char=run.max_nats_per_char,
            tolerance=run.tolerance,
            launcher="local",
            workers=run.workers,
            gpus_per_worker=0,
            metadata=str(run.metadata.resolve()),
            **run.extra,
        )
    except RuntimeError as err:
        raise PipelineFailed(str(err)) from None
    store = str(run.metadata.resolve())
    return lineage.run_summary(store, lineage.latest_run_id(store, PIPELINE_NAME))


class PipelineFailed(RuntimeError):
    """A step failed; its own log above says why."""

