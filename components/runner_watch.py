"""A local run's steps end with the run: a step whose `gptpipe run --local` is gone stops.

kfp.local 2.13 starts each step with a plain `subprocess.Popen` of its command and reads the
step's output through a pipe (kfp/local/subprocess_task_handler.py, `run_local_subprocess`):
`sh -ec '... python3 -m kfp.dsl.executor_main ...'`, in the run's own process group, with no
parent-death signal. A run ended by a signal it can act on (Ctrl-C, SIGTERM, SIGHUP) stops its
steps itself (pipelines/runners/local/runner.py). One killed outright (SIGKILL, the OOM killer)
tells nobody: the step is re-parented and runs on, and the train step's workers with it (they
die with their launcher, components/jobs/lifeline.py, not with the run), until the job ends,
writing into a pipe that nobody reads.

So the run names itself to its steps: `RUNNER_ENV` holds its `this_process()` record
(components/storage/lease.py, which tells it from a later process under the same PID), the
step's edge reads it once (components/step_edge.py), and `end_with` watches it from a thread.
Once the run is gone, the step does what the run would have done: it sends itself SIGTERM,
which the launchers turn into stopping their workers and parts (components/jobs/cancel.py), and
every step records its end (FAILED, components/step.py) and exits non-zero. A step still
running `STOP_S` later is SIGKILLed, and its workers die with it. On a cluster the variable is
unset and nothing is watched: Kubernetes ends a cancelled run's pods.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Mapping

from components import storage
from contracts.errors import UserError

RUNNER_ENV = "GPTPIPE_RUNNER_PROCESS"  # the local run's process record; unset on a cluster
POLL_S = 0.5  # how often a step looks whether its run is still there
# How long a step told to stop has before it is SIGKILLed: past the launchers' own stop (their
# workers' SIGTERM grace, 10 s, then SIGKILL) and the step's record of its end.
STOP_S = 30.0


def announce() -> dict[str, str]:
    """The environment that names this process, the run, to the steps it starts; {} where
    /proc does not tell (then no step watches it)."""
    me = storage.this_process()
    return {RUNNER_ENV: json.dumps(me)} if me is not None else {}


def runner_of(env: Mapping[str, str]) -> dict[str, object] | None:
    """The run's process record in `env`, a step's environment; None when it is unset."""
    value = env.get(RUNNER_ENV, "")
    if not value:
        return None
    try:
        record = json.loads(value)
    except ValueError:
        record = None
    if not isinstance(record, dict):
        raise UserError(
            f"{RUNNER_ENV} is not a process record ({value[:60]!r}): only `gptpipe run --local` "
            "sets it, for its steps; unset it"
        )
    return record


def end_with(
    runner: Mapping[str, object] | None, *, poll_s: float = POLL_S, stop_s: float = STOP_S
) -> threading.Thread | None:
    """End this process once `runner` (a `this_process()` record) has ended: SIGTERM, then
    SIGKILL `stop_s` later. It is watched from a daemon thread, returned; None when there is
    nothing to watch (no record, or no /proc to tell this process by)."""
    here = storage.this_process()
    if runner is None or here is None:
        return None
    watch = threading.Thread(
        target=_watch, args=(runner, here, poll_s, stop_s), name="runner-watch", daemon=True
    )
    watch.start()
    return watch


def _watch(
    runner: Mapping[str, object], here: dict[str, object], poll_s: float, stop_s: float
) -> None:
    while not storage.process_gone(runner, here):
        time.sleep(poll_s)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(stop_s)
    os.kill(os.getpid(), signal.SIGKILL)
