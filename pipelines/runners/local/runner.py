"""Run the pipeline on this machine with `kfp.local`: subprocesses, SQLite metadata, local disk.

What a run prints (kfp.local's own lines, every step's streamed output) can be sent to a file
under the state folder while it runs (`captured_output`, `RunLogs`), so that the terminal shows
only the run view (pipelines/runners/local/view.py).
"""

import contextlib
import dataclasses
import io
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from kfp import local

from components import lineage, provenance, runner_watch, storage
from components.provenance import LOCAL_IMAGE
from contracts.artifacts import WORKER_LOGS_DIR, step_work_dir
from contracts.errors import UserError
from contracts.params import EvalPolicy, TokenizeParams, TrainJob
from contracts.process import descendants, ignored, running, signal_handlers
from contracts.progress import PROGRESS_ENV
from pipelines.config import RunConfig
from pipelines.pipeline import PIPELINE_NAME, Images, Target, build
from pipelines.runners.local.machine import Machine
from trainer.config import Config

# SubprocessRunner runs every step in this Python environment; there is no image to pull, and
# lineage records each execution as `unpinned`.
LOCAL_IMAGES = Images(pipeline=LOCAL_IMAGE, trainer=LOCAL_IMAGE)
LOCAL_TARGET = Target(LOCAL_IMAGES, release_on_exit=False)
LOCAL_JOB = TrainJob(launcher="local", gpus_per_worker=0)  # a local run's default train job
LOCAL_TOKENIZE = TokenizeParams(launcher="local")  # a local run's tokenize: parts as processes
_DEFAULTS = RunConfig()


@dataclass(frozen=True)
class LocalRun:
    """What to run locally. Paths are resolved against the working directory."""

    root: str | Path  # run root: serving/ lives here; a local root also holds the state below
    corpus: str  # text file, folder or glob
    config: Config = field(default_factory=Config)  # the resolved trainer config (the CLI's)
    tokenize: TokenizeParams = LOCAL_TOKENIZE  # the tokenize step's parameters
    train_job: TrainJob = LOCAL_JOB  # the train step's: worker processes on this machine
    eval_policy: EvalPolicy = EvalPolicy()  # when evaluate blesses
    model_name: str = _DEFAULTS.model_name  # pushed to <root>/serving/<model_name>/
    state_dir: Path | None = None  # kfp.local artifacts + metadata.sqlite; default: local root
    # this machine's CPUs and memory, read at the edge (machine.this_machine); None: unchecked
    machine: Machine | None = None

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

    @property
    def pipeline_root(self) -> Path:
        """kfp.local's pipeline root: each run's step artifacts, datasets/ and work/."""
        return self.state / "pipeline_root"


LOGS_DIR = "logs"  # under the state folder: one folder of logs per local run


@dataclass(frozen=True)
class RunLogs:
    """Where one local run's output goes: `<state>/logs/<run id>/`, and its workers' logs."""

    folder: Path  # <state>/logs/<run id>/
    workers: Path  # the local launcher's worker logs: <pipeline root>/work/<run id>/train/...

    @property
    def kfp_local(self) -> Path:
        """Everything kfp.local printed: its own lines and every step's streamed output."""
        return self.folder / "kfp-local.log"

    @property
    def events(self) -> Path:
        """The steps' progress events (contracts.progress)."""
        return self.folder / "progress.jsonl"

    def step(self, name: str) -> Path:
        """One step's part of `kfp_local`."""
        return self.folder / f"{name}.log"


def new_run_id() -> str:
    """A fresh id for a local run (KFP's pods get theirs from the run's label)."""
    return f"local-{uuid.uuid4().hex[:12]}"


def run_logs(run: LocalRun, run_id: str) -> RunLogs:
    """The log locations of run `run_id` of `run` (nothing is created)."""
    work = run.pipeline_root / step_work_dir(run_id, "train") / WORKER_LOGS_DIR
    return RunLogs(run.state / LOGS_DIR / run_id, work)


