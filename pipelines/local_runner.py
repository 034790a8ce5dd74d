"""Run the pipeline on this machine with `kfp.local`: subprocesses, SQLite metadata, local disk."""

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kfp import local

from components import lineage, provenance, storage
from components.provenance import LOCAL_IMAGE
from contracts.errors import UserError
from pipelines.config import RunConfig
from pipelines.pipeline import Images, Target, build
from trainer.config import Config

# SubprocessRunner runs every step in this Python environment; there is no image to pull, and
# lineage records each execution as `unpinned`.
LOCAL_IMAGES = Images(pipeline=LOCAL_IMAGE, trainer=LOCAL_IMAGE)
LOCAL_TARGET = Target(LOCAL_IMAGES, release_on_exit=False)
_DEFAULTS = RunConfig()


@dataclass(frozen=True)
class LocalRun:
    """What to run locally. Paths are resolved against the working directory."""

    root: str | Path  # run root: serving/ lives here; a local root also holds the state below
    corpus: str  # text file, folder or glob
    config: Config = field(default_factory=Config)  # the resolved trainer config (the CLI's)
    workers: int = _DEFAULTS.workers  # local trainer worker processes
    eval_fraction: float = _DEFAULTS.eval_fraction  # held-out share of the corpus
    tokenizer: str = ""  # a SentencePiece model to reuse; "" trains one on the corpus
    max_nats_per_char: float = _DEFAULTS.max_nats_per_char  # blessing threshold
    tolerance: float = _DEFAULTS.tolerance  # allowed relative regression vs the baseline
    model_name: str = _DEFAULTS.model_name  # pushed to <root>/serving/<model_name>/
    state_dir: Path | None = None  # kfp.local artifacts + metadata.sqlite; default: local root
    extra: dict = field(default_factory=dict)  # further pipeline arguments, by name

    @property
    def state(self) -> Path:
        """Where kfp.local keeps step artifacts and ML Metadata: always on local disk."""
        if self.state_dir is not None:
            return Path(self.state_dir).resolve()
        if storage.is_gcs(self.root):
            raise UserError(
                f"--root {self.root} is on GCS: also give --state-dir, a local folder "
                "for the step artifacts and metadata.sqlite that kfp.local keeps"
            )
        return Path(self.root).resolve()

    @property
    def metadata(self) -> str:
        return str(self.state / "metadata.sqlite")

    @property
    def serving_dir(self) -> str:
        root = str(self.root) if storage.is_gcs(self.root) else str(Path(self.root).resolve())
        return storage.join(root, "serving", self.model_name)


def preflight(run: LocalRun) -> None:
    """Check what can be checked before any step starts, so mistakes fail fast and clearly."""
    if not storage.list_files(run.corpus):
        raise UserError(f"corpus {run.corpus!r} has no files (give a text file, folder or glob)")
    if run.workers < 1:
        raise UserError(f"--workers must be at least 1, got {run.workers}")


def run_local(run: LocalRun) -> dict:
    """Run the whole pipeline through kfp.local and return the run's summary from lineage."""
    preflight(run)
    run.state.mkdir(parents=True, exist_ok=True)
    pipeline_root = str(run.state / "pipeline_root")
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=pipeline_root,
        raise_on_error=True,
    )
    corpus = run.corpus if any(ch in run.corpus for ch in "*?[") else _absolute(run.corpus)
    pipeline = build(LOCAL_TARGET, run.config)
    run_id = f"local-{uuid.uuid4().hex[:12]}"
    try:
        with _run_id_in_environment(run_id):
            pipeline(
                corpus=corpus,
                serving_dir=run.serving_dir,
                artifact_root=pipeline_root,
                eval_fraction=run.eval_fraction,
                tokenizer=_absolute(run.tokenizer) if run.tokenizer else "",
                max_nats_per_char=run.max_nats_per_char,
                tolerance=run.tolerance,
                launcher="local",
                workers=run.workers,
                gpus_per_worker=0,
                metadata=run.metadata,
                **run.extra,
            )
    except RuntimeError as err:
        failure = lineage.failure_of(run.metadata, run_id)
        message = f"step {failure[0]!r} failed: {failure[1]}" if failure else str(err)
        raise PipelineFailed(message) from None
    return lineage.run_summary(run.metadata, run_id)


def _absolute(uri: str) -> str:
    """A local path made absolute (steps run in other folders); a gs:// URI as it is."""
    return uri if storage.is_gcs(uri) else str(Path(uri).resolve())


@contextlib.contextmanager
def _run_id_in_environment(run_id: str) -> Iterator[None]:
    """Give every step the run id as KFP gives it in a cluster: an environment variable.

    kfp.local starts each step as a subprocess of this one, so the steps inherit it.
    """
    previous = os.environ.get(provenance.RUN_ID_ENV)
    os.environ[provenance.RUN_ID_ENV] = run_id
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(provenance.RUN_ID_ENV, None)
        else:
            os.environ[provenance.RUN_ID_ENV] = previous


class PipelineFailed(RuntimeError):
    """A step failed; its own log above says why."""
