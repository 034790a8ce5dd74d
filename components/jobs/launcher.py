"""The launcher contract: what a training job is (`JobSpec`), what running it returns or raises.

Every `Launcher` runs the same `JobSpec` with the same semantics and returns the same
`LaunchResult`. This module imports no implementation; each imports it, and the train executor
(`executor.make_launcher`) is the one place that picks one for training (`gptpipe gpu-bench`,
pipelines/cli/gpu_bench.py, runs only as a TFJob):

- `local` (components/jobs/local.py): worker processes on this machine, with TF_CONFIG
  written as the Training Operator writes it. For tests, laptops and `kfp.local`.
- `tfjob` (components/jobs/tfjob/launcher.py): a Kubeflow Training Operator v1 TFJob on the cluster.

Restart semantics (the operator's `restartPolicy: ExitCode`): a worker exit code of 1-127 is a
permanent error; 128-255 (a signal: 137 = SIGKILL/OOM, 143 = SIGTERM/preemption) is retryable.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import signal
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Protocol

from contracts.errors import UserError
from contracts.process import ignored, signal_handlers

RESTART_POLICIES = ("ExitCode", "OnFailure", "Never")  # the operator's; "Always" suits no training
CLEAN_POD_POLICIES = ("Running", "All", "None")  # the operator's runPolicy.cleanPodPolicy values
# A TFJob's Services are named `<job>-worker-<i>`, a DNS-1035 label of at most 63 characters,
# so the job name leaves room for "-worker-" and three digits.
MAX_JOB_NAME = 52
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def is_retryable_exit_code(code: int) -> bool:
    """True for exit codes the operator's ExitCode policy restarts (128-255: killed by a signal)."""
    return code >= 128


def run_label(run_id: str) -> str:
    """The run id as the value of the `gptpipe.dev/run-id` label on the job and its pods.

    A KFP run id (a UUID) is already a valid label value; anything else is cut to 63 characters
    of [A-Za-z0-9-_.]. Whoever selects a run's jobs by the label computes it here too.
    """
    cleaned = "".join(
        ch if (ch.isascii() and ch.isalnum()) or ch in "-_." else "-" for ch in run_id
    )[:63]
    return cleaned.strip("-_.")


def job_name(run_id: str, task_id: str, prefix: str = "train") -> str:
    """A deterministic job name for one task of one pipeline run.

    The same (run_id, task_id) always gives the same name, so a retried launcher finds and
    re-attaches to the job its previous attempt created instead of starting a second one; pass a
    task id that stays the same across retries (e.g. the task's name in the DAG). The name is a
    DNS-1035 label of at most 52 characters (room for the operator's `-worker-<i>` Services): a
    readable slug of the run id plus a hash of both ids.
    """
    digest = hashlib.sha256(f"{run_id}\0{task_id}".encode()).hexdigest()[:10]
    slug = re.sub(r"[^a-z0-9]+", "-", run_id.lower()).strip("-")
    room = MAX_JOB_NAME - len(prefix) - len(digest) - 2
    slug = slug[:room].strip("-")
    return "-".join(p for p in (prefix, slug, digest) if p)


@dataclass(frozen=True)
class OwnerPod:
    """The pod that runs the launcher; a TFJob it owns is garbage-collected with it."""

    name: str  # metadata.name of the launcher's pod (the downward API's metadata.name)
    uid: str  # metadata.uid of the launcher's pod (the downward API's metadata.uid)


