"""Each step's run parameters: one frozen dataclass per step, one field per knob.

A field here is the knob's one home: its comment, default and check. The CLI resolves each
object once (defaults, then `--param <object>.<field>=VALUE`), the pipeline carries it as one
JSON parameter named after the object (as `config` carries the trainer config), and the step's
component, the job it launches, lineage and `gptpipe reproduce` read the same object back with
`from_dict`. An error names the field as `<object>.<field>`, the way it is set.

TensorFlow- and KFP-free: the CLI imports it cheaply, and so does every step.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from contracts import records
from contracts.errors import UserError
from contracts.k8s_values import QUANTITY, TOLERATION_FIELDS, is_object_name

P = TypeVar("P", bound="StepParams")
DAY_SECONDS = 24 * 3600
LAUNCHERS = ("tfjob", "local")  # how training runs: a TFJob on a cluster, processes here
# How tokenize's parts run: a batch/v1 Indexed Job on a cluster, processes here.
PART_LAUNCHERS = ("job", "local")
DEFAULT_JOB_PARTS = 16  # an Indexed Job's parallelism when tokenize.parts is 0
# The most local trainer workers a CPU takes. Each is a TensorFlow process with its own runtime
# (about half a GiB before any model) in one collective rendezvous; past one a CPU they only
# share the CPUs, every step waiting for the slowest, and hundreds never finish meeting. Two a
# CPU still runs the default two workers on one CPU, and a multi-worker run on a laptop.
LOCAL_WORKERS_PER_CPU = 2


class StepParams:
    """What every step's parameter object shares: its pipeline parameter's name, JSON, checks."""

    NAME: ClassVar[str]  # the pipeline parameter that carries it, and the prefix of its errors

    def to_dict(self) -> dict[str, Any]:
        """The JSON object the pipeline carries."""
        return records.to_dict(self)

    @classmethod
    def from_dict(cls: type[P], data: object) -> P:
        """Read back what `to_dict` wrote (a step, lineage, a compiled default); strict."""
        return records.from_dict(cls, data, cls.NAME)

    def bad(self, name: str, fix: str) -> UserError:
        """The one-line error for field `name`: its full name, its value and the fix."""
        value = getattr(self, name)
        shown = value if isinstance(value, int | float) else repr(value)
        return UserError(f"{self.NAME}.{name}={shown}: {fix}")


@dataclass(frozen=True)
class TokenizeParams(StepParams):
    """How tokenize turns the corpus into Examples (part of the dataset version)."""

    NAME: ClassVar[str] = "tokenize"

    eval_fraction: float = 0.1  # share of the corpus held out for evaluation, in (0, 0.5]
    # The eval split's size cap, in bytes of document text (it wins over eval_fraction), so a
    # TB corpus gets an eval set evaluate scores in minutes; 0: no cap.
    eval_max_bytes: int = 100_000_000
    text_field: str = "text"  # the string of a JSONL object or Parquet column that is a document
    tokenizer: str = ""  # a SentencePiece model (file or gs://) to reuse; "" trains one
    # Where the parts that read and encode the corpus run: PART_LAUNCHERS (the dataset is the
    # same, byte for byte, whichever and however many).
    launcher: str = "job"
    parts: int = 0  # parts that run at once; 0: one per CPU here, DEFAULT_JOB_PARTS as a Job
    # Sources are grouped, in order, into units of at least this many listed bytes: the grain
    # of the parts' work and of resuming it (part of the dataset version: windows never cross
    # a unit's end).
    unit_bytes: int = 64 << 20
    cpu: str = "2"  # CPU of each part's pod on a cluster, request and limit (a quantity)
    memory: str = "4Gi"  # memory of each part's pod on a cluster, request and limit

    def __post_init__(self) -> None:
        if not 0.0 < self.eval_fraction <= 0.5:
            raise self.bad("eval_fraction", "use a share in (0, 0.5]; 0.1 is usual")
        if self.eval_max_bytes < 0:
            raise self.bad("eval_max_bytes", "use a size in bytes, or 0 for no cap")
        if not self.text_field:
            raise self.bad("text_field", "name the JSONL field or Parquet column, e.g. text")
        if self.launcher not in PART_LAUNCHERS:
            raise self.bad("launcher", f"use one of {', '.join(PART_LAUNCHERS)}")
        if self.parts < 0:
            raise self.bad("parts", "use 0 (automatic) or more")
        if self.unit_bytes < 1:
            raise self.bad("unit_bytes", "use a positive size in bytes; 67108864 is usual")
        for name in ("cpu", "memory"):
            if not QUANTITY.match(getattr(self, name)):
                raise self.bad(name, "use a Kubernetes quantity, e.g. '2', '500m', '4Gi'")


@dataclass(frozen=True)
class TrainJob(StepParams):
    """Where and on what the trainer workers run; the model and its training are the config's.

    The fields it shares with `components.jobs` `JobSpec` have JobSpec's names, and fill it.
    """

    NAME: ClassVar[str] = "train_job"

    launcher: str = "tfjob"  # one of LAUNCHERS
    workers: int = 2  # MultiWorkerMirroredStrategy workers (TFJob Worker replicas)
    gpus_per_worker: int = 1  # nvidia.com/gpu of each worker on a cluster; 0 locally
    cpu: str = "4"  # CPU of each TFJob worker, request and limit (a Kubernetes quantity)
    memory: str = "16Gi"  # memory of each TFJob worker, request and limit (a quantity)
    service_account: str = ""  # the workers' service account; "": the train step's own
    backoff_limit: int = 3  # restarts of the worker group allowed after retryable exits
    # Training fails, and its TFJob is deleted, after this (runPolicy.activeDeadlineSeconds, so
    # the operator enforces it even when the launcher is gone); 0: no deadline.
    deadline_seconds: int = DAY_SECONDS
    node_selector: Mapping[str, str] = field(default_factory=dict)  # the workers' nodeSelector
    tolerations: Sequence[Mapping[str, Any]] = ()  # the workers' tolerations (Kubernetes JSON)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tolerations", tuple(self.tolerations))
        if self.launcher not in LAUNCHERS:
            raise self.bad("launcher", f"use one of {', '.join(LAUNCHERS)}")
        for name in ("workers", "gpus_per_worker", "backoff_limit", "deadline_seconds"):
            least = 1 if name == "workers" else 0
            if getattr(self, name) < least:
                raise self.bad(name, f"use {least} or more")
        for name in ("cpu", "memory"):
            if not QUANTITY.match(getattr(self, name)):
                raise self.bad(name, "use a Kubernetes quantity, e.g. '4', '500m', '16Gi'")
        if self.service_account and not is_object_name(self.service_account):
            raise self.bad("service_account", "use a Kubernetes object name (DNS-1123)")
        self._check_placement()

    def check_local(self, cpus: int) -> None:
        """Refuse, for a `local` launcher on a machine of `cpus` CPUs, more worker processes
        than it can run (LOCAL_WORKERS_PER_CPU a CPU). A TFJob's workers are pods, bounded by
        the cluster's nodes, and not checked here."""
        most = LOCAL_WORKERS_PER_CPU * max(1, cpus)
        if self.launcher == "local" and self.workers > most:
            raise self.bad(
                "workers",
                f"this machine runs at most {most} local workers ({LOCAL_WORKERS_PER_CPU} for "
                f"each of its {cpus} CPUs); pass --workers {most} or fewer",
            )

    def _check_placement(self) -> None:
        selector = self.node_selector
        if not isinstance(selector, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in selector.items()
        ):
            raise self.bad("node_selector", 'use an object of strings, {"pool": "gpu"}')
        for toleration in self.tolerations:  # Kubernetes' Toleration: key, operator, value...
            if not isinstance(toleration, Mapping) or not set(toleration) <= TOLERATION_FIELDS:
                fields = ", ".join(sorted(TOLERATION_FIELDS))
                raise self.bad("tolerations", f"use objects with the fields {fields}")

    def job_fields(self) -> dict[str, Any]:
        """The `JobSpec` fields this fills: every field it shares with it, by the same name,
        and the deadline as JobSpec keeps it (None for none)."""
        return {
            "workers": self.workers,
            "gpus_per_worker": self.gpus_per_worker,
            "cpu": self.cpu,
            "memory": self.memory,
            "backoff_limit": self.backoff_limit,
            "active_deadline_seconds": self.deadline_seconds or None,
            "node_selector": dict(self.node_selector),
            "tolerations": tuple(self.tolerations),
        }


