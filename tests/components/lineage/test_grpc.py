"""The lineage layer over a real MLMD gRPC service, plaintext and TLS, and how steps address it.

The service is ml_metadata's own MetadataStoreService over a SQLite store
(tests/doubles/mlmd/server.py), so every call crosses the wire as it does to KFP's
metadata-grpc-service. What the steps record and read back must equal the same calls on a SQLite
file.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from ml_metadata import errors
from ml_metadata.proto import metadata_store_pb2 as mlmd
from ml_metadata.proto import metadata_store_service_pb2 as service_pb2
from ml_metadata.proto import metadata_store_service_pb2_grpc as service_grpc

from components import lineage
from components.lineage import ArtifactRecord
from components.lineage.schema import PIPELINE_CONTEXT
from components.lineage.store import RPC_TIMEOUT_S
from contracts.errors import UserError
from pipelines.cli import lineage as lineage_cmd
from tests.components.lineage.fake_runs import DATASET, PIPELINE, fake_run
from tests.doubles.mlmd.server import VERSIONS, MetadataGrpcServer, TlsFiles, make_tls

KFP_ENV = {
    "METADATA_GRPC_SERVICE_HOST": "metadata-grpc-service",
    "METADATA_GRPC_SERVICE_PORT": "8080",
}


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture(params=["plaintext", "tls", "1.14.0"])
def server(request, tmp_path: Path, tls: TlsFiles) -> Iterator[MetadataGrpcServer]:
    """The service in plaintext and TLS, and in plaintext as KFP 2.5's 1.14.0 server."""
    with MetadataGrpcServer(
        tmp_path / "served.sqlite",
        tls=tls if request.param == "tls" else None,
        version=request.param if request.param[0].isdigit() else VERSIONS[0],
    ) as running:
        yield running


# ---- the steps' recording and reading, over the wire ----------------------------------------


def record_everything(store: str, root: Path) -> None:
    """What the steps write: two full runs, a run KFP served from its cache, a failed step."""
    first = fake_run(store, root, "run-1")
    second = fake_run(store, root, "run-2", baseline=first["model"])
    lineage.record_execution(
        store,
        step="evaluate",
        pipeline_name=PIPELINE,
        run_id="run-3",
        parameters={"threshold": 0.0},
        inputs={
            "examples": [ArtifactRecord("Examples", second["examples"])],
            "model": [ArtifactRecord("Model", second["model"])],
        },
        outputs={},
        upstream={"examples", "model"},
        dataset_version=DATASET,
    )
    with lineage.step(store, "train", PIPELINE, "run-4", {"steps": 3}, {"image": "x"}) as rec:
        rec.input("examples", "Examples", second["examples"], upstream=True)
        rec.output("model", "Model", str(root / "run-4" / "model"), {"final_loss": 1.5})
        rec.dataset_version = DATASET
    with pytest.raises(RuntimeError), lineage.step(store, "push", PIPELINE, "run-4", {}) as rec:
        rec.input("model", "Model", str(root / "run-4" / "model"), upstream=True)
        raise RuntimeError("disk full")


def read_everything(store: str, root: Path) -> dict[str, Any]:
    """What the steps and `gptpipe lineage` read back, as plain values."""
    pushed = lineage.latest_pushed_model(store)
    assert pushed is not None
    model = lineage.find_artifact(store, str(root / "run-2" / "model"), "Model")
    assert model is not None
    producer = lineage.producer_of(store, model)
    assert producer is not None
    return {
        "summaries": {r: lineage.run_summary(store, r) for r in ("run-1", "run-2", "run-3")},
        "run-4": lineage.run_summary(store, "run-4"),
        "failure": lineage.failure_of(store, "run-4"),
        "trace": lineage_cmd.trace(store, pushed),
        "models": lineage.models_for_dataset(store, DATASET),
        "pushed": pushed,
        "latest_run": lineage.latest_run_id(store, PIPELINE),
        "model": model,
        "producer": producer,
        "parameters": lineage.parameters_of(producer),
        "inputs": lineage.inputs_of(store, producer),
        "outputs": lineage.outputs_of(store, producer),
        "external": lineage.find_artifact(store, str(root / "nowhere")),
    }


