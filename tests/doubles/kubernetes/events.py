"""client-go's event recorder (k8s.io/client-go/tools/record), as the Training Operator uses it.

The operator records events on a TFJob through a controller-runtime recorder
(tensorflow/tfjob_controller.go `mgr.GetEventRecorderFor("tfjob-controller")`), which is
client-go's broadcaster with its default EventCorrelator. Played here, from the source:
- the Event an `Eventf` makes (tools/record/event.go `makeEvent`, then `generateEvent` sets
  `Source`, `ReportingController` from its component and `ReportingInstance` from its host,
  empty here): named `<object name>.<creation time in ns, hex>`, in the object's namespace,
  involvedObject the object's reference (tools/reference `GetReference`: kind, namespace,
  name, uid, apiVersion, resourceVersion), count 1, first and last timestamp now;
- the correlator (tools/record/events_cache.go `EventCorrelate`), in its order:
  - the aggregator (`EventAggregate`, keyed by `EventAggregatorByReasonFunc`): once 10
    distinct messages of one reason about one object came within 10 minutes, each further
    one becomes an event with the message "(combined from similar events): <message>";
  - the logger (`eventObserve`, keyed by `getEventKey`): an event seen before is the same
    Event object again, its count one more and its lastTimestamp now (a PATCH);
  - the spam filter (`EventSourceObjectSpamFilter`, keyed by `getSpamKey`: source and
    object): a token bucket per object, 25 at first, one more every 300 s; an event that
    finds the bucket empty is dropped.
The store keeps Events as the apiserver would (Cluster.kube_events); apiserver.py lists them
by fieldSelector (store.py `event_fields`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tests.doubles.kubernetes.store import Cluster, now

SPAM_BURST = 25  # defaultSpamBurst
SPAM_QPS = 1.0 / 300.0  # defaultSpamQPS
AGGREGATE_MAX_EVENTS = 10  # defaultAggregateMaxEvents
AGGREGATE_INTERVAL_SECONDS = 600  # defaultAggregateIntervalInSeconds
COMBINED = "(combined from similar events): "  # EventAggregatorByReasonMessageFunc


@dataclass
class _Bucket:
    """flowcontrol's token bucket: `tokens` at `at` (monotonic seconds)."""

    tokens: float = SPAM_BURST
    at: float = field(default_factory=time.monotonic)

    def try_accept(self) -> bool:
        clock = time.monotonic()
        self.tokens = min(SPAM_BURST, self.tokens + (clock - self.at) * SPAM_QPS)
        self.at = clock
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


@dataclass
class _Aggregate:
    messages: set[str] = field(default_factory=set)
    last: float = 0.0


@dataclass
class _Logged:
    """The logger's `eventLog`: what it last made of an event key, sent or filtered."""

    name: str
    count: int
    first: str


class EventRecorder:
    """One component's recorder; `event` is its Eventf. Callers hold `cluster.cond`."""

    def __init__(self, cluster: Cluster, component: str) -> None:
        self.cluster = cluster
        self.component = component
        self._aggregates: dict[tuple[Any, ...], _Aggregate] = {}
        self._logged: dict[tuple[Any, ...], _Logged] = {}  # event key -> its eventLog
        self._buckets: dict[tuple[Any, ...], _Bucket] = {}

    def event(self, obj: dict[str, Any], kind: str, type_: str, reason: str, message: str) -> None:
        """Record an event about `obj` (of `kind`, e.g. "TFJob"), e.g. ("Normal",
        "ExitedWithCode", "Pod: ml.train-worker-1 exited with code 137")."""
        meta = obj["metadata"]
        ref = {
            "kind": kind,
            "namespace": meta["namespace"],
            "name": meta["name"],
            "uid": meta["uid"],
            "apiVersion": obj.get("apiVersion", ""),
            "resourceVersion": meta.get("resourceVersion", ""),
        }
        identity = (self.component, kind, ref["namespace"], ref["name"], ref["uid"])
        message, key = self._aggregate(identity, type_, reason, message)
        stored = self._observe(key, ref, type_, reason, message)
        if not self._buckets.setdefault(identity, _Bucket()).try_accept():
            return  # the spam filter, applied after the logger counted it
        self.cluster.rv += 1
        stored["metadata"]["resourceVersion"] = str(self.cluster.rv)
        self.cluster.kube_events[(ref["namespace"], stored["metadata"]["name"])] = stored
        self.cluster.cond.notify_all()

    def _aggregate(
        self, identity: tuple[Any, ...], type_: str, reason: str, message: str
    ) -> tuple[str, tuple[Any, ...]]:
        """EventAggregate: the message to record and the key the logger counts it under."""
        group = (*identity, type_, reason)
        clock = time.monotonic()
        record = self._aggregates.get(group)
        if record is None or clock - record.last > AGGREGATE_INTERVAL_SECONDS:
            record = self._aggregates[group] = _Aggregate()
        record.messages.add(message)
        record.last = clock
        if len(record.messages) < AGGREGATE_MAX_EVENTS:
            return message, (*group, message)
        record.messages.pop()  # "do not grow our local key set any larger than max"
        return COMBINED + message, group

    def _observe(
        self, key: tuple[Any, ...], ref: dict[str, str], type_: str, reason: str, message: str
    ) -> dict[str, Any]:
        """eventObserve: a new Event, or the one logged under `key` (the same name and first
        timestamp) counted once more. The count goes on even for events the filter drops."""
        stamp = now()
        logged = self._logged.get(key)
        if logged is None:
            logged = _Logged(f"{ref['name']}.{time.time_ns():x}", 0, stamp)
            self._logged[key] = logged
        logged.count += 1
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": logged.name, "namespace": ref["namespace"]},
            "involvedObject": ref,
            "reason": reason,
            "message": message,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": "",
            "firstTimestamp": logged.first,
            "lastTimestamp": stamp,
            "count": logged.count,
            "type": type_,
        }
