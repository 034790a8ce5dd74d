"""The train step with everything on gs://, its worker on TensorFlow's own GCS file system.

The worker reaches the emulator as it would reach GCS, through GCS's hosts
(tests/doubles/gcs/googleapis.py): it reads the Examples' manifest and TFRecord shards, backs
up and checkpoints, is killed, resumes from its backup, and exports the Model, each a request
TensorFlow makes. TensorFlow leaves an empty `<folder>/` object for every folder it creates,
which KFP's launcher cannot download (kubeflow/pipelines#13476); the step removes them.
"""

from __future__ import annotations

import dataclasses
import io
from urllib.parse import parse_qsl, unquote, urlsplit

import pytest

from components import storage
from components.jobs.local import LocalLauncher
from components.train import executor
from contracts.artifacts import MODEL_COMPLETE, SAVED_MODEL_FILE, SERVING_DIR
from tests.doubles.kfp.objectstore import download
from tests.tiny import TINY_OVERRIDES
from trainer.config import resolve_config

pytestmark = pytest.mark.slow
KILL_AT_STEP = 15  # after the backup at step 10 (checkpoint_every), before the one at 20


class Watched:
    """The local launcher; once the job has succeeded, the Model as the job left it, before
    the train step's cleanup, and what KFP's launcher made of downloading it then."""

    def __init__(self, inner: LocalLauncher, gcs, model_uri: str, into) -> None:
        self.inner, self.gcs, self.model_uri, self.into = inner, gcs, model_uri, into
        self.left: list[str] = []
        self.download_error: Exception | None = None

    def run(self, spec, *, timeout_seconds=None):
        result = self.inner.run(spec, timeout_seconds=timeout_seconds)
        self.left = self.gcs.names("model/")
        try:
            download(self.gcs.client, self.model_uri, str(self.into))
        except OSError as err:
            self.download_error = err
        return result


def written(path: str) -> str | None:
    """The object a request of TensorFlow's writes (an upload or a rename's copy), or None."""
    parts = urlsplit(path)
    if "/rewriteTo/" in parts.path:
        return unquote(parts.path.rsplit("/o/", 1)[1])
    if parts.path.startswith("/upload/"):
        return dict(parse_qsl(parts.query)).get("name")
    return None


@pytest.mark.heavy
def test_a_worker_trains_resumes_and_exports_on_gcs_through_tensorflow(
    gcs, googleapis, examples, tmp_path
):
    storage.upload_dir(examples, gcs.uri("examples"))
    steps = ("train.train_steps=20", "train.checkpoint_every=10")
    cfg = resolve_config("tiny", TINY_OVERRIDES + steps)
    model, work = gcs.uri("model"), gcs.uri("work")
    spec = executor.job_spec(
        gcs.uri("examples"), model, work, cfg, launcher="local", run_id="r-1", env=googleapis.env
    )
    kill = ["--fault-at-step", str(KILL_AT_STEP), "--fault-worker", "0", "--fault-signal", "KILL"]
    spec = dataclasses.replace(spec, command=[*spec.command, *kill])
    local = LocalLauncher(log_dir=tmp_path / "logs", out=io.StringIO())
    launcher = Watched(local, gcs, model, tmp_path / "kfp-before")

    result = executor.run(spec, cfg, model, work, launcher)

    logs = "".join(p.read_text() for p in sorted((tmp_path / "logs").rglob("*.log")))
    assert result.launched.attempts == 2, logs[-3000:]
    assert f"resumed at step 10 from the backup in {work}/backup" in logs
    assert result.metrics.steps == 20
    bucket = gcs.bucket.name
    reads = {unquote(p) for m, p in googleapis.log if m == "GET" and p.startswith(f"/{bucket}/")}
    assert any(p.startswith(f"/{bucket}/examples/Split-train/") for p in reads), sorted(reads)
    assert "work/checkpoints/ckpt-20.index" in gcs.names("work/checkpoints/")
    assert not gcs.names("work/backup/")  # the step removed it once the job succeeded

    # The job left TensorFlow's folder markers in the Model; KFP could not download it then.
    markers = [name for name in launcher.left if name.endswith("/")]
    assert {"model/", f"model/{SERVING_DIR}/", f"model/{SERVING_DIR}/variables/"} <= set(markers)
    assert launcher.download_error is not None
    # The step removed them: KFP's launcher downloads the Model whole.
    assert not [name for name in gcs.names("model/") if name.endswith("/")]
    download(gcs.client, model, str(tmp_path / "kfp"))
    assert (tmp_path / "kfp" / MODEL_COMPLETE).is_file()
    assert (tmp_path / "kfp" / SERVING_DIR / SAVED_MODEL_FILE).is_file()

    # MODEL_COMPLETE was TensorFlow's last write into the Model.
    targets = [t for t in map(written, (p for _, p in googleapis.log)) if t]
    into_model = [t for t in targets if t.startswith("model/")]
    first_marker = into_model.index(f"model/{MODEL_COMPLETE}")
    assert set(into_model[first_marker:]) == {f"model/{MODEL_COMPLETE}"}, into_model[-5:]
    assert len(into_model) > first_marker > 3
