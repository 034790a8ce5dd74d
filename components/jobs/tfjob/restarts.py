"""Restarts of a TFJob's worker group, counted from its pods and kept on the TFJob itself.

The operator recreates pods one by one (`restartPolicy: ExitCode`) and sets a `Restarting`
condition per failure it handles, so its conditions count failed pods, not restarts of the job:
one preemption of an N-worker job fails up to N pods, in any order, and a replacement started
while the old workers still lived can fail once more when they go. Under MultiWorkerMirrored no
worker outlives the group it belonged to (a worker that loses a peer exits 143, see
docs/training.md), so a restart of the job is complete when every worker index has a new pod.
The ledger therefore counts, per index, how often its pod was replaced (a new uid at that
index), and the job's restarts are the smallest of these counts.

The ledger travels in two annotations on the TFJob, so a launcher that re-attaches (a retried
train step) continues the count: `gptpipe.dev/restarts` (the number, for people and kubectl)
and `gptpipe.dev/worker-pods` (per index: the pod uid last seen and its replacement count).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from components.jobs.tfjob.manifest import LABEL_REPLICA_INDEX

RESTARTS_ANNOTATION = "gptpipe.dev/restarts"
PODS_ANNOTATION = "gptpipe.dev/worker-pods"


class RestartLedger:
    """Per worker index: the pod uid last seen and how many times that index's pod was replaced."""

    def __init__(self, workers: int, seen: Mapping[int, tuple[str, int]] | None = None) -> None:
        self.workers = workers
        self.seen: dict[int, tuple[str, int]] = dict(seen or {})

    @classmethod
    def from_annotations(cls, workers: int, annotations: Mapping[str, str]) -> RestartLedger:
        """The ledger a previous launcher left on the job (an empty one if none or unreadable)."""
        try:
            restarts = int(annotations.get(RESTARTS_ANNOTATION, "0"))
            pods = json.loads(annotations.get(PODS_ANNOTATION, "{}"))
            seen = {int(i): (str(uid), int(n)) for i, (uid, n) in pods.items()}
        except (ValueError, TypeError):
            return cls(workers)
        for index in range(workers):  # an index the annotation lacks: replaced `restarts` times
            seen.setdefault(index, ("", restarts))
        return cls(workers, seen)

    @property
    def restarts(self) -> int:
        """Restarts of the whole group: the fewest replacements of any worker index."""
        return min((self.seen.get(i, ("", 0))[1] for i in range(self.workers)), default=0)

    def observe(self, pods: Iterable[Mapping[str, Any]]) -> bool:
        """Take the job's current pods in; True if the ledger changed (a new pod was seen)."""
        changed = False
        for pod in pods:
            meta = pod.get("metadata") or {}
            index = (meta.get("labels") or {}).get(LABEL_REPLICA_INDEX)
            uid = meta.get("uid", "")
            if index is None or not index.isdigit() or not uid:
                continue
            last_uid, replaced = self.seen.get(int(index), ("", 0))
            if uid == last_uid:
                continue
            self.seen[int(index)] = (uid, replaced + 1 if last_uid else replaced)
            changed = True
        return changed

    def annotations(self) -> dict[str, str]:
        """The ledger as the TFJob's annotations (a merge patch of metadata.annotations)."""
        pods = {str(i): [uid, n] for i, (uid, n) in sorted(self.seen.items())}
        return {
            RESTARTS_ANNOTATION: str(self.restarts),
            PODS_ANNOTATION: json.dumps(pods, separators=(",", ":")),
        }