def preflight(run: LocalRun) -> None:
    """Check what can be checked before any step starts, so mistakes fail fast and clearly."""
    if not storage.list_files(run.corpus):
        raise UserError(f"corpus {run.corpus!r} has no files (give a text file, folder or glob)")
    if run.train_job.launcher != "local":
        raise UserError(
            f"train_job.launcher={run.train_job.launcher!r}: a local run's train step runs its "
            "workers on this machine; use local"
        )
    if run.tokenize.launcher != "local":
        raise UserError(
            f"tokenize.launcher={run.tokenize.launcher!r}: a local run's tokenize step runs its "
            "parts on this machine; use local"
        )
    check_fits(run)


def check_fits(run: LocalRun) -> None:
    """Refuse a training the train step, or this machine, could not run: a global batch that
    does not split, a tensor past TensorFlow's int32 bound (the step's own `check_plan`), more
    workers than the machine's CPUs run, a micro-batch past its memory."""
    from components.train.executor import check_plan
    from trainer.capacity import check_fits_host

    job, machine = run.train_job, run.machine
    if machine is not None:
        job.check_local(machine.cpus)
    check_plan(run.config, job)
    # Workers with GPUs hold their activations there: this machine's memory is not theirs.
    if machine is not None and machine.memory_bytes and not job.gpus_per_worker:
        check_fits_host(run.config, job.workers, machine.memory_bytes)


def run_local(run: LocalRun, *, run_id: str = "", progress_file: Path | None = None) -> dict:
    """Run the whole pipeline through kfp.local and return the run's summary from lineage.

    `run_id` names the run (default: a new one); `progress_file` is where the steps append
    their progress events (contracts.progress; default: they report none).
    """
    preflight(run)
    run.state.mkdir(parents=True, exist_ok=True)
    pipeline_root = str(run.pipeline_root)
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=pipeline_root,
        raise_on_error=True,
    )
    corpus = _absolute(run.corpus)
    pipeline = build(LOCAL_TARGET, run.config)
    run_id = run_id or new_run_id()
    # The run's own process too: each step ends with the run, even a SIGKILLed one.
    environment = {provenance.RUN_ID_ENV: run_id, **runner_watch.announce()}
    if progress_file is not None:
        environment[PROGRESS_ENV] = str(progress_file)
    try:
        with _in_environment(environment), _stopped_as_by_ctrl_c():
            pipeline(
                corpus=corpus,
                serving_dir=run.serving_dir,
                artifact_root=pipeline_root,
                tokenize=_absolute_tokenizer(run.tokenize).to_dict(),
                train_job=run.train_job.to_dict(),
                eval_policy=run.eval_policy.to_dict(),
                metadata=run.metadata,
            )
    except RuntimeError as err:
        _close_unfinished(run, run_id, KILLED)
        failure = lineage.failure_of(run.metadata, run_id)
        if failure:
            raise PipelineFailed(f"step {failure[0]!r} failed: {failure[1]}", *failure) from None
        step = _record_unrecorded_failure(run, run_id, str(err))
        raise PipelineFailed(str(err), step) from None
    except BaseException:  # Ctrl-C, SIGTERM, SIGHUP: the steps are stopped with the run
        # a second signal must not cut the record short
        with signal_handlers(dict.fromkeys(_ENDING_SIGNALS, signal.SIG_IGN)):
            _wait_for_steps(STEP_STOP_S)  # so that what each step records itself comes first
            _close_unfinished(run, run_id, INTERRUPTED)
        raise
    return lineage.run_summary(run.metadata, run_id)