@dataclass(frozen=True)
class JobSpec:
    """One distributed training job, as both launchers understand it."""

    name: str  # job name: TFJob metadata.name and the local log folder; see job_name
    command: Sequence[str]  # program every worker runs, e.g. ("python", "-m", "trainer.task", ...)
    image: str = ""  # container image by digest (`repo@sha256:<hex>`); unused by the local launcher
    namespace: str = "kubeflow"  # namespace of the TFJob (KFP's; in a pod, the launcher's own)
    run_id: str = ""  # pipeline run id, set as the label `gptpipe.dev/run-id` on the job and pods
    workers: int = 1  # MultiWorkerMirroredStrategy workers (TFJob Worker replicas); 0 is the chief
    gpus_per_worker: int = 0  # `nvidia.com/gpu` limit of each worker
    cpu: str = "4"  # CPU of each worker, request and limit (a Kubernetes quantity)
    memory: str = "16Gi"  # memory of each worker, request and limit (a Kubernetes quantity)
    # Size of each worker's memory-backed /dev/shm (NCCL and tf.data use shared memory; the
    # container runtime's default is 64Mi); it counts against `memory`. "": no such volume.
    shm_size: str = "2Gi"
    node_selector: Mapping[str, str] = field(default_factory=dict)  # pod nodeSelector
    tolerations: Sequence[Mapping[str, Any]] = ()  # pod tolerations, as Kubernetes JSON
    restart_policy: str = "ExitCode"  # one of RESTART_POLICIES
    backoff_limit: int = 3  # restarts of the worker group allowed before the job fails
    active_deadline_seconds: int | None = None  # job fails after this long; None: no limit
    ttl_seconds_after_finished: int | None = 86400  # operator deletes the finished TFJob after this
    clean_pod_policy: str = "Running"  # one of CLEAN_POD_POLICIES: pods deleted when the job ends
    labels: Mapping[str, str] = field(default_factory=dict)  # extra labels on the job and pods
    env: Mapping[str, str] = field(default_factory=dict)  # extra environment of every worker
    owner: OwnerPod | None = None  # the launcher's own pod, made owner of the TFJob
    volumes: Sequence[Mapping[str, Any]] = ()  # pod volumes, as Kubernetes JSON
    volume_mounts: Sequence[Mapping[str, Any]] = ()  # mounts in the `tensorflow` container
    service_account: str | None = None  # pod serviceAccountName (e.g. for Workload Identity)
    image_pull_secrets: Sequence[str] = ()  # names of Secrets the workers pull the image with
    pod_annotations: Mapping[str, str] = field(
        # Kubeflow profiles inject Istio sidecars, which keep TFJob pods from ever completing.
        default_factory=lambda: {"sidecar.istio.io/inject": "false"}
    )  # annotations on every worker pod
    allow_unpinned: bool = False  # accept an image by tag (never for pipeline runs)

    def __post_init__(self) -> None:
        object.__setattr__(self, "command", tuple(self.command))
        object.__setattr__(self, "tolerations", tuple(self.tolerations))
        object.__setattr__(self, "volumes", tuple(self.volumes))
        object.__setattr__(self, "volume_mounts", tuple(self.volume_mounts))
        object.__setattr__(self, "image_pull_secrets", tuple(self.image_pull_secrets))
        _validate(self)


_TOLERATION_FIELDS = frozenset({"key", "operator", "value", "effect", "tolerationSeconds"})