def timeless(value: Any) -> Any:
    """`value` without the clock's readings (`*_time_ms`), which differ between two stores."""
    if isinstance(value, dict):
        return {k: timeless(v) for k, v in value.items() if not str(k).endswith("_time_ms")}
    if isinstance(value, list | tuple):
        return [timeless(v) for v in value]
    return value


def test_steps_record_and_read_the_same_over_grpc_as_on_sqlite(server, tmp_path):
    local = str(tmp_path / "local.sqlite")
    root = tmp_path / "runs"
    record_everything(local, root)
    record_everything(server.address, root)

    over_wire = read_everything(server.address, root)
    assert timeless(over_wire) == timeless(read_everything(local, root))
    json.dumps(over_wire)
    # The comparison covered what it should: every state, the cache and the failure.
    states = {e["state"] for s in over_wire["summaries"].values() for e in s["executions"]}
    assert states == {"COMPLETE", "CACHED"}
    assert [(e["step"], e["state"]) for e in over_wire["run-4"]["executions"]] == [
        ("tokenize", "CACHED"),
        ("train", "COMPLETE"),
        ("push", "FAILED"),
    ]
    assert over_wire["failure"] == ("push", "RuntimeError: disk full")
    assert over_wire["trace"]["examples"]["properties"]["dataset_version"] == DATASET
    assert [m["execution"]["properties"]["run_id"] for m in over_wire["models"]] == [
        "run-1",
        "run-2",
        "run-4",
    ]
    # And it is the served SQLite file that holds it.
    served = lineage.find_artifact(str(server.sqlite_path), over_wire["pushed"])
    assert served is not None and served["properties"]["pushed"] == 1


def test_mlmd_errors_keep_their_kind_over_grpc(server):
    store = lineage.open_store(server.address)
    store.put_artifact_type(mlmd.ArtifactType(name="Model", properties={"n": mlmd.INT}))
    with pytest.raises(errors.AlreadyExistsError):
        store.put_artifact_type(mlmd.ArtifactType(name="Model", properties={"n": mlmd.STRING}))
    with pytest.raises(errors.NotFoundError, match="nope"):
        store.get_artifact_type("nope")
    with pytest.raises(UserError, match="no run 'missing'"):
        lineage.run_summary(server.address, "missing")


def test_server_answers_unimplemented_for_rpcs_the_store_lacks(tmp_path):
    with (
        MetadataGrpcServer(tmp_path / "m.sqlite") as running,
        grpc.insecure_channel(running.address) as channel,
    ):
        stub = service_grpc.MetadataStoreServiceStub(channel)
        assert not stub.GetArtifactTypes(service_pb2.GetArtifactTypesRequest()).artifact_types
        with pytest.raises(grpc.RpcError) as raised:
            stub.GetLineageGraph(service_pb2.GetLineageGraphRequest())
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED


# ---- ml-metadata 1.14, KFP 2.5's server ----------------------------------------------------


def note_on_pipeline_context(address: str) -> None:
    """Another writer of the store (a person, a tool that shares it) notes the pipeline's
    context: the property lineage must never overwrite."""
    store = lineage.open_store(address)
    context = store.get_context_by_type_and_name(PIPELINE_CONTEXT, PIPELINE)
    context.custom_properties["owner"].string_value = "team-a"
    store.put_contexts([context])


def owner_of_pipeline(address: str) -> str:
    store = lineage.open_store(address)
    context = store.get_context_by_type_and_name(PIPELINE_CONTEXT, PIPELINE)
    return str(context.custom_properties["owner"].string_value)


@pytest.mark.parametrize(("version", "kept"), [("1.17.1", True), ("1.14.0", False)])
def test_a_context_put_by_id_is_overwritten_by_1_14_whatever_force_reuse_context_says(
    tmp_path, version, kept
):
    """What lineage did before: link the stored context, read before another writer's change,
    by its id with force_reuse_context. 1.17.1 links it; 1.14.0 never reads the option and
    updates the context with the stale copy, the other writer's property lost."""
    with MetadataGrpcServer(tmp_path / "m.sqlite", version=version) as running:
        fake_run(running.address, tmp_path / "runs", "run-1")
        store = lineage.open_store(running.address)
        stale = store.get_context_by_type_and_name(PIPELINE_CONTEXT, PIPELINE)
        note_on_pipeline_context(running.address)
        execution = mlmd.Execution(type_id=store.get_execution_type("gptpipe.Train").id)
        store.put_execution(
            execution, [], [stale], reuse_context_if_already_exist=True, force_reuse_context=True
        )
        assert (owner_of_pipeline(running.address) == "team-a") == kept


