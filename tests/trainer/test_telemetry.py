"""What a training run shows while it runs and leaves behind: Prometheus metrics, TensorBoard
logs, the training curve in the SavedModel, live progress, and `gptpipe tensorboard`.

One real 2-worker job (the local launcher, MultiWorkerMirrored on CPU) serves them all: its
chief's /metrics endpoint is scraped from this test while it trains.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import math
import re
import socket
import sys
import threading
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the SavedModel's SentencePiece ops)
import yaml

from components import lineage
from components.jobs.local import LocalLauncher
from components.jobs.spec import JobSpec
from components.jobs.tfjob import manifest
from components.train.executor import trainer_command
from contracts.artifacts import SERVING_DIR, TRAIN_HISTORY, TRAIN_METRICS
from contracts.errors import UserError
from contracts.progress import PROGRESS_ENV, read_events
from pipelines.cli import tensorboard as tensorboard_cmd
from tests.tiny import TINY_OVERRIDES
from trainer.config import resolve_config
from trainer.metrics_server import GpuCollector, MetricsServer
from trainer.task import metrics_port

STEPS, LOG_EVERY, VALIDATE_EVERY = 120, 10, 60
OVERRIDES = TINY_OVERRIDES + (
    f"train.train_steps={STEPS}",
    f"train.log_every={LOG_EVERY}",
    f"train.checkpoint_every={VALIDATE_EVERY}",
)
TOKENS_PER_STEP = 2 * 8 * 16  # 2 workers x train.batch_size x model.seq_len
REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return int(sock.getsockname()[1])


def _gauges(text: str) -> dict[str, float]:
    """Unlabelled samples of a Prometheus text exposition, by name."""
    found = {}
    for line in text.splitlines():
        match = re.fullmatch(r"([a-z_]+) (\S+)", line)
        if match:
            found[match[1]] = float(match[2])
    return found


class Scraper(threading.Thread):
    """Scrapes http://localhost:<port>/metrics every 50 ms until stopped; keeps every answer."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.url = f"http://localhost:{port}/metrics"
        self.scrapes: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                with urllib.request.urlopen(self.url, timeout=2) as reply:
                    self.scrapes.append(reply.read().decode())
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # not serving yet, or already gone
            self.done.wait(0.05)


class Job:
    """The 2-worker job, with the metrics port set and progress events on."""

    def __init__(self, root: Path, examples: Path) -> None:
        self.root, self.model, self.work = root, root / "model", root / "work"
        self.logs, self.events = root / "launcher-logs", root / "progress.jsonl"
        cfg = resolve_config("tiny", OVERRIDES)
        port = _free_port()
        command = trainer_command(
            sys.executable, str(examples), str(self.model), str(self.work), cfg, port
        )
        spec = JobSpec(
            name="telemetry",
            command=command,
            workers=2,
            backoff_limit=0,
            active_deadline_seconds=240,
            env={"TF_CPP_MIN_LOG_LEVEL": "2", PROGRESS_ENV: str(self.events)},
        )
        self.scraper = Scraper(port)
        self.scraper.start()
        try:
            self.result = LocalLauncher(log_dir=self.logs, out=io.StringIO()).run(spec)
        finally:
            self.scraper.done.set()
            self.scraper.join()

    def log(self, worker: int) -> str:
        return (self.logs / "attempt-1" / f"worker-{worker}.log").read_text()

    def history(self) -> dict:
        return json.loads((self.model / SERVING_DIR / TRAIN_HISTORY).read_text())


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory, examples: Path) -> Job:
    return Job(tmp_path_factory.mktemp("job"), examples)


# ---- live: /metrics and progress ------------------------------------------------------------


