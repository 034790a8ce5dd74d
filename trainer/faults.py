"""Test-only fault injection: a worker sends itself SIGKILL or SIGTERM after a given step, or
once it has written its export (the chief: the Model) and before the export barrier; or, with
`no_space`, the backup after that step or the export itself fails to be written as on a full
disk, with the error TensorFlow's file system raises then (ENOSPC); with `lose_backup`, the
backup folder is removed before the signal, so that the restart finds none.

Set by the trainer's `--fault-*` flags; tests/faults/test_worker_faults.py and
tests/faults/test_tfjob_faults.py use it to check that a job survives losing a worker. It is
not part of the config and does not change its hash.
"""

from __future__ import annotations

import logging
import os
import posixpath
import signal
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from contracts.artifacts import SERVING_DIR
from trainer.callbacks import StepCallback
from trainer.export import ExportFailed

log = logging.getLogger("trainer")

FAULT_SIGNALS = ("KILL", "TERM")


@dataclass(frozen=True)
class Fault:
    """Worker `worker` sends itself `signal_name` after step `step` (or once it has written its
    export), only in a run that started from step 0, so the restarted job runs clean."""

    step: int  # optimizer step after which the signal is sent; 0: none
    worker: int = 1  # TF_CONFIG task index of the worker that signals itself
    signal_name: str = "KILL"  # one of FAULT_SIGNALS
    at_export: bool = False  # signal once the export is written, before the export barrier
    no_space: bool = False  # instead of a signal, that write (the backup, the export) fails: ENOSPC
    lose_backup: bool = False  # before the signal, remove the backup, as a lost volume would


class InjectFault(StepCallback):
    """Signals this process after `fault.step` when training started from step 0 (or fails the
    backup's write then, or the export's, with `fault.no_space`)."""

    def __init__(
        self, fault: Fault, task_index: int, backup_dir: str = "", model_dir: str = ""
    ) -> None:
        super().__init__()
        self.fault = fault
        self.armed = fault.worker == task_index
        self.backup_dir, self.model_dir = backup_dir, model_dir
        self._checked = False

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if not self._checked:  # after every on_train_begin, so after the backup's restore
            super().on_train_batch_begin(batch, logs)
            self._checked = True
            self.armed = self.armed and self.first_step == 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        super().on_train_batch_end(batch, logs)
        if self.armed and self.step == self.fault.step:
            backup = posixpath.join(self.backup_dir, "chief", f"ckpt-{self.step}.index")
            self._strike(f"at step {self.fault.step}", backup)

    def before_export(self) -> None:
        """Fail the export as a full disk does, if that is the fault and this run trained from
        step 0."""
        if self.fault.at_export and self.fault.no_space and self._checked and self.armed:
            variables = posixpath.join(self.model_dir, SERVING_DIR, "variables")
            try:
                self._strike("at the export", variables + "/variables.data-00000-of-00001")
            except tf.errors.OpError as err:
                raise ExportFailed(str(err)) from err  # as export.write_model_artifact does

    def after_export(self) -> None:
        """Signal now if the fault is at the export and this run trained from step 0 (a run
        resumed at its last step trains no batch, so it did not)."""
        if self.fault.at_export and not self.fault.no_space and self._checked and self.armed:
            self._strike("at the export", "")

    def _strike(self, when: str, path: str) -> None:
        if self.fault.no_space:
            log.warning("fault injection: no space left on device %s", when)
            raise tf.errors.ResourceExhaustedError(None, None, f"{path}; No space left on device")
        if self.fault.lose_backup and tf.io.gfile.exists(self.backup_dir):
            log.warning("fault injection: removing the backup %s", self.backup_dir)
            tf.io.gfile.rmtree(self.backup_dir)
        name = self.fault.signal_name
        log.warning("fault injection: SIG%s %s", name, when)
        os.kill(os.getpid(), getattr(signal, f"SIG{name}"))
