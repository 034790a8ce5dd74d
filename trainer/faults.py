"""Test-only fault injection: a worker sends itself SIGKILL or SIGTERM after a given step, or
once it has written its export (the chief: the Model) and before the export barrier.

Set by the trainer's `--fault-*` flags; tests/faults/test_worker_faults.py and
tests/faults/test_tfjob_faults.py use it to check that a job survives losing a worker. It is
not part of the config and does not change its hash.
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass
from typing import Any

from trainer.callbacks import StepCallback

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


class InjectFault(StepCallback):
    """Signals this process after `fault.step` when training started from step 0."""

    def __init__(self, fault: Fault, task_index: int) -> None:
        super().__init__()
        self.fault = fault
        self.armed = fault.worker == task_index
        self._checked = False

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if not self._checked:  # after every on_train_begin, so after the backup's restore
            super().on_train_batch_begin(batch, logs)
            self._checked = True
            self.armed = self.armed and self.first_step == 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        super().on_train_batch_end(batch, logs)
        if self.armed and self.step == self.fault.step:
            self._signal(f"at step {self.fault.step}")

    def after_export(self) -> None:
        """Signal now if the fault is at the export and this run trained from step 0 (a run
        resumed at its last step trains no batch, so it did not)."""
        if self.fault.at_export and self._checked and self.armed:
            self._signal("at the export")

    def _signal(self, when: str) -> None:
        name = self.fault.signal_name
        log.warning("fault injection: SIG%s %s", name, when)
        os.kill(os.getpid(), getattr(signal, f"SIG{name}"))
