"""Where a step ran: its image (as referenced and as the kubelet pulled it) and code version.

The component entry point reads the environment once (`detect(image, os.environ)`) and passes
the result to the lineage layer as execution properties. Nothing here talks to ML Metadata.

- `image`: the reference the step was compiled with (`repo@sha256:...` from the digest lock),
  or LOCAL_IMAGE when kfp.local runs the step in this Python environment.
- `image_digest`: the `sha256:...` part of that reference; a reference without one records
  `unpinned: 1` instead.
- In a KFP pod (its name and namespace from `components.jobs.kube.pod_identity`), the pod's own
  `status.containerStatuses[].imageID` is read through the Kubernetes API: the digest the kubelet
  actually ran. A different digest is recorded (`image_digest_observed`,
  `image_digest_mismatch: 1`) and warned about; it means the lock and the cluster disagree.
- `code_version`: the git commit baked into the image (env CODE_VERSION_ENV, also the OCI label
  org.opencontainers.image.revision), else `git rev-parse HEAD` of this checkout (with
  "-dirty" when tracked files differ from it), else "unknown".
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.jobs import kube
from contracts.errors import UserError

LOCAL_IMAGE = "local-python-environment"  # kfp.local's SubprocessRunner: no image is pulled
CODE_VERSION_ENV = "GPTPIPE_CODE_VERSION"  # set by images/Dockerfile from the REVISION arg
RUN_ID_ENV = "KFP_RUN_ID"  # the pod label pipeline/runid (pipelines/pipeline.py), or the runner's
RUN_ID_LABEL = "metadata.labels['pipeline/runid']"  # where KFP puts the run's UUID on each pod
KFP_MAIN_CONTAINER = "main"  # the container KFP v2 runs a component in
UNKNOWN = "unknown"
REPO_DIR = Path(__file__).resolve().parent.parent

_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")


def run_id(env: Mapping[str, str]) -> str:
    """The pipeline run's id, from the environment the runner or the pod label provides.

    It is not a component input: a per-run input would put the run into every task's KFP cache
    key, and some KFP backends leave `{{$.pipeline_job_uuid}}` unresolved in arguments.
    """
    value = env.get(RUN_ID_ENV, "")
    if not value or "{{" in value:
        raise UserError(
            f"{RUN_ID_ENV} is not set to a run id ({value!r}): run the pipeline through KFP, "
            "which sets it from the pod label pipeline/runid, or through `gptpipe run --local`"
        )
    return value


@dataclass(frozen=True)
class Provenance:
    """What a step ran on, as lineage records it."""

    image: str  # the image reference as run (LOCAL_IMAGE locally)
    code_version: str  # git commit, "<commit>-dirty", or "unknown"
    image_digest_observed: str = ""  # sha256:... the pod really runs; "" outside a cluster
    observe_error: str = ""  # why the pod's imageID could not be read, if it could not

    @property
    def image_digest(self) -> str:
        """The digest pinned in the reference, or ""."""
        return digest_of(self.image)

    @property
    def mismatch(self) -> bool:
        """True when the pod runs a different image than the one the pipeline pinned."""
        return bool(self.image_digest_observed) and self.image_digest_observed != self.image_digest

    def properties(self) -> dict[str, Any]:
        """Execution properties: always image and code_version, the rest only when they apply."""
        props: dict[str, Any] = {"image": self.image, "code_version": self.code_version}
        if self.image_digest:
            props["image_digest"] = self.image_digest
        else:
            props["unpinned"] = 1
        if self.image_digest_observed:
            props["image_digest_observed"] = self.image_digest_observed
            props["image_digest_mismatch"] = int(self.mismatch)
        if self.observe_error:
            props["image_digest_observe_error"] = self.observe_error
        return props


def digest_of(reference: str) -> str:
    """The `sha256:<64 hex>` an image reference or a kubelet imageID ends with, or ""."""
    _, at, digest = reference.rpartition("@")
    if not at:
        digest = reference.rsplit("://", 1)[-1]  # a bare imageID such as "sha256:..."
    return digest if _DIGEST_RE.fullmatch(digest) else ""


def is_pinned(reference: str) -> bool:
    """True when an image reference names its content by digest (`repo@sha256:...`)."""
    return "@" in reference and bool(digest_of(reference))


def code_version(env: Mapping[str, str], repo_dir: Path = REPO_DIR) -> str:
    """The git commit of the running code: baked into the image, else this checkout's HEAD."""
    baked = env.get(CODE_VERSION_ENV, "").strip()
    if baked:
        return baked
    try:
        head = _git(repo_dir, "rev-parse", "HEAD")
        dirty = _git(repo_dir, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return UNKNOWN
    return f"{head}-dirty" if dirty else head


def _git(repo_dir: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo_dir), *args], capture_output=True, text=True, check=True, timeout=30
    )
    return done.stdout.strip()


def pod_image_digest(pod: Mapping[str, Any], container: str = KFP_MAIN_CONTAINER) -> str:
    """The digest in a pod's status for `container` (its imageID), or "" if not reported yet."""
    return digest_of(kube.container_image_ids(pod).get(container, ""))


def detect(
    image: str,
    env: Mapping[str, str],
    *,
    namespace_file: str = kube.SERVICE_ACCOUNT_NAMESPACE,
    api_client: Any = None,
    repo_dir: Path = REPO_DIR,
    warn: Callable[[str], None] | None = None,
    pod: kube.PodIdentity | None = None,
) -> Provenance:
    """Provenance of the running step; in a KFP pod, also the digest the kubelet really pulled.

    `api_client` defaults to the in-cluster one; `pod` to the identity read from `env` and
    `namespace_file`. A failure to read the pod is recorded, not raised: lineage must never
    fail a step that did its work.
    """
    found = Provenance(image=image, code_version=code_version(env, repo_dir))
    pod = pod or kube.pod_identity(env, namespace_file)
    if not (pod.name and pod.namespace):
        return found
    try:
        if api_client is None:
            api_client = kube.default_api_client()
        observed = pod_image_digest(kube.read_pod(api_client, pod.namespace, pod.name))
    except Exception as err:  # noqa: BLE001 -- any API failure is recorded the same way
        return Provenance(image, found.code_version, observe_error=f"{type(err).__name__}: {err}")
    found = Provenance(image, found.code_version, image_digest_observed=observed)
    if found.mismatch:
        (warn or _stderr)(
            f"warning: pod {pod.namespace}/{pod.name} runs {observed}, but the pipeline pinned "
            f"{image!r}: the digest lock and the cluster disagree; lineage records both"
        )
    return found


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)