@pytest.mark.slow
def test_metrics_are_scraped_while_two_workers_train(job: Job) -> None:
    assert job.result.attempts == 1
    steps = [g["gptpipe_train_step"] for g in map(_gauges, job.scraper.scrapes) if g]
    steps = [s for s in steps if s]
    assert len(set(steps)) >= 2, f"{len(job.scraper.scrapes)} scrapes, steps {steps}"
    assert steps == sorted(steps) and steps[-1] > steps[0]  # it advanced between two scrapes
    last = _gauges(job.scraper.scrapes[-1])
    assert last["gptpipe_train_total_steps"] == STEPS
    assert math.isfinite(last["gptpipe_train_loss"]) and last["gptpipe_train_loss"] > 0
    assert last["gptpipe_train_tokens_per_second"] > 0
    assert 0 <= last["gptpipe_train_input_wait_fraction"] <= 1
    assert last["gptpipe_train_allreduce_seconds"] >= 0  # measured: two CPU workers
    assert last["gptpipe_train_grad_norm"] > 0 and last["gptpipe_train_learning_rate"] > 0
    text = "\n".join(job.scraper.scrapes)
    assert "gptpipe_train_mfu" not in text and "gptpipe_gpu_" not in text  # no GPU here


@pytest.mark.slow
def test_only_the_chief_reports_progress(job: Job) -> None:
    events, _ = read_events(str(job.events))
    assert events and {e["step"] for e in events} == {"train"}
    assert all(e["unit"] == "steps" and e["total"] == STEPS for e in events)
    done = [e["done"] for e in events]
    assert done == sorted(done) and done.count(STEPS) == 1  # one final event: one reporter
    final = events[-1]
    assert final["done"] == STEPS and final["loss"] > 0 and final["tokens_per_s"] > 0


# ---- left behind: TensorBoard logs and the history in the SavedModel -------------------------


def _scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """tag -> {step: value} of every scalar summary in a TensorBoard run folder."""
    found: dict[str, dict[int, float]] = {}
    for path in run_dir.glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                scalar = float(tf.make_ndarray(value.tensor))
                found.setdefault(value.tag, {})[event.step] = scalar
    return found


@pytest.mark.slow
def test_the_chief_writes_tensorboard_scalars(job: Job) -> None:
    logs = job.work / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["train", "validation"]
    for run in ("train", "validation"):  # one writer: the chief's
        assert len(list((logs / run).glob("events.out.tfevents.*"))) == 1
    train = _scalars(logs / "train")
    log_steps = list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    assert sorted(train["loss"]) == [1, *log_steps]
    assert sorted(train["learning_rate"]) == sorted(train["grad_norm"]) == [1, *log_steps]
    for tag in (
        "tokens_per_second",
        "step_time/total_s",
        "step_time/input_wait_s",
        "step_time/compute_s",
        "input_wait_fraction",
        "allreduce_s",
    ):
        assert sorted(train[tag]) == log_steps, tag  # from the second logging step: a speed
    for step in log_steps:
        total = train["step_time/total_s"][step]
        split = train["step_time/input_wait_s"][step] + train["step_time/compute_s"][step]
        assert split == pytest.approx(total, rel=1e-4)
        assert train["tokens_per_second"][step] == pytest.approx(TOKENS_PER_STEP / total, rel=1e-3)
    validation = _scalars(logs / "validation")
    assert sorted(validation["loss"]) == [VALIDATE_EVERY, STEPS]
    final = json.loads((job.model / TRAIN_METRICS).read_text())["final_loss"]
    assert train["loss"][STEPS] == pytest.approx(final, rel=1e-6)


@pytest.mark.slow
def test_the_saved_model_carries_the_training_curve(job: Job) -> None:
    history = job.history()
    points = history["points"]
    assert [p["step"] for p in points] == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    assert all(p["tokens"] == p["step"] * TOKENS_PER_STEP for p in points)
    for point in points:
        assert {"loss", "learning_rate", "tokens_per_s", "grad_norm", "input_wait_frac"} <= set(
            point
        )
        assert point["tokens_per_s"] > 0 and 0 <= point["input_wait_frac"] <= 1
        assert math.isfinite(point["grad_norm"]) and point["grad_norm"] > 0
        assert "mfu" not in point  # a CPU has no known peak
    chief_log = job.log(0)
    for point in points:  # the numbers the chief logged
        logged = re.search(rf"step {point['step']} loss ([0-9.]+)", chief_log)
        assert logged and float(logged[1]) == pytest.approx(point["loss"], abs=1e-4)
    assert [(e["step"], e["tokens"]) for e in history["eval_points"]] == [
        (VALIDATE_EVERY, VALIDATE_EVERY * TOKENS_PER_STEP),
        (STEPS, STEPS * TOKENS_PER_STEP),
    ]
    val = re.search(rf"step {STEPS} val_loss ([0-9.]+)", chief_log)
    assert val and float(val[1]) == pytest.approx(history["eval_points"][-1]["val_loss"], abs=1e-4)
    assert (history["device"], history["replicas"], history["global_batch_size"]) == ("CPU", 2, 16)
    assert history["wall_s"] > 0 and "mfu" not in history
    # Still a SavedModel that serves: the extra file sits where TF Serving does not look.
    loaded = tf.saved_model.load(str(job.model / SERVING_DIR))
    scored = loaded.signatures["score"](text=tf.constant(["ROMEO:\nBut soft"]))
    assert math.isfinite(float(scored["nats_per_char"][0]))


