"""The step pods against Pod Security "restricted", as KFP's backend builds them.

The pipeline cannot set a step pod's securityContext itself: kfp-kubernetes 1.5 (the newest
that installs beside kfp 2.13) has no API for it. KFP's backend does it: from 2.16 its Argo
compiler gives every executor pod a RuntimeDefault seccomp profile and its user container
`allowPrivilegeEscalation: false` and `capabilities.drop: [ALL]`, and applies the admin's
`defaultRunAsNonRoot`/`defaultRunAsUser` to it (kubeflow/pipelines 2.16.0,
backend/src/v2/compiler/argocompiler/security_context.go, applySecurityContextToExecutorTemplate;
the volumes from container.go). What gptpipe owns is an image that runs as a numeric non-root
user, so such a pod is admitted and the kubelet can verify runAsNonRoot.
"""

from pathlib import Path

import yaml

from pipelines import compiler
from pipelines.pipeline import Target
from tests.doubles.kubernetes.pod_security import restricted_violations
from trainer.config import DEFAULT_PRESET, resolve_config

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "tests" / "data" / "digests.json"
# The emptyDir volumes KFP 2.16's container.go mounts into every executor pod.
KFP_VOLUMES = ("kfp-launcher", "gcs-scratch", "s3-scratch", "minio-scratch", "dot-local-scratch")
IMAGE_UID = 1000  # images/Dockerfile: USER 1000:1000


def executor_pod(image: str, command: list[str], run_as_non_root: bool | None) -> dict:
    """An executor pod as KFP 2.16's Argo compiler builds it (only the fields PSS reads)."""
    user_sc: dict = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if run_as_non_root is not None:  # the admin's defaultRunAsNonRoot / defaultRunAsUser
        user_sc |= {"runAsNonRoot": run_as_non_root, "runAsUser": IMAGE_UID}
    launcher_sc = {**user_sc, "runAsNonRoot": True}
    return {
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": [{"name": "kfp-launcher", "securityContext": launcher_sc}],
        "containers": [
            {"name": "main", "image": image, "command": command, "securityContext": user_sc}
        ],
        "volumes": [{"name": name, "emptyDir": {}} for name in KFP_VOLUMES],
    }


def test_every_step_pod_is_restricted_with_the_admins_non_root_default(tmp_path):
    target = Target(compiler.load_images(LOCK), pipeline_root="gs://b/root")
    path = compiler.compile_pipeline(tmp_path / "p.yaml", target, resolve_config(DEFAULT_PRESET))
    spec, _ = yaml.safe_load_all(path.read_text())
    executors = spec["deploymentSpec"]["executors"]
    for name, executor in executors.items():
        container = executor["container"]
        pod = executor_pod(container["image"], container["command"], run_as_non_root=True)
        assert restricted_violations(pod) == [], name
        # Without the admin default, only runAsNonRoot is missing: the image's user is not
        # something the admission controller can see.
        bare = restricted_violations(executor_pod(container["image"], [], None))
        assert bare and all(v.startswith("run_as_non_root") for v in bare), (name, bare)


def test_the_image_runs_as_a_numeric_non_root_user():
    users = [
        line.split()[1]
        for line in (REPO / "images" / "Dockerfile").read_text().splitlines()
        if line.startswith("USER ")
    ]
    # The kubelet can check runAsNonRoot only against a numeric USER.
    assert users and users[-1].split(":")[0] == str(IMAGE_UID)
