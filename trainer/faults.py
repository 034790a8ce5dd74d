"""Test-only fault injection: a worker sends itself SIGKILL or SIGTERM after a given step.

Set by the trainer's `--fault-*` flags; tests/test_fault_tolerance.py uses it to check that a
job survives losing a worker. It is not part of the config and does not change its hash.
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass
from typing import Any

import tf_keras as keras

log = logging.getLogger("trainer")

FAULT_SIGNALS = ("KILL", "TERM")


@dataclass(frozen=True)
class Fault:
    """Worker `worker` sends itself `signal_name` after step `step`, only in a run that started
    from step 0, so the restarted job runs clean."""

    step: int  # optimizer step after which the signal is sent
    worker: int = 1  # TF_CONFIG task index of the worker that signals itself
    signal_name: str = "KILL"  # one of FAULT_SIGNALS


class InjectFault(keras.callbacks.Callback):
    """Signals this process after `fault.step` when training started from step 0."""

    def __init__(self, fault: Fault, task_index: int) -> None:
        super().__init__()
        self.fault = fault
        self.armed = fault.worker == task_index
        self._checked = False

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if not self._checked:  # after every on_train_begin, so after the backup's restore
            self._checked = True
            self.armed = self.armed and int(self.model.optimizer.iterations.numpy()) == 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.armed and int(self.model.optimizer.iterations.numpy()) == self.fault.step:
            name = self.fault.signal_name
            log.warning("fault injection: SIG%s at step %d", name, self.fault.step)
            os.kill(os.getpid(), getattr(signal, f"SIG{name}"))