def _validate(spec: JobSpec) -> None:
    def bad(what: str, fix: str) -> UserError:
        return UserError(f"JobSpec {what}: {fix}")

    if len(spec.name) > MAX_JOB_NAME or not _DNS1035.match(spec.name):
        raise bad(
            f"name {spec.name!r} is invalid",
            f"use at most {MAX_JOB_NAME} lowercase letters, digits and '-', starting with a "
            "letter (launcher.job_name builds one)",
        )
    if not _DNS1123.match(spec.namespace) or len(spec.namespace) > 63:
        raise bad(f"namespace {spec.namespace!r} is invalid", "use a DNS-1123 label")
    if not spec.command or not all(isinstance(a, str) and a for a in spec.command):
        raise bad("command is empty or has a non-string", "give a list of non-empty strings")
    if spec.workers < 1:
        raise bad(f"workers={spec.workers}", "use at least 1")
    if spec.gpus_per_worker < 0:
        raise bad(f"gpus_per_worker={spec.gpus_per_worker}", "use 0 or more")
    for key, value in (("cpu", spec.cpu), ("memory", spec.memory), ("shm_size", spec.shm_size)):
        if not _QUANTITY.match(value) and not (key == "shm_size" and value == ""):
            raise bad(f"{key}={value!r} is not a Kubernetes quantity", "use e.g. '4', '8Gi'")
    for name in (spec.service_account or "", *spec.image_pull_secrets):
        if name and (len(name) > 253 or not _DNS1123_NAME.match(name)):
            raise bad(f"name {name!r} is not a Kubernetes object name", "use a DNS-1123 subdomain")
    if spec.restart_policy not in RESTART_POLICIES:
        raise bad(f"restart_policy={spec.restart_policy!r}", f"use one of {RESTART_POLICIES}")
    if spec.clean_pod_policy not in CLEAN_POD_POLICIES:
        raise bad(f"clean_pod_policy={spec.clean_pod_policy!r}", f"use one of {CLEAN_POD_POLICIES}")
    if spec.backoff_limit < 0:
        raise bad(f"backoff_limit={spec.backoff_limit}", "use 0 or more")
    for key in ("active_deadline_seconds", "ttl_seconds_after_finished"):
        value = getattr(spec, key)
        if value is not None and value < (1 if key == "active_deadline_seconds" else 0):
            raise bad(f"{key}={value}", "use a positive number of seconds, or None")
    for key, value in {**spec.labels, "run_id": spec.run_id}.items():
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            raise bad(f"label {key}={value!r} is invalid", "use <= 63 of [A-Za-z0-9-_.]")
    selector = spec.node_selector
    if not isinstance(selector, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in selector.items()
    ):
        raise bad(f"node_selector {selector!r}", 'use an object of strings, {"pool": "gpu"}')
    for toleration in spec.tolerations:  # Kubernetes' Toleration: key, operator, value, ...
        if not isinstance(toleration, Mapping) or not set(toleration) <= _TOLERATION_FIELDS:
            raise bad(
                f"toleration {toleration!r}",
                f"use objects with the fields {', '.join(sorted(_TOLERATION_FIELDS))}",
            )
    if spec.owner is not None and not (spec.owner.name and spec.owner.uid):
        raise bad("owner has an empty name or uid", "pass the pod's metadata.name and metadata.uid")


@dataclass(frozen=True)
class LaunchResult:
    """What a finished, successful job reports, whichever launcher ran it."""

    launcher: str  # "local" or "tfjob"
    job_name: str  # JobSpec.name
    workers: int  # worker replicas
    attempts: int  # times the worker group was started (1 + restarts)
    restarts: int  # group restarts after retryable exits
    wall_seconds: float  # from the first start to success
    gpu_hours: float  # workers * gpus_per_worker * wall_seconds / 3600 (0 locally)
    image_digests: Mapping[str, str] = field(default_factory=dict)  # pod -> observed sha256 digest
    reattached: bool = False  # the launcher found the job already running (a retried launcher)


METRICS_FLAG = "--metrics-port"  # the trainer's flag (trainer/task.py) for its /metrics port
METRICS_PORT = 9090  # the port TFJob trainers serve /metrics on (prometheus-client's server)


class LaunchError(RuntimeError):
    """The job failed. The message names the reason, the failing worker, its exit code and log."""

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        job_name: str = "",
        replica: str | None = None,
        exit_code: int | None = None,
        log_tail: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.reason = reason  # operator condition reason, or the launcher's own (see subclasses)
        self.job_name = job_name
        self.replica = replica  # e.g. "worker-1", when known
        self.exit_code = exit_code  # the failing container's exit code, when known
        self.log_tail = tuple(log_tail)  # last lines of the failing worker's log