# ---- gptpipe tensorboard -------------------------------------------------------------------


def _tensorboard(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gptpipe")
    tensorboard_cmd.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["tensorboard", *argv])
    return int(args.func(args))


def test_tensorboard_print_finds_the_runs_work_folder_through_lineage(tmp_path, capsys):
    store = str(tmp_path / "metadata.sqlite")
    root = str(tmp_path / "pipeline_root")
    for run in ("local-older", "local-newer"):
        with lineage.step(store, "tokenize", "gptpipe", run, {"artifact_root": root}):
            pass
        with lineage.step(store, "train", "gptpipe", run, {"workers": 2}):
            pass
    with lineage.step(store, "push", "gptpipe", "local-rollback", {}):
        pass  # the newest run trained nothing: a rollback

    assert _tensorboard(["--root", str(tmp_path), "--print"]) == 0
    assert capsys.readouterr().out == f"{root}/work/local-newer/train/logs\n"
    assert _tensorboard(["--root", str(tmp_path), "--run", "local-older", "--print"]) == 0
    assert capsys.readouterr().out == f"{root}/work/local-older/train/logs\n"
    with pytest.raises(UserError, match="no run 'local-nope'"):
        _tensorboard(["--root", str(tmp_path), "--run", "local-nope", "--print"])
    with pytest.raises(UserError, match="local-rollback has no train step"):
        _tensorboard(["--root", str(tmp_path), "--run", "local-rollback", "--print"])
    with pytest.raises(UserError, match="no TensorBoard logs at .*local-newer"):
        _tensorboard(["--root", str(tmp_path), "--port", str(_free_port())])  # none written


@pytest.mark.slow
def test_tensorboard_serves_the_runs_logs(job: Job) -> None:
    port = _free_port()
    server = tensorboard_cmd.start_tensorboard(str(job.work / "logs"), port)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://localhost:{port}/", timeout=5) as reply:
                    assert reply.status == 200 and b"<html" in reply.read().lower()
                break
            except (urllib.error.URLError, ConnectionError):
                assert server.poll() is None, "TensorBoard exited"
                assert time.monotonic() < deadline, "TensorBoard did not answer"
                time.sleep(0.5)
        with urllib.request.urlopen(f"http://localhost:{port}/data/runs", timeout=10) as reply:
            assert set(json.loads(reply.read())) == {"train", "validation"}
    finally:
        server.terminate()
        server.wait(timeout=30)


# ---- the pieces ----------------------------------------------------------------------------


def test_the_pod_monitor_scrapes_what_the_tfjob_chief_serves():
    monitor = yaml.safe_load((REPO / "deploy" / "podmonitor.yaml").read_text())
    assert monitor["spec"]["selector"]["matchLabels"] == {
        manifest.LABEL_MANAGED_BY: "gptpipe",  # every gptpipe worker pod
        "training.kubeflow.org/job-role": "master",  # the operator's mark on worker 0
    }
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == manifest.METRICS_PORT_NAME
    assert endpoint["path"] == manifest.METRICS_PATH


