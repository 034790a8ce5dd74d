"""Names of a training job and its labels: deterministic job names and run-id label values
(Kubernetes' own rules for names are in contracts/k8s_values.py).

A retried launcher must find the job its previous attempt created, and the exit handler must
find every job of a run, so both names are computed here, from the ids alone.
"""

from __future__ import annotations

import hashlib
import re

# A TFJob's Services are named `<job>-worker-<i>`, a DNS-1035 label of at most 63 characters,
# so the job name leaves room for "-worker-" and three digits.
MAX_JOB_NAME = 52
LABEL_RUN_ID = "gptpipe.dev/run-id"  # on every job and pod of a run: run_label(run_id)
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"  # "gptpipe" on every job and pod


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