class WorkerInputError(LaunchError, UserError):
    """A worker stopped on a mistake in its input (a bad config, damaged Examples) and said
    which in one `error: ...` line (exit code 2): the message is that one line, so the train
    step prints it as a user error, with no traceback."""


# The trainer's exit code for a mistake in its input (docs/training.md), which it explains in
# one line on stderr starting with USER_ERROR_PREFIX: that line becomes the job's error.
USER_ERROR_EXIT = 2
USER_ERROR_PREFIX = "error: "


def user_error_line(tail: Sequence[str]) -> str:
    """The last one-line user error (`error: ...`) in a worker's log tail, without the prefix."""
    for line in reversed(tail):
        if line.startswith(USER_ERROR_PREFIX):
            return line.removeprefix(USER_ERROR_PREFIX).strip()
    return ""


def input_error(
    spec: JobSpec, what: str, replica: str | None, exit_code: int | None, tail: Sequence[str]
) -> WorkerInputError | None:
    """The error for a worker that exited 2 having named its bad input; None otherwise.

    `what` names the job as the launcher does ("job <name>", "TFJob <namespace>/<name>").
    """
    told = user_error_line(tail) if exit_code == USER_ERROR_EXIT else ""
    if not told:
        return None
    return WorkerInputError(
        f"{what} failed: {replica or 'a worker'} exited with code 2: {told}",
        reason="WorkerInputError",
        job_name=spec.name,
        replica=replica,
        exit_code=exit_code,
        log_tail=tail,
    )


class LaunchTimeout(LaunchError):
    """The job ran past its deadline; the launcher stopped it."""


class LaunchCancelled(LaunchError):
    """The launcher was told to stop (SIGTERM: a cancelled run); it stopped the job."""


def format_failure(
    head: str,
    replica: str | None,
    exit_code: int | None,
    tail: Sequence[str],
    *,
    tail_of: str | None = None,
) -> str:
    """One message for a failed job: what happened, which worker, its exit code and last lines
    (the failing worker's, else worker 0's; `tail_of` says whose when it is not the former)."""
    parts = [head]
    if replica is not None:
        parts.append(f"failing replica: {replica}, exit code: {exit_code}")
    if tail:
        parts.append(f"last {len(tail)} log lines of {tail_of or replica or 'worker-0'}:")
        parts.extend(f"  | {line}" for line in tail)
    return "\n".join(parts)


@contextlib.contextmanager
def cancel_on_sigterm() -> Iterator[None]:
    """Turn the first SIGTERM (or SIGHUP) into `LaunchCancelled` in the main thread while the
    block runs.

    Kubernetes stops a cancelled KFP run's pod with SIGTERM, then SIGKILL after the grace period;
    the exception gives the launcher that time to stop its workers or delete its TFJob. A closed
    terminal sends a local run's whole process group SIGHUP, which would otherwise kill the
    launcher and orphan its workers (each in a session of its own). Later signals are ignored
    so that cleanup is not interrupted; a SIGHUP already ignored (`nohup`) stays ignored.
    Outside the main thread (where Python cannot install handlers) this does nothing.
    """
    fired = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal fired
        if fired:
            return
        fired = True
        raise LaunchCancelled(
            f"received {signal.Signals(signum).name}: the run was cancelled", reason="Cancelled"
        )

    signals = [signal.SIGTERM] + ([] if ignored(signal.SIGHUP) else [signal.SIGHUP])
    with signal_handlers(dict.fromkeys(signals, handler)):
        yield


class Launcher(Protocol):
    """Runs a `JobSpec` to the end: local worker processes or a TFJob, same semantics."""

    def run(self, spec: JobSpec, *, timeout_seconds: float | None = None) -> LaunchResult:
        """Run `spec` to success and report it; raise `LaunchError` (or a subclass) if it fails.

        `timeout_seconds` is the launcher's own limit on top of `spec.active_deadline_seconds`.
        """
        ...
