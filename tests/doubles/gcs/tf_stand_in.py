"""A stand-in for TensorFlow's own GCS file system, around the kubelet double's TFJob worker pods.

It stands in for TensorFlow, NOT for anything Kubernetes does. On a cluster the trainer reads
`--examples` and writes `--model-dir` and `--work-dir` on gs:// itself, through TensorFlow's GCS
file system (tf.io.gfile, tf.data). That file system cannot reach gcp-storage-emulator: it
ignores STORAGE_EMULATOR_HOST, and the tensorflow-io plugin that could be pointed elsewhere
crashes TensorFlow 2.19. So when a test opts in (`Kubelet(gcs_stand_in=TfGcsStandIn(client))`,
or setting `kubelet.gcs_stand_in`), the kubelet double moves those bytes around the worker's
process with google-cloud-storage, against the emulator:

- before the process starts (the pod stays Pending meanwhile): the gs:// `--examples` folder and
  whatever the `--work-dir` folder holds now (checkpoints and the BackupAndRestore backup of
  earlier attempts) are downloaded into the pod's own folder, and the arguments are rewritten to
  those local copies; `--model-dir` becomes a local folder that does not exist yet;
- once the process has exited, however it exited: what it changed in its copy of the work folder
  is written back (new and changed files uploaded, files it deleted deleted), so a restarted pod
  resumes from what its predecessor saved; and when worker 0 exited 0, its model folder is
  uploaded to the `--model-dir` URI, replacing whatever was there (the trainer's own export
  replaces the folder too).

What differs from TensorFlow's file system: writes reach GCS when the process ends, not as they
happen. Nobody reads them earlier in the runs the e2e test makes: workers never read each other's
files while they run (docs/training.md, "Who writes what"), and the train step reads the Model
only after worker 0's pod Succeeded, which the kubelet reports after the upload. A worker
restarted while a peer still runs would not see what that peer saved since the peer started (on
GCS it would); the restart tests run the trainer on local paths (tests/faults/test_tfjob_faults.py).
Only `--flag value` pairs are rewritten; `--flag=value` and local paths are left alone.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from google.api_core import exceptions as gexc
from google.cloud import storage as gcs_lib

EXAMPLES, MODEL, WORK = "--examples", "--model-dir", "--work-dir"
Snapshot = dict[str, tuple[int, int]]  # relative path -> (size, mtime_ns) after the download


def split_uri(uri: str) -> tuple[str, str]:
    """gs://bucket/a/b/ -> ("bucket", "a/b/"): the folder's key prefix, ending in "/"."""
    bucket, _, key = uri[len("gs://") :].partition("/")
    key = key.strip("/")
    return bucket, f"{key}/" if key else ""


def local_files(folder: Path) -> Snapshot:
    """Every file under `folder` with its size and modification time."""
    found: Snapshot = {}
    if folder.is_dir():
        for path in folder.rglob("*"):
            if path.is_file():
                stat = path.stat()
                found[path.relative_to(folder).as_posix()] = (stat.st_size, stat.st_mtime_ns)
    return found


@dataclass
class Mirror:
    """A gs:// folder and the local folder that stands for it in one pod."""

    uri: str
    local: Path
    downloaded: Snapshot = field(default_factory=dict)

    def download(self, client: gcs_lib.Client) -> None:
        bucket, prefix = split_uri(self.uri)
        self.local.mkdir(parents=True, exist_ok=True)
        for blob in client.list_blobs(bucket, prefix=prefix):
            if blob.name.endswith("/"):  # a folder marker object
                continue
            target = self.local / blob.name[len(prefix) :]
            target.parent.mkdir(parents=True, exist_ok=True)
            blob.download_to_filename(str(target))
        self.downloaded = local_files(self.local)

    def write_back(self, client: gcs_lib.Client) -> None:
        """Upload what the process created or changed; delete what it removed."""
        bucket_name, prefix = split_uri(self.uri)
        bucket = client.bucket(bucket_name)
        now = local_files(self.local)
        for rel, stat in sorted(now.items()):
            if self.downloaded.get(rel) != stat:
                bucket.blob(prefix + rel).upload_from_filename(str(self.local / rel))
        for rel in sorted(set(self.downloaded) - set(now)):
            with contextlib.suppress(gexc.NotFound):  # a peer removed it too
                bucket.blob(prefix + rel).delete()

    def replace_remote(self, client: gcs_lib.Client) -> None:
        """Make the gs:// folder hold exactly the local folder's files."""
        bucket_name, prefix = split_uri(self.uri)
        bucket = client.bucket(bucket_name)
        now = local_files(self.local)
        for blob in client.list_blobs(bucket_name, prefix=prefix):
            if blob.name[len(prefix) :] not in now:
                with contextlib.suppress(gexc.NotFound):
                    blob.delete()
        for rel in sorted(now):
            bucket.blob(prefix + rel).upload_from_filename(str(self.local / rel))


@dataclass
class StagedPod:
    """One worker pod's local copies: the command to run, and what to write back after it."""

    argv: list[str]
    client: gcs_lib.Client
    work: Mirror | None = None
    model: Mirror | None = None  # worker 0's only: the other workers' exports are scratch

    def finish(self, exit_code: int) -> None:
        """Write back after the process exited with `exit_code` (any exit)."""
        if self.work is not None:
            self.work.write_back(self.client)
        if self.model is not None and exit_code == 0 and self.model.local.is_dir():
            self.model.replace_remote(self.client)


class TfGcsStandIn:
    """Prepares each trainer pod's gs:// arguments as local folders (see the module docstring)."""

    def __init__(self, client: gcs_lib.Client) -> None:
        self.client = client  # google-cloud-storage, pointed at the emulator

    def stage(self, argv: Sequence[str], folder: Path, worker_index: int) -> StagedPod:
        """Download into `folder` and return the rewritten command line.

        `worker_index` is the pod's replica index; only worker 0's model folder is uploaded.
        """
        args = list(argv)
        staged = StagedPod(args, self.client)
        for i, flag in enumerate(args[:-1]):
            uri = args[i + 1]
            if flag not in (EXAMPLES, MODEL, WORK) or not uri.startswith("gs://"):
                continue
            mirror = Mirror(uri, folder / flag.lstrip("-"))
            if flag == EXAMPLES:
                mirror.download(self.client)
            elif flag == WORK:
                mirror.download(self.client)
                staged.work = mirror
            elif worker_index == 0:
                staged.model = mirror
            args[i + 1] = os.fspath(mirror.local)
        return staged