@dataclass(frozen=True)
class EvalPolicy(StepParams):
    """When evaluate blesses a candidate (docs: README, "When is a model blessed?")."""

    NAME: ClassVar[str] = "eval_policy"

    # The highest eval loss, in nats per character (tokenizer-independent), that is blessed.
    max_nats_per_char: float = 2.2
    # A candidate may be this much (a fraction) worse than the model in service and be blessed.
    tolerance: float = 0.01

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_nats_per_char) and self.max_nats_per_char > 0):
            raise self.bad(
                "max_nats_per_char",
                "the blessing threshold is a positive, finite loss in nats per character; "
                "pass one such as 2.2",
            )
        if not (math.isfinite(self.tolerance) and 0 <= self.tolerance <= 1):
            raise self.bad(
                "tolerance",
                "the regression allowed against the baseline is a fraction in [0, 1]; "
                "pass one such as 0.01 (1%)",
            )


STEP_PARAMS: tuple[type[StepParams], ...] = (TokenizeParams, TrainJob, EvalPolicy)


def params_class(name: str) -> type[StepParams] | None:
    """The step parameter class carried by the pipeline parameter `name`, if one is."""
    return next((cls for cls in STEP_PARAMS if name == cls.NAME), None)


def override(params: P, key: str, value: Any) -> P:
    """`params` with field `key` set to `value` (a JSON value), checked as `from_dict` checks."""
    known = [f.name for f in dataclasses.fields(params)]  # type: ignore[arg-type]
    if key not in known:
        raise records.unknown_key(params.NAME, key, known)
    return type(params).from_dict({**params.to_dict(), key: value})


def field_value(cls: type[StepParams], key: str, text: str) -> Any:
    """A field's value from its text on a command line: for a str field the text itself
    (`train_job.cpu=8` is "8") or the content of a quoted JSON string; for the others its JSON
    when it parses, else the text, which `override` then refuses by name."""
    try:
        decoded = json.loads(text)
    except ValueError:
        return text
    if typing.get_type_hints(cls).get(key) is str and not isinstance(decoded, str):
        return text
    return decoded


def apply_overrides(
    current: Mapping[str, StepParams], items: Sequence[str]
) -> dict[str, StepParams]:
    """`current` (objects by their NAME) with each `<object>.<field>=VALUE` of `items` set."""
    found = dict(current)
    for item in items:
        key, sep, text = item.partition("=")
        name, _, field_name = key.strip().partition(".")
        if not sep or not field_name:
            raise UserError(f"--param {item!r} is not OBJECT.FIELD=VALUE, e.g. train_job.workers=1")
        if name not in found:
            close = difflib.get_close_matches(name, list(found), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise UserError(
                f"--param {item!r}: no step's parameters are called {name!r}{hint}; "
                f"they are {', '.join(found)}"
            )
        cls = type(found[name])
        found[name] = override(found[name], field_name, field_value(cls, field_name, text))
    return found
