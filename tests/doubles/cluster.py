"""A Kubeflow cluster on this machine, for tests/pipelines/test_cluster_e2e.py.

    with local_cluster(folder, gcs_endpoint, CONFIG_OVERRIDES) as cluster:
        result = cluster.backend.run(cluster.yaml, cluster.params())

What runs, and which double stands for what:
- the pipeline YAML that `gptpipe compile` writes, run by KFP backend 2.5.0's driver, launcher
  and Argo (tests/doubles/kfp/backend.py), every step a fresh process;
- GCS: gcp-storage-emulator (the pipeline root, the corpus, the Examples, the work folder, the
  serving folder), reached by the steps through STORAGE_EMULATOR_HOST;
- ML Metadata: ml_metadata's own gRPC service over SQLite, playing KFP 2.5's 1.14.0 server
  (tests/doubles/mlmd/server.py), at the address the harness gives the steps as
  METADATA_GRPC_SERVICE_HOST/_PORT;
- Kubernetes: the API server double with the Training Operator v1.9 behind it and a kubelet that
  runs the TFJob's worker pods as processes (tests/doubles/kubernetes/), reached by the steps
  through KUBECONFIG (`config.load_incluster_config()` fails in a step: no service account);
- TensorFlow's GCS file system in the workers: TensorFlow's own, reaching the emulator
  through GCS's hosts (tests/doubles/gcs/googleapis.py, given to the workers in the image's
  environment); it ignores the STORAGE_EMULATOR_HOST that the tokenize parts' pods
  (google-cloud-storage) read from the same environment.

The harness runs each step's pod as a process but creates no pod object in the Kubernetes double,
while the steps read their own pod through the API (the train step its service account and image
pull secrets, every step its image digest). `register_step_pods` plays Argo's part: the pod that
the harness is about to start is created in the double first, named and labelled as the harness
names it, with the compiled image, the executor config's imagePullSecrets, and the service
account of a Kubeflow profile's pipeline pods.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import json
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage as gcs_lib

from components.jobs.naming import run_label
from components.jobs.tfjob.manifest import LABEL_RUN_ID
from contracts.params import EvalPolicy, TokenizeParams, TrainJob
from pipelines.cli import main as cli
from tests.doubles.gcs import googleapis
from tests.doubles.kfp import argo as kfp_argo
from tests.doubles.kfp.backend import CacheStore, KfpBackend
from tests.doubles.kfp.launcher import VENV_BIN
from tests.doubles.kubernetes.apiserver import FakeKube
from tests.doubles.mlmd.server import MetadataGrpcServer
from tests.processes import alive

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "tests" / "data" / "digests.json"  # images pinned by digest, never pulled
NAMESPACE = "kubeflow-user-example-com"  # a Kubeflow profile's namespace
STEP_SERVICE_ACCOUNT = "default-editor"  # what a profile's pipeline pods run as
PULL_SECRET = "regcred"  # compiled into every step (`gptpipe compile --image-pull-secret`)
GRACE_SECONDS = 5  # terminationGracePeriodSeconds of step pods and worker pods
TFJOB_NAME_LABEL = "training.kubeflow.org/job-name"  # on the Training Operator's pods
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"  # on an Indexed Job's pods
CORPUS_CHARS = 80_000  # a slice of data/tinyshakespeare.txt, cut at a line end
# The trainer image's environment (images/Dockerfile ENV): this checkout on the path, this
# virtualenv first on PATH, where the worker command's `python` is looked up.
TRAINER_ENV = {
    "PATH": f"{VENV_BIN}:/usr/bin:/bin",
    "PYTHONPATH": str(REPO),
    "PYTHONUNBUFFERED": "1",
    "TF_USE_LEGACY_KERAS": "1",
    "TF_ENABLE_ONEDNN_OPTS": "1",
    "TF_CPP_MIN_LOG_LEVEL": "2",
}


@dataclass
class LocalCluster:
    """The running doubles, the compiled pipeline, and what the test reads back."""

    kube: FakeKube
    backend: KfpBackend
    mlmd: MetadataGrpcServer
    gcs: gcs_lib.Client
    bucket: str
    yaml: Path
    created_pods: list[dict[str, Any]] = field(default_factory=list)  # copies, as created

    def uri(self, *parts: str) -> str:
        return "/".join([f"gs://{self.bucket}", *parts])

    def params(self, **overrides: Any) -> dict[str, Any]:
        """The run's parameters: two CPU workers on the TFJob launcher, everything on gs://."""
        return {
            "corpus": self.uri("corpus/"),
            "serving_dir": self.uri("serving", "gpt"),
            "artifact_root": self.uri("root"),
            "train_job": TrainJob(workers=2, gpus_per_worker=0, cpu="1", memory="2Gi").to_dict(),
            # tokenize's parts as an Indexed Job of 4 pods, one unit of the corpus's each
            "tokenize": TokenizeParams(parts=4, unit_bytes=1, cpu="1", memory="2Gi").to_dict(),
            # a model trained for seconds must still be blessed
            "eval_policy": EvalPolicy(max_nats_per_char=5.0).to_dict(),
            "metadata": "",  # the MLMD service KFP names in the steps' environment
            **overrides,
        }

    def names(self, prefix: str) -> list[str]:
        """Object names under `prefix` in the bucket."""
        return sorted(b.name for b in self.gcs.list_blobs(self.bucket, prefix=prefix))

    def worker_pods(self, run_id: str) -> list[dict[str, Any]]:
        """Every TFJob worker pod created for the run, as created."""
        return [p for p in self.run_pods(run_id) if TFJOB_NAME_LABEL in _labels(p)]

    def part_pods(self, run_id: str) -> list[dict[str, Any]]:
        """Every Indexed Job pod (tokenize's parts) created for the run, as created."""
        return [p for p in self.run_pods(run_id) if COMPLETION_INDEX_LABEL in _labels(p)]

    def run_pods(self, run_id: str) -> list[dict[str, Any]]:
        label = run_label(run_id)
        return [p for p in self.created_pods if _labels(p).get(LABEL_RUN_ID) == label]

    def tfjobs(self, run_id: str) -> list[str]:
        """The run's TFJobs in the API server (those being deleted included)."""
        label = run_label(run_id)
        with self.kube.cluster.cond:
            jobs = list(self.kube.cluster.tfjobs.values())
        return [j["metadata"]["name"] for j in jobs if _labels(j).get(LABEL_RUN_ID) == label]

    def worker_log(self, pod: dict[str, Any]) -> str:
        with self.kube.cluster.cond:
            return "\n".join(self.kube.cluster.logs.get(pod["metadata"]["uid"], []))

    def live_worker_pids(self) -> list[int]:
        assert self.kube.kubelet is not None
        return [pid for pid in self.kube.kubelet.all_pids if alive(pid)]


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("labels") or {})


def wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    """Poll `predicate` until it holds; False if `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def compile_pipeline(output: Path, root: str, overrides: Sequence[str]) -> Path:
    """`gptpipe compile`, as a user runs it: the config is resolved once, here."""
    args = ["compile", "--output", str(output), "--pipeline-root", root, "--lock", str(LOCK)]
    args += ["--image-pull-secret", PULL_SECRET, "--config", "tiny"]
    for override in overrides:
        args += ["--set", override]
    assert cli.main(args) == 0
    return output


def gcs_client(endpoint: str) -> gcs_lib.Client:
    """google-cloud-storage for the emulator at `endpoint`, anonymously."""
    return gcs_lib.Client(
        project="gptpipe-e2e",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": endpoint},
    )


def upload_corpus(bucket: gcs_lib.Bucket) -> None:
    text = (REPO / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")[:CORPUS_CHARS]
    text = text[: text.rindex("\n") + 1]
    # Speeches as JSONL documents in four files, one of them compressed, so that tokenize's
    # four parts have a unit each and the document readers run against gs://.
    speeches = [s for s in text.split("\n\n") if s.strip()]
    for part in range(4):
        lines = "".join(json.dumps({"text": s}) + "\n" for s in speeches[part::4]).encode()
        name = f"corpus/speeches-{part}.jsonl" + (".gz" if part == 3 else "")
        data = gzip.compress(lines, mtime=0) if part == 3 else lines
        bucket.blob(name).upload_from_string(data)


def write_kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig for the API server double (it checks no credentials)."""
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: double
  cluster: {{server: "{server}"}}
users:
- name: pipeline-runner
  user: {{token: not-checked}}
contexts:
- name: double
  context: {{cluster: double, user: pipeline-runner, namespace: {NAMESPACE}}}