# A local run has no exit handler to close what a killed step left RUNNING (on a cluster the
# pipeline's exit handler does: components/train/release.py); run_local closes it as the run
# ends, so lineage and `gptpipe runs` never show a dead step running.
KILLED = (
    "the step's process ended without recording its end: killed (out of memory, SIGKILL) or "
    "crashed; its log says how far it got"
)
INTERRUPTED = "the run was interrupted (Ctrl-C, SIGTERM or SIGHUP) while the step ran"
DIED_UNRECORDED = (
    "the step ended before it recorded anything (killed as it started, or an error before "
    "its first record); its log says why"
)
# A step a Ctrl-C did not reach (`kill -INT` to this process alone, an IDE's stop button) is
# sent SIGTERM once this long has passed: later than the train step's grace for its workers
# (components/jobs/local.py's kill_grace_seconds, 10 s), which a SIGTERM during it
# would cut short, so a Ctrl-C that did reach the step lets the workers back up first.
CTRL_C_REACH_S = 12.0
# How long an interrupted run waits for its step to stop: a step told late stops its workers
# with that grace again.
STEP_STOP_S = CTRL_C_REACH_S + 13.0


_stopping: list[int] = []  # the step processes an interrupted run waits for (main thread)


def _steps() -> list[int]:
    """The running step's processes: kfp.local's `sh` and the step's Python below it, in this
    process's group (the train step's workers each have a group of their own, which the step
    stops; tokenize's encoding processes share the step's)."""
    return descendants(os.getpid(), group=os.getpgrp())


@contextlib.contextmanager
def _stopped_as_by_ctrl_c() -> Iterator[None]:
    """End the run on SIGTERM or SIGHUP (`kill`, a cancelled CI job, a closed terminal) as on
    Ctrl-C: the step's processes get SIGTERM, which the train step's launcher passes on to its
    workers (components/jobs/cancel.py; kfp.local's `sh` wrapper would not), and
    KeyboardInterrupt is raised here. Ctrl-C at a terminal reaches the steps by itself (the
    whole foreground process group gets it); either way the step's processes are noted, for
    the run to wait for them (`_wait_for_steps`). Only the main thread takes signals;
    elsewhere this does nothing."""
    _stopping.clear()

    def stop(signum: int, frame: object) -> None:
        _stopping[:] = _steps()
        _terminate(_stopping)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    def ctrl_c(signum: int, frame: object) -> None:
        _stopping[:] = _steps()
        raise KeyboardInterrupt

    # A signal this process ignores stays ignored: `nohup` (SIGHUP) or a shell's background
    # job (SIGINT) keeps its meaning.
    wanted = {signal.SIGTERM: stop, signal.SIGHUP: stop, signal.SIGINT: ctrl_c}
    with signal_handlers({sig: h for sig, h in wanted.items() if not ignored(sig)}):
        yield


_ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _terminate(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)


def _wait_for_steps(timeout_s: float) -> None:
    """Wait up to `timeout_s` for the step processes an interrupt noted to end; those still
    running after CTRL_C_REACH_S get SIGTERM (a SIGINT that reached this process alone)."""
    start = time.monotonic()
    told = False
    while any(running(p) for p in _stopping) and time.monotonic() < start + timeout_s:
        if not told and time.monotonic() > start + CTRL_C_REACH_S:
            _terminate([p for p in _stopping if running(p)])
            told = True
        time.sleep(0.2)


_FAILED_TASK = re.compile(r"Inner task failed: '([a-z][a-z0-9_-]*)'")  # kfp.local's message