def test_steps_keep_what_another_writer_set_on_a_context_on_1_14(tmp_path, monkeypatch):
    """Another writer changes the pipeline's context between everything a step reads and its
    one write: on 1.14.0, with no force_reuse_context, the write must leave the change."""
    with MetadataGrpcServer(tmp_path / "m.sqlite", version="1.14.0") as running:
        fake_run(running.address, tmp_path / "runs", "run-1")
        put_execution = lineage.store._Store.put_execution

        def after_another_writer(self: Any, *args: Any, **kwargs: Any) -> Any:
            note_on_pipeline_context(running.address)
            return put_execution(self, *args, **kwargs)

        monkeypatch.setattr(lineage.store._Store, "put_execution", after_another_writer)
        fake_run(running.address, tmp_path / "runs", "run-2")
        assert owner_of_pipeline(running.address) == "team-a"
        monkeypatch.undo()
        summary = lineage.run_summary(running.address, "run-2")
    assert [e["step"] for e in summary["executions"]] == ["tokenize", "train", "evaluate", "push"]


# ---- which store a step uses ---------------------------------------------------------------


def test_store_address_prefers_the_parameter_then_kfps_injected_service():
    assert lineage.store_address("runs/metadata.sqlite", KFP_ENV) == "runs/metadata.sqlite"
    assert lineage.store_address(" grpcs://mlmd:443 ", KFP_ENV) == "grpcs://mlmd:443"
    assert lineage.store_address("", KFP_ENV) == "metadata-grpc-service:8080"
    assert lineage.store_address("  ", KFP_ENV) == "metadata-grpc-service:8080"
    assert lineage.store_address("/tmp/m.sqlite", {}) == "/tmp/m.sqlite"


@pytest.mark.parametrize(
    "env",
    [{}, {"METADATA_GRPC_SERVICE_HOST": "mlmd"}, {"METADATA_GRPC_SERVICE_PORT": "8080"}],
)
def test_store_address_without_parameter_or_kfp_names_both(env):
    with pytest.raises(UserError) as raised:
        lineage.store_address("", env)
    message = str(raised.value)
    for name in (
        "`metadata` parameter",
        "METADATA_GRPC_SERVICE_HOST",
        "METADATA_GRPC_SERVICE_PORT",
    ):
        assert name in message


@pytest.mark.parametrize(
    ("param", "env", "named"),
    [
        ("", {**KFP_ENV, "METADATA_GRPC_SERVICE_PORT": "80a"}, "METADATA_GRPC_SERVICE_PORT='80a'"),
        ("", {**KFP_ENV, "METADATA_GRPC_SERVICE_HOST": "a b"}, "METADATA_GRPC_SERVICE_HOST='a b'"),
        ("https://mlmd:443", KFP_ENV, "https://mlmd:443"),
        ("mlmd:8080?ca=/ca.pem", KFP_ENV, "mlmd:8080?ca=/ca.pem"),
    ],
)
def test_store_address_rejects_malformed_addresses(param, env, named):
    with pytest.raises(UserError, match="metadata|METADATA") as raised:
        lineage.store_address(param, env)
    assert named in str(raised.value)


def test_kfps_injected_address_reaches_the_service(tmp_path):
    with MetadataGrpcServer(tmp_path / "m.sqlite") as running:
        host, port = running.address.split(":")
        env = {"METADATA_GRPC_SERVICE_HOST": host, "METADATA_GRPC_SERVICE_PORT": port}
        address = lineage.store_address("", env)
        fake_run(address, tmp_path, "run-1")
        assert lineage.latest_run_id(address, PIPELINE) == "run-1"


# ---- TLS and addresses -----------------------------------------------------------------------


