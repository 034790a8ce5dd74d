"""How a worker tells its launcher why it stopped: one JSON record in its termination-message file.

Kubernetes' own channel: the kubelet mounts an empty file at the container's
`terminationMessagePath` and, once the container has exited, copies the file's last 4096 bytes
into `status.containerStatuses[].state.terminated.message` (pkg/kubelet/kuberuntime/
kuberuntime_container.go, `makeMounts` and `getTerminationMessage`; the limit is
pkg/kubelet/container/runtime.go `MaxContainerTerminationMessageLength`). The TFJob manifest
sets that path and `WORKER_MESSAGE_ENV` to the same file; the local launcher gives each worker a
file of its own in its attempt folder. A worker reads the variable once, at its entry point.

The record is a `TerminationMessage`; exit code `INPUT_ERROR_EXIT` with kind `INPUT_ERROR`
means the worker stopped on a mistake in its input (a bad config, damaged Examples) and the
message names the input and the fix; exit code `PERMANENT_ERROR_EXIT` with kind
`PERMANENT_ERROR`, that it stopped on a failure no restart can mend (a full disk, a read-only
file system, a denied permission, a spent retry budget), and the message names where and the
fix. Both codes are below 128, so the operator's ExitCode policy fails the job at once. A file
that holds anything else (a user's own image writing text there) is no record: `parse` returns
None, and the job fails as any failed worker does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from contracts.errors import UserError
from contracts.records import from_json, to_json

WORKER_MESSAGE_ENV = "GPTPIPE_TERMINATION_MESSAGE"  # the file a worker writes its record to
TERMINATION_MESSAGE_PATH = "/dev/termination-log"  # Kubernetes' default terminationMessagePath
MAX_MESSAGE_BYTES = 4096  # what the kubelet keeps of the file: its last 4096 bytes
INPUT_ERROR = "input_error"  # the kind of a mistake in the worker's input
INPUT_ERROR_EXIT = 2  # the exit code that goes with it (docs/training.md)
PERMANENT_ERROR = "permanent_error"  # the kind of a failure no restart can mend
PERMANENT_ERROR_EXIT = 3  # the exit code that goes with it
KINDS = (INPUT_ERROR, PERMANENT_ERROR)
EXIT_CODES = {INPUT_ERROR: INPUT_ERROR_EXIT, PERMANENT_ERROR: PERMANENT_ERROR_EXIT}  # by kind


@dataclass(frozen=True)
class TerminationMessage:
    """Why a worker stopped, as it wrote it in its termination-message file."""

    kind: str  # one of KINDS
    message: str  # one line for people: the input and the fix

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UserError(f"termination message kind {self.kind!r}: use one of {KINDS}")


def encode(record: TerminationMessage) -> bytes:
    """`record` as the file's bytes, its message shortened (marked with "…") so that the whole
    JSON fits in MAX_MESSAGE_BYTES: the kubelet keeps the file's end, and a cut JSON is none."""
    data = to_json(record).encode("utf-8")
    text = record.message
    while len(data) > MAX_MESSAGE_BYTES and text:
        text = text[: len(text) // 2]
        data = to_json(TerminationMessage(record.kind, text + "…")).encode("utf-8")
    return data


def write(path: str, record: TerminationMessage) -> None:
    """Write `record` to the termination-message file `path` (replacing what was there).

    Raises OSError if the file cannot be written; a worker says so and exits all the same.
    """
    with open(path, "wb") as f:
        f.write(encode(record))
        f.flush()
        os.fsync(f.fileno())


def parse(text: str) -> TerminationMessage | None:
    """The record in a termination message, or None if it holds no record of ours."""
    if not text.strip():
        return None
    try:
        return from_json(TerminationMessage, text, "termination message")
    except UserError:
        return None


def read(path: str) -> TerminationMessage | None:
    """The record in the file `path`, read as the kubelet reads it (its last MAX_MESSAGE_BYTES);
    None if there is no file or no record in it."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - MAX_MESSAGE_BYTES))
            data = f.read()
    except OSError:
        return None
    return parse(data.decode("utf-8", errors="replace"))