def _record_unrecorded_failure(run: LocalRun, run_id: str, error: str) -> str | None:
    """The step kfp.local says failed, recorded FAILED in lineage when the step recorded
    nothing itself (its process died before it could: killed while importing TensorFlow), so
    `gptpipe runs` does not show the run COMPLETE; None when kfp.local names no step."""
    from pipelines.runners.local.view import without_colours

    found = _FAILED_TASK.search(without_colours(error))
    if found is None:
        return None
    step = found.group(1).replace("-", "_")
    try:
        summary = lineage.run_summary(run.metadata, run_id)
        if any(e["step"] == step for e in summary["executions"]):
            return step  # it recorded itself
    except UserError:
        pass  # no run in the store yet: the first step died
    try:
        lineage.record_execution(
            run.metadata,
            step=step,
            pipeline_name=PIPELINE_NAME,
            run_id=run_id,
            parameters={},
            inputs={},
            outputs={},
            properties={"error": DIED_UNRECORDED},
            state="FAILED",
        )
    except Exception as err:  # noqa: BLE001 -- the run's own error is the one to tell
        print(f"gptpipe: warning: could not record step {step!r} as failed: {err}", file=sys.stderr)
    return step


def _close_unfinished(run: LocalRun, run_id: str, reason: str) -> None:
    """Mark the run's executions still RUNNING as FAILED with `reason`; a store that fails
    this only warns: the run's own error is the one to tell."""
    try:
        lineage.close_unfinished(run.metadata, run_id, reason)
    except Exception as err:  # noqa: BLE001
        print(
            f"gptpipe: warning: could not close the run's unfinished steps: {err}", file=sys.stderr
        )


def _absolute(uri: str) -> str:
    """A local path or glob made absolute (steps run in other folders, and lineage records it
    for `gptpipe reproduce` to list again from anywhere); a gs:// URI as it is. A glob keeps
    its pattern: only the folder before it is resolved."""
    if storage.is_gcs(uri):
        return uri
    if not storage.has_wildcard(uri):
        return str(Path(uri).resolve())
    fixed = Path(storage.glob_root(uri))
    return str(fixed.resolve().joinpath(*Path(uri).parts[len(fixed.parts) :]))


def _absolute_tokenizer(params: TokenizeParams) -> TokenizeParams:
    """`params` with a given tokenizer's path made absolute, as the corpus's is."""
    if not params.tokenizer:
        return params
    return dataclasses.replace(params, tokenizer=_absolute(params.tokenizer))


@contextlib.contextmanager
def _in_environment(values: Mapping[str, str]) -> Iterator[None]:
    """Give every step the run id (and where to report progress, and which process the run
    is) as KFP gives it in a cluster: environment variables.

    kfp.local starts each step as a subprocess of this one, so the steps inherit them.
    """
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def captured_output(log: Path) -> Iterator[TextIO]:
    """Send everything this process prints to `log` while the block runs; yield the terminal.

    kfp.local streams each step's output through `print` and logs through `logging` to
    `sys.stdout`, and C libraries write to file descriptors 1 and 2: both descriptors and
    `sys.stdout`/`sys.stderr` are pointed at `log`. The block gets a text stream to what
    stdout was (the terminal) for the run view; everything is put back afterwards.
    """
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    old_stdout, old_stderr = sys.stdout, sys.stderr
    saved = os.dup(1), os.dup(2)
    terminal = (
        open(os.dup(saved[0]), "w", encoding="utf-8", errors="replace")  # noqa: SIM115
        if _writes_to_fd(old_stdout, 1)
        else old_stdout
    )
    with open(log, "ab") as target:
        os.dup2(target.fileno(), 1)
        os.dup2(target.fileno(), 2)
    into_log = open(1, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    sys.stdout = sys.stderr = into_log
    try:
        yield terminal
    finally:
        into_log.close()  # flushes; fd 1 stays open (closefd=False)
        sys.stdout, sys.stderr = old_stdout, old_stderr
        if terminal is not old_stdout:
            terminal.close()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def _writes_to_fd(stream: TextIO, fd: int) -> bool:
    try:
        return stream.fileno() == fd
    except (OSError, ValueError, io.UnsupportedOperation):
        return False


class PipelineFailed(RuntimeError):
    """A step failed: `step` (None when none is known) and its one-line `error`."""

    def __init__(self, message: str, step: str | None = None, error: str = "") -> None:
        super().__init__(message)
        self.step = step
        self.error = error or message
