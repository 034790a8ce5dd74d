"""What every pod gptpipe launches shares: the "restricted" Pod Security settings, no API
token, an image pinned by digest, and its labels. The TFJob manifest (tfjob/manifest.py) and
the Indexed Job manifest (indexed/manifest.py) build their pods from it.

Every pod meets the "restricted" Pod Security Standard (runs as the image's uid 1000, no
privilege escalation, no capabilities, the runtime's seccomp profile), so a job runs in a
namespace that enforces it. The programs in them never call the Kubernetes API, and the step's
service account holds the launcher's Role: no token is mounted (Workload Identity, IRSA and
Azure WI get cloud credentials from the metadata server or their own projected token instead).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from components.jobs.naming import LABEL_MANAGED_BY, LABEL_RUN_ID
from contracts.errors import UserError

IMAGE_UID = 1000  # images/Dockerfile: USER 1000:1000
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def job_labels(run_id: str, extra: Mapping[str, str]) -> dict[str, str]:
    """The labels of a job and its pods: managed by gptpipe, its run's id, `extra`."""
    labels = {LABEL_MANAGED_BY: "gptpipe", **extra}
    if run_id:
        labels[LABEL_RUN_ID] = run_id
    return labels


def container_security() -> dict[str, Any]:
    """A container's securityContext under "restricted" (the pod's says who it runs as)."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def pod_security() -> dict[str, Any]:
    """The pod's securityContext under "restricted": the image's non-root uid."""
    return {
        "runAsNonRoot": True,
        "runAsUser": IMAGE_UID,
        "runAsGroup": IMAGE_UID,
        "fsGroup": IMAGE_UID,  # volumes (a PVC work folder) writable by the program
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def check_pinned(kind: str, image: str, allow_unpinned: bool) -> None:
    """Refuse an empty image, or one not pinned by digest unless `allow_unpinned`: a tag can
    move between two pods' starts, and the run's lineage must name the bytes that ran."""
    if not image:
        raise UserError(f"{kind} image is empty: a job on a cluster needs a container image")
    if not (_DIGEST.search(image) or allow_unpinned):
        raise UserError(
            f"{kind} image {image!r} is not pinned by digest: "
            "use repo/name@sha256:<64 hex> (or allow_unpinned=True outside pipeline runs)"
        )