class FakeNvml(types.SimpleNamespace):
    """NVML's calls as pynvml makes them, for two GPUs (there is none here)."""

    def __init__(self, fail_init: bool = False, no_utilization: bool = False) -> None:
        super().__init__(shut=False)
        self.fail_init = fail_init
        self.no_utilization = no_utilization

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> types.SimpleNamespace:
        if self.no_utilization:  # as on a MIG device: NVML_ERROR_NOT_SUPPORTED
            raise RuntimeError("Not Supported")
        return types.SimpleNamespace(gpu=[65, 90][handle], memory=10)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(used=(handle + 1) * 2**30, total=80 * 2**30)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return 350_000  # milliwatts


def test_gpu_metrics_come_from_nvml_at_scrape_time_and_a_missing_nvml_is_logged(caplog):
    nvml, port = FakeNvml(), _free_port()
    server = MetricsServer(port, gpus=True, nvml=nvml)  # type: ignore[arg-type]
    try:
        server.set(step=7, loss=2.5, mfu=None)
        with urllib.request.urlopen(f"http://localhost:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    finally:
        server.close()
    assert 'gptpipe_gpu_utilization_ratio{gpu="0"} 0.65' in text
    assert 'gptpipe_gpu_utilization_ratio{gpu="1"} 0.9' in text
    assert 'gptpipe_gpu_memory_used_bytes{gpu="1"} 2.147483648e+09' in text
    assert 'gptpipe_gpu_power_watts{gpu="0"} 350.0' in text
    assert "gptpipe_train_step 7.0" in text and "gptpipe_train_mfu" not in text  # not measured
    assert nvml.shut

    with caplog.at_level(logging.WARNING, logger="trainer"):
        assert GpuCollector.start(FakeNvml(fail_init=True)) is None  # type: ignore[arg-type]
    assert [r.message for r in caplog.records] == [
        "metrics: no GPU metrics, NVML did not start: NVML Shared Library Not Found"
    ]


def test_the_metrics_port_is_the_flag_else_the_environment_else_off():
    assert metrics_port(None, None) == 0 and metrics_port(None, "") == 0
    assert metrics_port(None, "9100") == 9100  # GPTPIPE_METRICS_PORT, e.g. for a local run
    assert metrics_port(9090, "9100") == 9090 and metrics_port(0, "9100") == 0
    for bad in ("nine", "-1", "70000"):
        with pytest.raises(UserError, match=f"metrics port '{bad}'.*GPTPIPE_METRICS_PORT"):
            metrics_port(None, bad)


def test_a_busy_metrics_port_is_logged_and_training_goes_on(caplog):
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        with caplog.at_level(logging.WARNING, logger="trainer"):
            server = MetricsServer(taken.getsockname()[1], gpus=False)
        server.set(step=1)  # still usable, only not served
        server.close()
    assert "cannot serve on port" in caplog.text


def test_the_step_records_timestamps_on_cpus_without_xla_only():
    from trainer import train_step

    assert train_step.times_steps(jit=False, device_kind="cpu")
    assert not train_step.times_steps(jit=True, device_kind="cpu")  # XLA compiles no timestamp
    # On a GPU a timestamp depending on device tensors syncs the host with the stream each step.
    assert not train_step.times_steps(jit=False, device_kind="gpu")


def test_a_divergence_is_reported_at_once_not_throttled(tmp_path):
    """The run view shows where a diverged training stopped: that event is never held back."""
    from contracts.progress import Progress, read_events
    from trainer.telemetry import LogPoint, Telemetry

    events = tmp_path / "events.jsonl"
    telemetry = Telemetry(None, None, Progress(str(events), "train"))
    for step, loss in ((10, 3.0), (20, 2.5), (30, float("nan"))):  # within MIN_INTERVAL_S
        telemetry.report(LogPoint(step, 100, step * 64, loss, 1e-3, 1.0, None))
    found, _ = read_events(str(events))
    assert [e["done"] for e in found] == [10, 30] and math.isnan(found[-1]["loss"])


def test_a_gpu_without_utilization_still_reports_its_memory_and_power():
    """A MIG slice has no utilisation counter (NVML: Not Supported); its other series stay."""
    nvml, port = FakeNvml(no_utilization=True), _free_port()
    server = MetricsServer(port, gpus=True, nvml=nvml)  # type: ignore[arg-type]
    try:
        with urllib.request.urlopen(f"http://localhost:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    finally:
        server.close()
    assert "gptpipe_gpu_utilization_ratio{" not in text
    assert 'gptpipe_gpu_memory_used_bytes{gpu="1"}' in text
    assert 'gptpipe_gpu_power_watts{gpu="1"} 350.0' in text


def test_an_attempt_killed_outright_keeps_its_time_and_tensorboard_no_step_twice(
    tmp_path, monkeypatch
):
    """Killed at step 150 (validated and backed up at 100), resumed at 100, done at 200: the
    time up to the last validation counts, and TensorBoard holds each step once (the killed
    attempt's 110-150 dropped; the resumed attempt logs them again)."""
    import types

    from trainer import callbacks
    from trainer.callbacks import TrainMonitor
    from trainer.history import TrainHistory
    from trainer.telemetry import Telemetry

    clock = [0.0]
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: clock[0])

    def attempt(start: int, stop: int, killed: bool) -> TrainHistory:
        history = TrainHistory("CPU", 1, 8)
        history.load(str(tmp_path))
        telemetry = Telemetry(str(tmp_path))
        monitor = TrainMonitor(1000, 10, 128, lambda s: tf.constant(1e-3), history, telemetry)
        iterations = types.SimpleNamespace(numpy=lambda: start)
        model = types.SimpleNamespace(
            optimizer=types.SimpleNamespace(iterations=iterations), stop_training=False
        )
        monitor.set_model(model)
        monitor.on_train_begin()
        for batch in range(stop - start):
            monitor.on_train_batch_begin(batch)
            clock[0] += 1.0  # a second a step
            monitor.on_train_batch_end(batch, {"loss": 2.0})
            if monitor.step % 100 == 0:
                monitor.on_epoch_end(0, {"val_loss": 1.5})
        if not killed:
            monitor.on_train_end()
        telemetry.close()  # task.py closes it in `finally`, as when a peer is lost
        return history

    attempt(0, 150, killed=True)
    history = attempt(100, 200, killed=False)
    assert history.wall_s == 200.0  # 100 s to the killed attempt's validation, then 100 s
    assert [p["step"] for p in history.points][-1] == 200
    logged: dict[int, int] = {}
    for path in sorted((tmp_path / "logs" / "train").glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            if any(v.tag == "loss" for v in event.summary.value):
                logged[event.step] = logged.get(event.step, 0) + 1
    # Each attempt also logs its first step (1, then 101).
    expected = sorted([1, 101, *range(10, 201, 10)])
    assert sorted(logged) == expected and set(logged.values()) == {1}


def test_trimming_tensorboard_on_resume_is_housekeeping_that_never_stops_training(
    tmp_path, monkeypatch, caplog
):
    """A temporary an earlier trim left (killed before its rename) is removed, never read by
    TensorBoard (its name holds no "tfevents"); a storage error while trimming is a warning."""
    from trainer.telemetry import LogPoint, Telemetry

    first = Telemetry(str(tmp_path))
    for step in (10, 20, 30):
        first.report(LogPoint(step, 100, step * 64, 2.0, 1e-3, 1.0, None))
    first.close()
    folder = tmp_path / "logs" / "train"
    (event_file,) = folder.iterdir()
    left = folder / f".{event_file.name.replace('tfevents', 'trim')}.trim-tmp"
    left.write_bytes(event_file.read_bytes())
    Telemetry(str(tmp_path)).resume_at(20)
    assert [p.name for p in folder.iterdir()] == [event_file.name]
    steps = [
        e.step for e in tf.compat.v1.train.summary_iterator(str(event_file)) if e.summary.value
    ]
    assert sorted(set(steps)) == [10, 20]

    def unavailable(*args, **kwargs):
        raise tf.errors.UnavailableError(None, None, "GCS is down")

    monkeypatch.setattr(tf.data, "TFRecordDataset", unavailable)
    Telemetry(str(tmp_path)).resume_at(10)  # no exception
    assert "could not drop steps after 10" in caplog.text and "GCS is down" in caplog.text
