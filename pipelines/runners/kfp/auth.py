"""Which credential `gptpipe kfp` presents to the KFP API server, and how it names it in errors.

The order: an explicit `--token-file`; the file `$KF_PIPELINES_SA_TOKEN_PATH` names (the variable
kfp.Client's own `ServiceAccountTokenVolumeCredentials` reads); then, in a pod, KFP's projected
token (`kfp.client.KF_PIPELINES_SA_TOKEN_PATH`, audience `pipelines.kubeflow.org`, the one
KFP's TokenReview authenticator accepts) and last the pod's plain service-account token. With
none of them, no token is sent, which a single-user KFP behind a port-forward accepts.

The environment is read by the CLI and passed in; nothing here reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kfp.client import KF_PIPELINES_SA_TOKEN_ENV, KF_PIPELINES_SA_TOKEN_PATH
from kfp.client.set_volume_credentials import ServiceAccountTokenVolumeCredentials

from contracts.errors import UserError

TOKEN_PATH_ENV = KF_PIPELINES_SA_TOKEN_ENV  # "KF_PIPELINES_SA_TOKEN_PATH"
# In a pod: KFP's projected token first (a PodDefault mounts it), then the default token, whose
# audience is the Kubernetes API server: KFP 2.5 rejects it unless its TokenReview audience
# (TOKEN_REVIEW_AUDIENCE) was changed to match.
IN_CLUSTER_TOKENS: tuple[tuple[str, Path], ...] = (
    ("the pod's KFP token", Path(KF_PIPELINES_SA_TOKEN_PATH)),
    (
        "the pod's service-account token",
        Path("/var/run/secrets/kubernetes.io/serviceaccount/token"),
    ),
)


@dataclass(frozen=True)
class Credential:
    """A bearer token's source: where it was found, never its value."""

    source: str  # how it was chosen: "--token-file", "$KF_PIPELINES_SA_TOKEN_PATH", ...
    path: Path | None  # the token file; None when no token is sent

    def describe(self) -> str:
        """The credential as an error message names it."""
        if self.path is None:
            return f"a request with {self.source}"
        return f"the token from {self.source} ({self.path})"

    def kfp_credentials(self) -> ServiceAccountTokenVolumeCredentials | None:
        """kfp.Client's credentials object: it re-reads the file before every request.

        The kubelet rotates projected tokens (an hour by default), and `--wait` can follow a
        run for a day, so the token is never read once and kept.
        """
        if self.path is None:
            return None
        return ServiceAccountTokenVolumeCredentials(str(self.path))


def choose(
    token_file: Path | None,
    env_token_path: str,
    in_cluster: Sequence[tuple[str, Path]] = IN_CLUSTER_TOKENS,
) -> Credential:
    """Pick the credential: `--token-file`, then `$KF_PIPELINES_SA_TOKEN_PATH`, then in-cluster.

    A file named explicitly (by the option or the variable) must exist and hold a token; the
    in-cluster files are used only when present.
    """
    if token_file is not None:
        return _checked(Credential("--token-file", token_file))
    if env_token_path:
        return _checked(Credential(f"${TOKEN_PATH_ENV}", Path(env_token_path)))
    for source, path in in_cluster:
        if path.is_file():
            return _checked(Credential(source, path))
    return Credential(
        f"no token (no --token-file, ${TOKEN_PATH_ENV} unset, no in-cluster token file)", None
    )


def _checked(credential: Credential) -> Credential:
    path = credential.path
    assert path is not None
    try:
        token = path.read_text().strip()
    except OSError as err:
        raise UserError(
            f"cannot read the KFP token file {path} named by {credential.source}: "
            f"{err.strerror or err}; pass --token-file with a readable token"
        ) from None
    if not token:
        raise UserError(
            f"the KFP token file {path} named by {credential.source} is empty: "
            "write the token into it, or pass another --token-file"
        )
    return credential
