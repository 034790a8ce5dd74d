"""`gptpipe doctor`: will a run work on this cluster? One line per check, before any GPU is held.

    gptpipe doctor --host URL [--namespace NS] [--token-file F] --pipeline-root gs://B/P
        [--metadata HOST:PORT] [--param train_job.FIELD=VALUE ...] [--context KUBE_CONTEXT]

Checks (components/doctor/checks.py does the cluster's; this module the KFP API's and the
image lock's): the KFP API answers and takes the token; the namespace exists; the TFJob CRD
is served; the identity has every verb the steps use there; the pipeline root takes a write,
a read and a delete; the metadata service answers, at a version lineage supports; the GPU nodes
have room for the run's workers; the image lock holds real digests. Each prints ✔ (passed),
✘ (a blocker, with its fix) or – (not checkable from here, with why); the exit status is 1
when any blocker was found. The Kubernetes identity is the kube context's (`--context`, else
the current one); a run's steps use their pod's service account instead, which `--in-cluster`
checks from a pod (docs/operations.md, the first-day checklist).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from contracts.errors import UserError
from pipelines.cli.options import param_option

PLACEHOLDER_DIGEST = re.compile(r"@sha256:0{64}$")  # images/bases.json's before a pin


def add_parser(subparsers: Any) -> None:
    """Add `doctor` to the `gptpipe` command's subparsers."""
    p = subparsers.add_parser(
        "doctor", help="check that a run will work on this cluster, before it starts"
    )
    p.add_argument("--host", default=None, help="KFP API URL (default $KF_PIPELINES_ENDPOINT)")
    p.add_argument("--token-file", type=Path, default=None, help="KFP bearer token file")
    p.add_argument(
        "--namespace", default="", help="the run's namespace: the profile on a multi-user KFP"
    )
    p.add_argument("--pipeline-root", required=True, help="the runs' gs:// pipeline root, to probe")
    p.add_argument(
        "--metadata",
        default="",
        help="the metadata service, host:port (after `kubectl -n kubeflow port-forward "
        "svc/metadata-grpc-service 8080`); default: not checked from here",
    )
    p.add_argument("--context", default=None, help="kube context (default: the current one)")
    p.add_argument(
        "--service-account",
        default="",
        help="the steps' service account (default KFP's: default-editor in a profile "
        "namespace, pipeline-runner in kubeflow); train_job.service_account, the TFJob "
        "pods', is checked too where it names another",
    )
    p.add_argument(
        "--lock", type=Path, default=None, help="image digest lock (default images/digests.json)"
    )
    param_option(p, "a field of the run's train job, train_job.FIELD (the GPUs it will ask)")
    p.add_argument(
        "--in-cluster",
        action="store_true",
        help="make the cluster's checks from a one-step KFP run, as a step's own service "
        "account (its Workload Identity), not the kube context's",
    )
    p.add_argument(
        "--poll", type=float, default=5.0, help="--in-cluster: seconds between checks of the run"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=900.0,
        help="--in-cluster: seconds to wait for the run to end (default 900)",
    )
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    """Run every check, print one line each; 1 if any found a blocker."""
    from pipelines.runners.kfp import client

    if not args.pipeline_root.startswith("gs://"):
        raise UserError(
            f"--pipeline-root {args.pipeline_root!r} is not gs://: the steps and the TFJob "
            "workers share the root on GCS; pass gs://BUCKET/PATH"
        )
    train_job = _train_job(args.params)
    where = client.endpoint(args.host, args.token_file, args.namespace, None, dict(os.environ))
    if args.in_cluster:
        findings = run_checks(
            [
                lambda: _image_lock(args.lock),
                lambda: _in_cluster(
                    where, args.lock, args.pipeline_root, train_job, args.poll, args.timeout
                ),
            ]
        )
        from components.doctor.checks import report

        return 1 if report(findings) else 0
    from components.jobs.kube import default_api_client

    try:
        kube = default_api_client(args.context)
    except UserError as err:
        raise UserError(f"{err}, or pass --context") from None
    findings = run_checks(
        [
            lambda: _kfp(where),
            lambda: _cluster_checks(
                kube, args.namespace or "kubeflow", train_job, args.service_account
            ),
            lambda: _storage_checks(args.pipeline_root, args.metadata),
            lambda: [_image_lock(args.lock)],
        ]
    )
    from components.doctor.checks import report

    return 1 if report(findings) else 0


def run_checks(groups: Iterable[Callable[[], Any]]) -> list[Any]:
    """Every group's findings in order (a group returns one Finding or a list); a bad input
    (a UserError) ends doctor with its one line, as every command's."""
    found: list[Any] = []
    for group in groups:
        result = group()
        found += result if isinstance(result, list) else [result]
    return found


def _train_job(params: list[str]) -> Any:
    from contracts.params import TrainJob, apply_overrides

    for item in params:
        if not item.startswith(f"{TrainJob.NAME}."):
            raise UserError(f"--param {item!r}: doctor takes train_job.FIELD=VALUE only")
    return apply_overrides({TrainJob.NAME: TrainJob()}, params)[TrainJob.NAME]


