"""What deploy/serving/ promises: TF Serving pinned by the digests of images/bases.json, the
version there the one home of TF Serving's version (KServe's runtimeVersion follows it), the
push folder served and polled under the model's name, probes that ask for that model, no
Kubernetes token, the restricted Pod Security Standard, and a Service and a
PodDisruptionBudget that select the pods."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.doubles.kubernetes.pod_security import restricted_violations

SERVING_REPO = "tensorflow/serving"
GPU_SUFFIX = "-gpu"  # KServe's TensorflowServingGPUSuffix, and the GPU images' tags
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [doc for doc in docs if doc["kind"] == kind]
    return doc


def server(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def flags(container: dict[str, Any]) -> dict[str, str]:
    """tensorflow_model_server's `--name=value` arguments, by name."""
    pairs = [arg.removeprefix("--").split("=", 1) for arg in container["args"]]
    assert all(len(pair) == 2 for pair in pairs), container["args"]
    return dict(pairs)


def tag(reference: str) -> str:
    """`repo:tag@sha256:...` -> `tag`."""
    return reference.split("@", 1)[0].rsplit(":", 1)[1]


@pytest.fixture(scope="module")
def cpu(kustomized):
    return kustomized["serving/cpu"]


@pytest.fixture(scope="module")
def gpu(kustomized):
    return kustomized["serving/gpu"]


@pytest.fixture(scope="module")
def isvc(kustomized):
    return one(kustomized["serving/kserve"], "InferenceService")


def test_the_servers_run_the_images_pinned_in_bases_json(cpu, gpu, pins, manifests):
    assert server(one(cpu, "Deployment"))["image"] == pins["serving"]
    assert server(one(gpu, "Deployment"))["image"] == pins["serving-gpu"]
    for name in ("serving", "serving-gpu"):
        assert pins[name].startswith(f"{SERVING_REPO}:"), pins[name]
        assert DIGEST.search(pins[name]), pins[name]
    # No manifest runs an image that `make pin-base-images` does not pin.
    for name, doc in manifests.items():
        pod = doc.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []):
            assert container["image"] in pins.values(), f"{name}: {container['image']}"


def test_tf_serving_has_one_version_which_kserve_runs_too(pins, isvc, cpu):
    version = tag(pins["serving"])
    assert tag(pins["serving-gpu"]) == version + GPU_SUFFIX
    tensorflow = isvc["spec"]["predictor"]["tensorflow"]
    assert tensorflow["runtimeVersion"] == version
    # KServe refuses a -gpu runtimeVersion without a GPU, and a GPU without one (validateGPU).
    asks_gpu = "nvidia.com/gpu" in tensorflow.get("resources", {}).get("limits", {})
    assert asks_gpu == tensorflow["runtimeVersion"].endswith(GPU_SUFFIX)


def test_the_server_serves_and_polls_the_push_folder_under_the_models_name(cpu, isvc):
    container = server(one(cpu, "Deployment"))
    flag = flags(container)
    assert container["command"] == ["/usr/bin/tensorflow_model_server"]  # not the entrypoint
    folder = flag["model_base_path"]
    assert folder.startswith("gs://") and not folder.endswith("/")
    assert flag["model_name"] == folder.rsplit("/", 1)[1] == "gpt"
    # Polled, so a push or a rollback is served without a restart (0: once; <0: never).
    assert int(flag["file_system_poll_wait_seconds"]) > 0
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"grpc": int(flag["port"]), "http": int(flag["rest_api_port"])}
    assert (ports["grpc"], ports["http"]) == (8500, 8501)
    # KServe names the model after the InferenceService and copies the same folder.
    assert isvc["metadata"]["name"] == flag["model_name"]
    assert isvc["spec"]["predictor"]["tensorflow"]["storageUri"] == folder


def test_the_probes_ask_for_the_models_status(cpu):
    container = server(one(cpu, "Deployment"))
    status = f"/v1/models/{flags(container)['model_name']}"
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": status, "port": "http"}, probe
    # The first load from GCS may take minutes: the startup probe allows them.
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    assert container["livenessProbe"]["tcpSocket"] == {"port": "grpc"}


def test_the_thread_pools_match_the_cpu_limit_and_requests_match_limits(cpu, gpu):
    for docs in (cpu, gpu):
        container = server(one(docs, "Deployment"))
        limits, requests = container["resources"]["limits"], container["resources"]["requests"]
        flag = flags(container)
        threads = str(limits["cpu"])
        assert flag["tensorflow_intra_op_parallelism"] == threads
        assert flag["tensorflow_inter_op_parallelism"] == threads
        for resource in ("cpu", "memory"):
            assert requests[resource] == limits[resource], resource
    assert server(one(gpu, "Deployment"))["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in server(one(cpu, "Deployment"))["resources"]["limits"]


def test_the_pods_mount_no_token_and_act_as_a_google_account(cpu, isvc):
    account = one(cpu, "ServiceAccount")
    assert account["automountServiceAccountToken"] is False
    google = account["metadata"]["annotations"]["iam.gke.io/gcp-service-account"]
    assert google.endswith(".iam.gserviceaccount.com")
    pod = one(cpu, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is False
    assert isvc["spec"]["predictor"]["serviceAccountName"] == account["metadata"]["name"]


@pytest.mark.parametrize("variant", ["serving/cpu", "serving/gpu"])
def test_the_pods_meet_the_restricted_pod_security_standard(kustomized, variant):
    deployment = one(kustomized[variant], "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    annotations = deployment["spec"]["template"]["metadata"].get("annotations")
    assert restricted_violations(pod, annotations) == []
    # The image names no user: the pod must name a non-root one, or the kubelet refuses it.
    assert pod["securityContext"]["runAsUser"] > 0
    container = server(deployment)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    scratch = {volume["name"] for volume in pod["volumes"] if "emptyDir" in volume}
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    assert mounts["/tmp"] in scratch


def test_the_service_and_the_disruption_budget_select_the_serving_pods(cpu):
    deployment = one(cpu, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    budget = one(cpu, "PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"] == selector
    # A drain can go on: fewer pods may be unavailable than there are.
    assert 0 < budget["spec"]["maxUnavailable"] < deployment["spec"]["replicas"]
    service = one(cpu, "Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    named = {port["name"] for port in server(deployment)["ports"]}
    assert {port["targetPort"] for port in service["spec"]["ports"]} <= named


def test_the_gpu_variant_changes_only_the_image_memory_gpu_and_tolerations(cpu, gpu):
    before, after = one(cpu, "Deployment"), one(gpu, "Deployment")
    assert [doc["kind"] for doc in gpu] == [doc["kind"] for doc in cpu]
    for kind in ("ServiceAccount", "Service", "PodDisruptionBudget"):
        assert one(gpu, kind) == one(cpu, kind), kind
    old, new = server(before), server(after)
    changed = {key for key in old.keys() | new.keys() if old.get(key) != new.get(key)}
    assert changed == {"image", "resources"}
    pod_changes = {
        key
        for key in before["spec"]["template"]["spec"].keys() | after["spec"]["template"]["spec"]
        if key != "containers"
        and before["spec"]["template"]["spec"].get(key)
        != after["spec"]["template"]["spec"].get(key)
    }
    assert pod_changes == {"tolerations"}
