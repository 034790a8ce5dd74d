"""Failures no restart can mend are told apart from those a restart can (trainer/unmendable.py),
and a worker exits 3 on them with a record naming the path (trainer/exits.py)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import tensorflow as tf

from contracts import termination
from trainer import exits, unmendable
from trainer.export import ExportFailed
from trainer.preemption import EXIT_PREEMPTED


def _raised(write) -> BaseException:
    with pytest.raises(Exception) as caught:
        write()
    return caught.value


def _tf_write(path: str) -> None:
    with tf.io.gfile.GFile(path, "w") as f:
        f.write("x" * 100_000)


def _py_write(path: str) -> None:
    with open(path, "w") as f:
        f.write("x" * 100_000)


@pytest.mark.parametrize(
    ("write", "where"),
    [
        (_tf_write, "/dev/full"),
        # Python's buffered write fails at the flush, with an OSError that names no file
        (_py_write, "a file it wrote (unnamed)"),
        (lambda path: Path(path).write_bytes(b"x"), "a file it wrote (unnamed)"),
    ],
    ids=["tensorflow", "python", "pathlib"],
)
def test_a_full_device_is_named_with_its_path(write, where):
    """/dev/full fails every write with ENOSPC: TensorFlow's file system and Python's alike."""
    said = unmendable.describe(_raised(lambda: write("/dev/full")))
    assert said is not None and said.startswith(f"no space left on device at {where}: ")
    assert "free space there" in said


def test_a_denied_write_is_named_with_its_path():
    """sysfs refuses to create a file, even to root: TensorFlow's PermissionDeniedError."""
    said = unmendable.describe(_raised(lambda: _tf_write("/sys/kernel/gptpipe-test")))
    assert said is not None and said.startswith("permission denied at /sys/kernel/gptpipe-test:")


@pytest.mark.parametrize(
    ("err", "named"),
    [
        (OSError(errno.EDQUOT, "Disk quota exceeded", "/runs/x"), "disk quota exceeded at /runs/x"),
        (OSError(errno.EROFS, "Read-only file system", "/runs/x"), "read-only file system at"),
        (OSError(errno.EFBIG, "File too large", "/runs/x"), "file too large at /runs/x"),
        (
            tf.errors.ResourceExhaustedError(
                None, None, "{{function_node SaveV2}} gs://b/w/ckpt-1.data; Disk quota exceeded"
            ),
            "disk quota exceeded at gs://b/w/ckpt-1.data:",
        ),
        (
            tf.errors.PermissionDeniedError(None, None, "Error executing an HTTP request: 403"),
            "permission denied at Error executing an HTTP request: 403:",
        ),
        (
            ExportFailed("x"),
            None,  # a failed export alone is retried: its cause decides
        ),
        (tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor"), None),
        (tf.errors.OutOfRangeError(None, None, "End of sequence"), None),
        (OSError(errno.ENOENT, "No such file or directory", "/runs/x"), None),
        (tf.errors.UnavailableError(None, None, "Socket closed"), None),
    ],
)
def test_what_is_unmendable(err, named):
    said = unmendable.describe(err)
    assert (said is None) if named is None else (said or "").startswith(named), said


def test_the_cause_of_a_failed_export_decides(tmp_path):
    try:
        try:
            _tf_write("/dev/full")
        except tf.errors.OpError as err:
            raise ExportFailed(str(err)) from err
    except ExportFailed as failed:
        said = unmendable.describe(failed)
    assert said is not None and said.startswith("no space left on device at /dev/full")


def test_a_full_disk_exits_3_with_its_record_and_a_transient_failure_143(tmp_path: Path):
    record = tmp_path / "termination-log"
    full = ExportFailed("full")
    full.__cause__ = tf.errors.ResourceExhaustedError(
        None, None, "/runs/m/Format-Serving/variables/v.data; No space left on device"
    )
    assert exits.exit_code(full, str(record)) == termination.PERMANENT_ERROR_EXIT == 3
    said = termination.read(str(record))
    assert said is not None and said.kind == termination.PERMANENT_ERROR
    assert said.message.startswith("no space left on device at /runs/m/Format-Serving/")
    assert json.loads(record.read_text())["kind"] == "permanent_error"
    assert exits.exit_code(ExportFailed("a 503 from storage"), None) == EXIT_PREEMPTED
    with pytest.raises(ValueError):  # a bug: raised again, exit 1
        exits.exit_code(ValueError("bug"), None)
