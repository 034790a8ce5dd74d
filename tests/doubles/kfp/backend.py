"""Run a COMPILED pipeline YAML the way the open-source KFP v2 backend (release 2.5.0) does.

Not `kfp.local`, which calls the Python functions: here the YAML is the only input, every task
is a fresh process in its own empty folder (a pod), started from the executor's command and
args after the driver and launcher work, and only parameters and the pipeline root (a real GCS
API server, the emulator in tests) pass between tasks. docs/cluster-runner.md lists what is
reproduced, each with the KFP source file it follows, and what is not.

    backend = KfpBackend(pipeline_root="gs://bucket/root", env={"STORAGE_EMULATOR_HOST": url})
    result = backend.run("pipeline.yaml", {"corpus": "gs://..."})
    result.state, result.tasks["train"].state, result.tasks["train"].output_parameters

Modules: ir (the YAML, the Argo compiler's DAG rules), driver (inputs, outputs, cache lookup,
the pod's environment), launcher (the pod: artifacts, the command, outputs), cache
(fingerprints, the cache table and the MLMD records it reuses), gojson, argo (Argo's part: the
order of tasks, retries, exit hooks, termination), results.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

from google.auth.credentials import AnonymousCredentials
from google.cloud import storage as gcs_lib

from tests.doubles.kfp.argo import RunHandle
from tests.doubles.kfp.cache import CacheStore
from tests.doubles.kfp.ir import dag_dependencies, load, run_parameters
from tests.doubles.kfp.ir import unsupported as check_supported
from tests.doubles.kfp.results import (
    CACHED,
    CANCELED,
    FAILED,
    SKIPPED,
    SUCCEEDED,
    RunResult,
    TaskResult,
)

__all__ = ["CACHED", "CANCELED", "FAILED", "SKIPPED", "SUCCEEDED", "CacheStore", "KfpBackend"]
__all__ += ["RunHandle", "RunResult", "TaskResult"]


class KfpBackend:
    """A KFP 2.5.0 backend in a box: Argo, driver and launcher over one GCS bucket.

    `pipeline_root`: a gs:// URI. `env`: extra environment for every task pod (for example
    STORAGE_EMULATOR_HOST, a Kubernetes API double's address). `cache`: a CacheStore shared by
    runs (KFP's cache outlives runs); a fresh one per backend when None. `namespace`: the
    profile namespace (cache scope, fieldPath metadata.namespace). `secrets`/`config_maps`:
    name -> {key: value}, for secretAsEnv/configMapAsEnv. `mlmd_address`: host:port that
    metadata-grpc-configmap gives the pods. `grace_seconds`: terminationGracePeriodSeconds.
    """

    def __init__(
        self,
        pipeline_root: str,
        env: dict[str, str] | None = None,
        cache: CacheStore | None = None,
        *,
        gcs_client: gcs_lib.Client | None = None,
        namespace: str = "kubeflow-user-example-com",
        secrets: dict[str, dict[str, str]] | None = None,
        config_maps: dict[str, dict[str, str]] | None = None,
        mlmd_address: str = "metadata-grpc-service:8080",
        work_dir: str | Path | None = None,
        grace_seconds: float = 30.0,
    ) -> None:
        self.pipeline_root = pipeline_root
        self.env = dict(env or {})
        self.cache = cache if cache is not None else CacheStore()
        self.client = gcs_client or _client_from_env(self.env)
        self.namespace = namespace
        host, _, port = mlmd_address.rpartition(":")
        self.settings = {
            "mlmd_host": host,
            "mlmd_port": port,
            "secrets": dict(secrets or {}),
            "config_maps": dict(config_maps or {}),
        }
        self.work_dir = (
            Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="kfp-backend-"))
        )
        self.grace_seconds = grace_seconds

    def start(
        self,
        yaml_path: str | Path,
        parameters: dict[str, Any] | None = None,
        run_id: str | None = None,
        display_name: str = "run",
    ) -> RunHandle:
        """Submit a run (the API server's checks happen here) and start it in a thread.

        `display_name` is the run's name in the UI ({{$.pipeline_job_name}})."""
        pipeline = load(yaml_path)
        check_supported(pipeline)
        dag_dependencies(pipeline.spec.root.dag)
        for component in pipeline.spec.components.values():
            if component.HasField("dag"):
                dag_dependencies(component.dag)
        params = run_parameters(pipeline.spec, dict(parameters or {}))
        handle = RunHandle(self, pipeline, run_id or str(uuid.uuid4()), params, display_name)
        handle.thread.start()
        return handle

    def run(
        self,
        yaml_path: str | Path,
        parameters: dict[str, Any] | None = None,
        run_id: str | None = None,
        timeout: float | None = None,
        display_name: str = "run",
    ) -> RunResult:
        """Run to the end and return the result."""
        return self.start(yaml_path, parameters, run_id, display_name).wait(timeout)


def _client_from_env(env: dict[str, str]) -> gcs_lib.Client:
    endpoint = env.get("STORAGE_EMULATOR_HOST") or os.environ.get("STORAGE_EMULATOR_HOST")
    if not endpoint:
        return gcs_lib.Client()
    return gcs_lib.Client(
        project="kfp-backend",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": endpoint},
    )