current-context: double
""",
        encoding="utf-8",
    )
    return path


def register_step_pods(monkeypatch: pytest.MonkeyPatch, kube: FakeKube) -> None:
    """Create each step pod in the double when the harness makes it (Argo's part)."""
    make_pod = kfp_argo.pod_for

    def pod_for(context: Any, plan: Any, settings: dict[str, Any]) -> Any:
        pod = make_pod(context, plan, settings)
        image = plan.container.image
        pull = tuple(s.secret_name for s in plan.kubernetes.image_pull_secret)
        kube.cluster.add_pod(
            context.namespace,
            pod.name,
            {"main": (image, image)},  # imageID: the pinned reference, as pulled
            service_account=STEP_SERVICE_ACCOUNT,
            image_pull_secrets=pull,
        )
        with kube.cluster.cond:
            meta = kube.cluster.pods[(context.namespace, pod.name)]["metadata"]
            meta.update(uid=pod.uid, labels=dict(pod.labels), annotations=dict(pod.annotations))
        return pod

    monkeypatch.setattr(kfp_argo, "pod_for", pod_for)


def record_created_pods(
    monkeypatch: pytest.MonkeyPatch, kube: FakeKube, into: list[dict[str, Any]]
) -> None:
    """Keep a copy of every pod the operator creates (the TFJob's cleanup deletes them)."""
    create = kube.cluster.create_pod

    def create_pod(pod: dict[str, Any]) -> dict[str, Any]:
        created = create(pod)
        into.append(copy.deepcopy(created))
        return created

    monkeypatch.setattr(kube.cluster, "create_pod", create_pod)


@contextlib.contextmanager
def local_cluster(
    folder: Path, gcs_endpoint: str, overrides: Sequence[str]
) -> Iterator[LocalCluster]:
    """Start every double, compile the pipeline with `overrides` and yield the cluster."""
    gcs = gcs_client(gcs_endpoint)
    bucket = gcs.create_bucket(f"e2e-{secrets.token_hex(6)}")
    upload_corpus(bucket)
    yaml = compile_pipeline(folder / "gptpipe.yaml", f"gs://{bucket.name}/root", overrides)
    with googleapis.serving(gcs_endpoint, folder / "googleapis") as google:
        # The tokenize parts' pods read and write gs:// with google-cloud-storage, as the steps
        # do, so the image's environment names the emulator; TensorFlow's GCS file system in
        # the trainer workers ignores the variable and reaches it through GCS's own hosts.
        trainer_env = {**TRAINER_ENV, "HOME": str(folder), "STORAGE_EMULATOR_HOST": gcs_endpoint}
        trainer_env.update(google.env)
        kube = FakeKube.running(folder / "nodes", trainer_env, grace_seconds=GRACE_SECONDS)
        with _doubles(folder, gcs, bucket.name, yaml, kube, gcs_endpoint) as cluster:
            yield cluster


@contextlib.contextmanager
def _doubles(
    folder: Path, gcs: gcs_lib.Client, bucket: str, yaml: Path, kube: FakeKube, endpoint: str
) -> Iterator[LocalCluster]:
    """Start ML Metadata, the Kubernetes double and KFP's backend around `kube`."""
    with (
        MetadataGrpcServer(folder / "mlmd.sqlite", version="1.14.0") as mlmd,  # KFP 2.5's
        kube,
        pytest.MonkeyPatch.context() as monkeypatch,
    ):
        backend = _backend(folder, f"gs://{bucket}/root", endpoint, kube, mlmd)
        cluster = LocalCluster(kube, backend, mlmd, gcs, bucket, yaml)
        record_created_pods(monkeypatch, kube, cluster.created_pods)
        register_step_pods(monkeypatch, kube)
        yield cluster


def _backend(
    folder: Path, root: str, endpoint: str, kube: FakeKube, mlmd: MetadataGrpcServer
) -> KfpBackend:
    """KFP's backend: the run request's pipeline root is the compiled one."""
    env = {
        "STORAGE_EMULATOR_HOST": endpoint,
        "KUBECONFIG": str(write_kubeconfig(folder / "kubeconfig", kube.host)),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        # The image installs this checkout (images/Dockerfile); the virtualenv's editable install
        # may point at another one, so the steps get this one first, as TRAINER_ENV's workers do.
        "PYTHONPATH": str(REPO),
    }
    return KfpBackend(
        pipeline_root=root,
        env=env,
        cache=CacheStore(),  # one cache for every run: KFP's outlives runs
        namespace=NAMESPACE,
        mlmd_address=mlmd.address,
        work_dir=folder / "pods",
        grace_seconds=GRACE_SECONDS,
    )
