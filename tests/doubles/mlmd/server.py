"""A real ML Metadata gRPC service for tests: ml_metadata's own service over a SQLite store.

`MetadataGrpcServer` serves `ml_metadata.MetadataStoreService`, as generated from the protos the
ml_metadata package ships (`metadata_store_service_pb2_grpc`), in plaintext or TLS. Every RPC the
service declares is forwarded by name to a `MetadataStore` on a SQLite file, through the same
call the Python client makes for a local store (`MetadataStore._call_method(name, request,
response)`, which runs the C++ store's method of that name), so the client sees what the C++
store returns, errors as their gRPC status codes. This stands in for KFP's
`metadata-grpc-service` (the C++ `metadata_store_server` over MySQL), which ml_metadata's wheel
does not ship.

`version="1.14.0"` plays the server KFP 2.5.0 deploys (manifests/kustomize/base/metadata/base/
metadata-grpc-deployment.yaml: `ml_metadata_store_server:1.14.0`) where it differs from 1.17.1
in what the lineage layer sends: its PutExecutionRequest.Options has only fields 1 and 2
(ml_metadata/proto/metadata_store_service.proto at v1.14.0), so a newer client's
`force_update_time` (3) and `force_reuse_context` (4) are unknown fields it never reads, and are
cleared here before the 1.17.1 store runs the request. Without them 1.17.1's PutExecution takes
the path 1.14.0's always takes (ml_metadata/metadata_store/metadata_store.cc
`UpsertContextWithOptions`, the same function at both tags): a context given with an id is
updated as a whole, one without is found by type and name (`reuse_context_if_already_exist`) or
created.

`make_tls` writes a throwaway CA and a certificate it signs for this host, with `cryptography`.
"""

from __future__ import annotations

import datetime
import ipaddress
import threading
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from ml_metadata import errors
from ml_metadata.metadata_store import metadata_store
from ml_metadata.metadata_store.pywrap.metadata_store_extension import (
    metadata_store as cc_store,
)
from ml_metadata.proto import (
    metadata_store_pb2,
    metadata_store_service_pb2,
    metadata_store_service_pb2_grpc,
)

HOST = "127.0.0.1"  # IPv4 only: "localhost" also names ::1, where another process may listen
# The generated protos have no type stubs.
mlmd: Any = metadata_store_pb2
SERVICE = metadata_store_service_pb2.DESCRIPTOR.services_by_name["MetadataStoreService"]
# MLMD's error codes are absl status codes, which are gRPC's.
_GRPC_CODES = {code.value[0]: code for code in grpc.StatusCode}
VERSIONS = ("1.17.1", "1.14.0")  # the ml_metadata package's own, and KFP 2.5.0's server
# Per RPC, the request fields (a path of field names) that 1.17.1 has and 1.14.0 does not.
_NEWER_THAN_1_14 = {
    "PutExecution": (("options", "force_update_time"), ("options", "force_reuse_context")),
}


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for a TLS server: the CA a client trusts, and the server's key pair."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


def make_tls(folder: Path, *, name: str = "test") -> TlsFiles:
    """Write a new CA and a server certificate it signed for localhost and 127.0.0.1."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _certificate(f"{name} CA", issuer=None, is_ca=True)
    server_key, server_cert = _certificate(HOST, issuer=(ca_key, ca_cert), is_ca=False)
    files = TlsFiles(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    files.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    files.server_key.write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return files


def _certificate(
    common_name: str, *, issuer: tuple[Any, x509.Certificate] | None, is_ca: bool
) -> tuple[Any, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    signing_key, issuer_name = (key, subject) if issuer is None else (issuer[0], issuer[1].subject)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if not is_ca:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return key, builder.sign(signing_key, hashes.SHA256())


class MetadataGrpcServer:
    """ml_metadata's MetadataStoreService on a local port, over a SQLite MLMD store.

    `with MetadataGrpcServer(path) as server: server.address` is a store address for
    `components.lineage` (`127.0.0.1:PORT`, or `grpcs://127.0.0.1:PORT?ca=CA_FILE` with `tls`).
    """

    def __init__(
        self, sqlite_path: Path | str, *, tls: TlsFiles | None = None, version: str = VERSIONS[0]
    ) -> None:
        if version not in VERSIONS:
            raise ValueError(f"version {version!r} is not one of {VERSIONS}")
        self.sqlite_path = Path(sqlite_path)
        self.tls = tls
        self.version = version  # the server's ml_metadata version (module docstring)
        self.port = 0
        self._server: grpc.Server | None = None

    @property
    def address(self) -> str:
        """The store address a client passes to reach this server."""
        if self.tls is None:
            return f"{HOST}:{self.port}"
        return f"grpcs://{HOST}:{self.port}?ca={self.tls.ca_cert}"

    def start(self) -> MetadataGrpcServer:
        config = mlmd.ConnectionConfig()
        config.sqlite.filename_uri = str(self.sqlite_path)
        config.sqlite.connection_mode = mlmd.SqliteMetadataSourceConfig.READWRITE_OPENCREATE
        store = metadata_store.MetadataStore(config)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        metadata_store_service_pb2_grpc.add_MetadataStoreServiceServicer_to_server(
            _servicer(store, self.version), server
        )
        if self.tls is None:
            self.port = server.add_insecure_port(f"{HOST}:0")
        else:
            credentials = grpc.ssl_server_credentials(
                [(self.tls.server_key.read_bytes(), self.tls.server_cert.read_bytes())]
            )
            self.port = server.add_secure_port(f"{HOST}:0", credentials)
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None

    def __enter__(self) -> MetadataGrpcServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _servicer(
    store: metadata_store.MetadataStore, version: str
) -> metadata_store_service_pb2_grpc.MetadataStoreServiceServicer:
    """The generated servicer with each RPC the C++ store implements forwarded to it.

    The rest (GetLineageGraph and the parent/child context batch reads, which the Python
    binding lacks) keep the generated UNIMPLEMENTED answer.
    """
    servicer = metadata_store_service_pb2_grpc.MetadataStoreServiceServicer()
    lock = threading.Lock()  # one store connection: calls take turns, as in-process
    for method in SERVICE.methods:
        if hasattr(cc_store, method.name):
            unknown = _NEWER_THAN_1_14.get(method.name, ()) if version == "1.14.0" else ()
            setattr(servicer, method.name, _forward(store, lock, method, unknown))
    return servicer


def _forward(
    store: metadata_store.MetadataStore,
    lock: threading.Lock,
    method: Any,
    unknown: tuple[tuple[str, ...], ...],
) -> Any:
    """The RPC `method` run by `store`, with the request's `unknown` fields cleared first."""
    response_class = getattr(metadata_store_service_pb2, method.output_type.name)

    def call(request: Any, context: grpc.ServicerContext) -> Any:
        response = response_class()
        for *parents, field in unknown:
            message = request
            for name in parents:
                message = getattr(message, name)
            message.ClearField(field)
        try:
            with lock:
                store._call_method(method.name, request, response)
        except errors.StatusError as err:
            context.abort(_GRPC_CODES.get(err.error_code, grpc.StatusCode.UNKNOWN), err.message)
        return response

    return call