def _kfp(where: Any) -> Any:
    """The KFP API answers its health check, and takes the token for a real call."""
    from components.doctor.checks import Finding
    from pipelines.runners.kfp import client

    try:
        api = client.Api(where)
        api.call(
            "list experiments",
            lambda: api.client.list_experiments(page_size=1, namespace=api.namespace or None),
        )
    except UserError as err:  # KfpError, or a multi-user KFP without --namespace
        fix = "check --host, --token-file and --namespace"
        return Finding("KFP API", False, str(err), fix)
    who = where.credential.describe()
    return Finding("KFP API", True, f"{where.host} answers and accepts {who}")


def _in_cluster(
    where: Any, lock: Path | None, root: str, train_job: Any, poll: float, timeout: float
) -> Any:
    """The checks as a step's identity: a one-step run of pipelines/doctor.py, followed to
    its end. Its step's log has one line per check."""
    import tempfile

    from components.doctor.checks import Finding
    from pipelines import compiler
    from pipelines import doctor as doctor_pipeline
    from pipelines.runners.kfp import client, ops

    check = "in-cluster checks"
    try:
        api = client.Api(where)
        image = compiler.load_images(lock).pipeline
        with tempfile.TemporaryDirectory(prefix="gptpipe-doctor-") as tmp:
            path = Path(tmp) / "doctor.yaml"
            doctor_pipeline.compile_to(str(path), image)
            params = {"pipeline_root": root, "train_job": train_job.to_dict()}
            source = ops.source_from_file(path)
            run = ops.start_run(api, source, doctor_pipeline.NAME, params, root, "gptpipe doctor")
        deadline = time.monotonic() + timeout

        def sleep(seconds: float) -> None:
            if time.monotonic() + seconds > deadline:
                raise TimeoutError
            time.sleep(seconds)

        def said(state: str) -> None:
            print(f"  doctor run {run.run_id}: {state}", file=sys.stderr)

        done = ops.wait(api, run.run_id, poll, on_state=said, sleep=sleep)
    except TimeoutError:
        return Finding(
            check,
            False,
            f"run {run.run_id} did not end within {timeout:.0f} s",
            "its pod may not start (image pull, pull secret, no schedulable node): "
            "`kubectl -n NS describe pod` of the run's doctor step",
        )
    except UserError as err:
        return Finding(check, False, str(err), "check --host, --token-file and --namespace")
    state = str(done.state)
    if state == "SUCCEEDED":
        return Finding(check, True, f"run {run.run_id} found no blocker as a step's identity")
    return Finding(
        check,
        False,
        f"run {run.run_id} {state}",
        "its doctor step's log (KFP UI) says which check failed, one line each",
    )


def _cluster_checks(kube: Any, namespace: str, train_job: Any, account: str) -> list[Any]:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    from components.doctor import checks
    from components.jobs.placement import kfp_step_account

    try:
        checks.namespace_exists(kube, namespace)
    except (ApiException, HTTPError, OSError) as err:  # the API server itself failed
        status = getattr(err, "status", None)
        said = f"HTTP {status} {getattr(err, 'reason', '')}".strip() if status else str(err)
        return [
            checks.Finding(
                "Kubernetes API",
                False,
                f"{kube.configuration.host} failed: {said.splitlines()[0]}",
                "check the kube context (`kubectl cluster-info`)",
            )
        ]
    # The steps run as KFP's account (or --service-account); the TFJob's pods as
    # train_job.service_account where it names one: each needs Google's credentials.
    accounts = dict.fromkeys([account or kfp_step_account(namespace)])
    if train_job.service_account:
        accounts[train_job.service_account] = None
    made = [
        ("TFJob CRD", lambda: checks.tfjob_crd(kube)),
        (f"access in {namespace}", lambda: checks.access(kube, namespace)),
        *[
            ("workload identity", lambda a=a: checks.workload_identity(kube, namespace, a))
            for a in accounts
        ],
        ("metadata version", lambda: checks.metadata_version(kube)),
        (
            "GPU nodes",
            lambda: checks.gpus(
                kube,
                train_job.workers,
                train_job.gpus_per_worker,
                train_job.node_selector,
                train_job.tolerations,
            ),
        ),
    ]
    return [checks.guarded(name, make) for name, make in made]


def _storage_checks(root: str, metadata: str) -> list[Any]:
    from components.doctor import checks

    found = [checks.pipeline_root(root)]
    if metadata:
        found.append(checks.metadata(metadata))
    else:
        found.append(
            checks.Finding(
                "metadata service",
                None,
                "not checked from here",
                "pass --metadata HOST:PORT, or run `gptpipe doctor --in-cluster`",
            )
        )
    return found


def _image_lock(lock: Path | None) -> Any:
    """The image lock `gptpipe compile` reads pins both images by real digests."""
    from components.doctor.checks import Finding
    from pipelines import compiler

    try:
        images = compiler.load_images(lock)
    except UserError as err:
        return Finding("image lock", False, str(err), "run `make images REGISTRY=...`")
    placeholder = [
        name
        for name, ref in (("pipeline", images.pipeline), ("trainer", images.trainer))
        if PLACEHOLDER_DIGEST.search(ref)
    ]
    if placeholder:
        return Finding(
            "image lock",
            False,
            f"{', '.join(placeholder)} still pinned to the placeholder digest",
            "run `make pin-base-images`, then `make images REGISTRY=...`",
        )
    return Finding("image lock", True, f"{images.pipeline}, {images.trainer}")