def test_grpcs_addresses_configure_tls(tls):
    config = lineage.store_config(f"grpcs://mlmd.example:443?ca={tls.ca_cert}")
    assert (config.host, config.port) == ("mlmd.example", 443)
    assert config.ssl_config.custom_ca == tls.ca_cert.read_text()
    assert config.client_timeout_sec == RPC_TIMEOUT_S
    system_roots = lineage.store_config("grpcs://mlmd.example:443")
    assert system_roots.HasField("ssl_config")
    assert not system_roots.ssl_config.HasField("custom_ca")
    for plaintext in ("mlmd:8080", "grpc://mlmd:8080"):
        assert not lineage.store_config(plaintext).HasField("ssl_config")
    assert lineage.is_service("grpcs://mlmd:443?ca=/ca.pem")
    assert lineage.is_service("grpcs://bad")  # a service address, malformed: store_config says so
    assert lineage.is_service("mlmd:")
    assert not lineage.is_service("runs/metadata.sqlite")


@pytest.mark.parametrize(
    "address",
    [
        "grpcs://mlmd",
        "grpcs://mlmd:443/metadata",
        "grpcs://mlmd:0",
        "grpcs://mlmd:70000",
        "grpcs://mlmd:443?ca=",
        "grpcs://mlmd:443?cert=/c.pem",
        "grpc://mlmd:8080?ca=/ca.pem",
        "https://mlmd:443",
        "mlmd:",  # host:port forms with a bad port, not SQLite files of that name
        "mlmd:808080",
        "mlmd.kubeflow:http",
    ],
)
def test_malformed_service_addresses_are_named(address):
    with pytest.raises(UserError) as raised:
        lineage.store_config(address)
    assert repr(address) in str(raised.value)


def test_unreadable_or_non_pem_ca_files_are_named(tmp_path):
    missing = tmp_path / "missing.pem"
    with pytest.raises(UserError, match=f"cannot read CA file {missing}"):
        lineage.store_config(f"grpcs://mlmd:443?ca={missing}")
    key = tmp_path / "key.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\n")
    with pytest.raises(UserError, match=f"CA file {key} holds no PEM certificate"):
        lineage.store_config(f"grpcs://mlmd:443?ca={key}")


def test_a_server_signed_by_another_ca_is_refused(tmp_path, tls):
    other = make_tls(tmp_path / "other", name="other")
    with MetadataGrpcServer(tmp_path / "m.sqlite", tls=tls) as running:
        for address in (
            f"grpcs://127.0.0.1:{running.port}?ca={other.ca_cert}",
            f"grpcs://127.0.0.1:{running.port}",  # gRPC's roots do not know the test CA
        ):
            with pytest.raises(UserError) as raised:
                lineage.run_summary(address, "run-1")
            message = str(raised.value)
            assert message.startswith(f"metadata store {address} is unreachable")
            assert "CERTIFICATE_VERIFY_FAILED" in message
            assert "TLS handshake failed" in message
        with pytest.raises(UserError, match="whether it needs grpcs://"):
            lineage.run_summary(f"127.0.0.1:{running.port}", "run-1")  # plaintext to TLS
    with (
        MetadataGrpcServer(tmp_path / "m.sqlite") as running,  # TLS to plaintext
        pytest.raises(UserError, match="TLS handshake failed"),
    ):
        lineage.run_summary(f"grpcs://127.0.0.1:{running.port}?ca={tls.ca_cert}", "run-1")


# ---- a service that is down or silent --------------------------------------------------------


def test_a_stopped_service_is_one_user_error_naming_it(tmp_path):
    with MetadataGrpcServer(tmp_path / "m.sqlite") as running:
        address = running.address
        fake_run(address, tmp_path, "run-1")
    store = lineage.open_store(address)  # lazy: nothing is contacted yet
    with pytest.raises(UserError, match=f"metadata store {address} is unreachable .*refused"):
        store.get_artifact_types()
    with pytest.raises(UserError, match=f"metadata store {address} is unreachable"):
        lineage.run_summary(address, "run-1")
    with pytest.raises(UserError, match=f"metadata store {address} is unreachable"):
        fake_run(address, tmp_path, "run-2")


def test_a_silent_service_fails_at_the_deadline_instead_of_hanging():
    # Accepts TCP connections and never speaks HTTP/2, like a hung server.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        store = lineage.open_store(address, timeout_s=0.5)
        with pytest.raises(UserError, match=f"{address} is unreachable \\(no answer within 0.5 s"):
            store.get_artifact_types()
