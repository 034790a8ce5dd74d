"""Store addressing: one string names an ML Metadata store, a SQLite file or a gRPC service.

- a local path: a SQLite file, created on first use;
- `host:port` or `grpc://host:port`: an MLMD gRPC service in plaintext, such as KFP's
  `metadata-grpc-service.kubeflow:8080`;
- `grpcs://host:port`: the same over TLS, trusting gRPC's default roots, or
  `grpcs://host:port?ca=/path/ca.pem` trusting the CA certificates in that PEM file instead.

`store_address` picks the address once, at a component's edge; everything below takes it as a
plain argument. `open_store` opens one with a client that retries, for a bounded time, the
calls that concurrent writers lock out for a moment (`LOCK_RETRY_S`).
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ml_metadata import errors
from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

from contracts.errors import UserError

# The generated protos have no type stubs; annotations in this package name them as Any.
mlmd: Any = metadata_store_pb2

# What KFP puts in every step's main container. KFP 2.5.0's compiler gives the executor
# container `envFrom: metadata-grpc-configmap` (optional), `metadataEnvFrom` in
# backend/src/v2/compiler/argocompiler/common.go, used in argocompiler/container.go; the names
# are backend/src/v2/component/constants.go (`EnvMetadataHost`, `EnvMetadataPort`), and the
# ConfigMap's values are manifests/kustomize/base/metadata/base/metadata-grpc-configmap.yaml
# (per profile in multi-user mode: `metadata-grpc-service.kubeflow`, `8080`). KFP's own client
# (backend/src/v2/metadata/client.go) talks to it in plaintext.
KFP_HOST_ENV = "METADATA_GRPC_SERVICE_HOST"
KFP_PORT_ENV = "METADATA_GRPC_SERVICE_PORT"

# Every RPC's deadline (MetadataStoreClientConfig.client_timeout_sec), so a service that accepts
# connections but never answers fails a call instead of hanging it. Lineage calls are small.
RPC_TIMEOUT_S = 60.0

# How long a call is tried again while other writers hold the store's lock (SQLite allows one
# writer at a time; a server's database reports deadlocks the same way): no new try starts
# later than this after the first. A step's writes take milliseconds, so this is only reached
# when something holds the lock for good.
LOCK_RETRY_S = 30.0
_FIRST_BACKOFF_S = 0.02  # the first wait; each later one doubles, up to _MAX_BACKOFF_S
_MAX_BACKOFF_S = 1.0
# ml_metadata 1.17's SQLite source turns "database is locked" into ABORTED with this message
# (sqlite_metadata_source.cc, RunStatement); opening a store raises it as a RuntimeError.
_LOCKED_MESSAGE = "Concurrent writes aborted"
# Type registrations, which two writers may race to make; the loser's second try finds the type.
_TYPE_PUTS = frozenset({"PutArtifactType", "PutExecutionType", "PutContextType"})
_T = TypeVar("_T")

_SERVICE_RE = re.compile(
    r"(?:(?P<scheme>grpcs?)://)?(?P<host>[A-Za-z0-9.\-]+):(?P<port>\d{1,5})(?:\?(?P<query>.*))?"
)
_HOST_RE = re.compile(r"[A-Za-z0-9.\-]+")
# A host name, a colon and a port that is no port ("mlmd:", "mlmd:80800", "mlmd:http"): refused
# by name rather than taken for a SQLite file of that name ("run-10:30.sqlite" is a file).
_ADDRESS_LIKE_RE = re.compile(r"[A-Za-z0-9.\-]+:(\d*|[A-Za-z]+)")
_FORMS = "a SQLite path, host:port, grpc://host:port or grpcs://host:port[?ca=CA_FILE]"


@dataclass(frozen=True)
class _Service:
    """A parsed gRPC address."""

    host: str
    port: int
    tls: bool
    ca_file: str | None  # PEM file of the CAs to trust (grpcs:// only); None: gRPC's roots


def store_address(param: str, env: Mapping[str, str]) -> str:
    """The store address a step uses: `param` if given, else the MLMD service KFP injected.

    Called once at a component's edge with `os.environ`. An empty `param` means "the service
    KFP names in METADATA_GRPC_SERVICE_HOST and METADATA_GRPC_SERVICE_PORT" (plaintext, as KFP
    itself connects). With neither, or a malformed address, raises UserError; nothing is read
    or contacted.
    """
    address = param.strip()
    if address:
        _parse_service(address)
        return address
    host, port = env.get(KFP_HOST_ENV, "").strip(), env.get(KFP_PORT_ENV, "").strip()
    if not (host and port):
        raise UserError(
            f"no metadata store: pass the `metadata` parameter ({_FORMS}), or run in a KFP pod, "
            f"where {KFP_HOST_ENV} and {KFP_PORT_ENV} come from the metadata-grpc-configmap "
            "ConfigMap (it is missing from this namespace)"
        )
    if not (_HOST_RE.fullmatch(host) and port.isdigit() and 0 < int(port) < 65536):
        raise UserError(
            f"{KFP_HOST_ENV}={host!r} and {KFP_PORT_ENV}={port!r} do not form host:port: fix "
            "the metadata-grpc-configmap ConfigMap or pass the `metadata` parameter"
        )
    return f"{host}:{port}"


def store_config(uri: str, *, timeout_s: float = RPC_TIMEOUT_S) -> Any:
    """Build the MLMD connection config for a store address (gRPC service or SQLite path).

    For `grpcs://...?ca=CA_FILE` the CA file is read here, so a missing or invalid one is a
    UserError naming it before any connection.
    """
    uri = uri.strip()
    if not uri:
        raise UserError(f"metadata store address is empty: pass {_FORMS}")
    service = _parse_service(uri)
    if service is None:
        config = mlmd.ConnectionConfig()
        config.sqlite.filename_uri = str(Path(uri).expanduser().resolve())
        config.sqlite.connection_mode = mlmd.SqliteMetadataSourceConfig.READWRITE_OPENCREATE
        return config
    config = mlmd.MetadataStoreClientConfig(
        host=service.host, port=service.port, client_timeout_sec=timeout_s
    )
    if service.tls:
        config.ssl_config.SetInParent()  # present, even empty, means TLS to ml_metadata
        if service.ca_file is not None:
            config.ssl_config.custom_ca = _read_ca(uri, service.ca_file)
    return config


def is_service(uri: str) -> bool:
    """True when a store address names an MLMD gRPC service rather than a SQLite file."""
    uri = uri.strip()
    return uri.startswith(("grpc://", "grpcs://")) or _ADDRESS_LIKE_RE.fullmatch(uri) is not None


def open_store(uri: str, *, timeout_s: float = RPC_TIMEOUT_S) -> metadata_store.MetadataStore:
    """Open the raw MLMD store at an address; for tests and tools that need the MLMD API.

    A SQLite store's parent folder is created; a path that cannot hold a store (its folder
    cannot be made, it is a folder, or it is not a SQLite file) is a UserError naming it. A
    gRPC store is not contacted until first use; a call the service does not answer within
    `timeout_s` (down, unreachable, or its TLS certificate not trusted) is then a UserError
    naming the address. Every call is retried while other writers lock the store, for
    `LOCK_RETRY_S` at most (`_Store`).
    """
    config = store_config(uri, timeout_s=timeout_s)
    if isinstance(config, mlmd.ConnectionConfig):
        return _open_sqlite(config, uri.strip())
    return _ServiceStore(config, uri.strip())


def _open_sqlite(config: Any, address: str) -> metadata_store.MetadataStore:
    """A SQLite store; opening one also creates or checks its schema, a write like any other."""
    path = Path(config.sqlite.filename_uri)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(
            f"metadata store {address} cannot be opened: cannot make its folder {path.parent} "
            f"({err.strerror}): pass a path in a writable folder"
        ) from None
    try:
        return _retry_locked(lambda: _Store(config, address), address, "opening")
    except errors.AbortedError as err:  # locked past LOCK_RETRY_S: its message names the store
        raise UserError(str(err)) from None
    except (RuntimeError, errors.StatusError) as err:
        raise UserError(
            f"metadata store {address} cannot be opened ({failure_reason(err)}): pass a writable "
            "ML Metadata SQLite file, or a path where one can be created"
        ) from None


class _Store(metadata_store.MetadataStore):
    """MLMD's client, retrying what concurrent writers make fail for a moment.

    Every public method of ml_metadata 1.17's client goes through `MetadataStore._call`, and
    that through `_call_method`, one call to the C++ store or one RPC; overriding `_call`
    covers all of record.py's and query.py's calls, and tests/faults/test_lineage_faults.py
    fails if a new ml_metadata moves that path. ml_metadata's own loop here retries ABORTED
    five times, 2 s apart on average, logging an ERROR each time it gives up; this one instead:

    - retries ABORTED (SQLite's "database is locked"; a server's deadlock) with jittered
      backoff from 20 ms up to 1 s, for `LOCK_RETRY_S` in all. A call is one transaction that
      MLMD rolls back when any statement or the commit fails, so a retry never writes twice;
    - retries a type registration once when it raced another writer's (ALREADY_EXISTS): the
      second try finds the type, and a real clash of property kinds fails again and is raised.
    """

    def __init__(self, config: Any, address: str) -> None:
        super().__init__(config)
        self._address = address

    def _call(
        self, method_name: str, request: Any, response: Any, extra_options: Any = None
    ) -> Any:
        def once() -> Any:
            try:
                return self._call_method(method_name, request, response)
            except errors.AlreadyExistsError:
                if method_name not in _TYPE_PUTS:
                    raise
                return self._call_method(method_name, request, response)

        return _retry_locked(once, self._address, method_name)


class _ServiceStore(_Store):
    """An MLMD gRPC client that names its address when the service does not answer."""

    def __init__(self, config: Any, address: str) -> None:
        super().__init__(config, address)
        self._client_config = config

    def _call(
        self, method_name: str, request: Any, response: Any, extra_options: Any = None
    ) -> Any:
        try:
            return super()._call(method_name, request, response, extra_options)
        except (errors.UnavailableError, errors.DeadlineExceededError) as err:
            raise UserError(_unreachable_message(self._address, self._client_config, err)) from None


def _retry_locked(call: Callable[[], _T], address: str, what: str) -> _T:
    """`call()`, again after a growing, jittered wait while the store is locked.

    After `LOCK_RETRY_S` it raises AbortedError, naming the store and what was locked out.
    """
    deadline = time.monotonic() + LOCK_RETRY_S
    backoff = _FIRST_BACKOFF_S
    while True:
        try:
            return call()
        except (RuntimeError, errors.AbortedError) as err:
            if not _is_locked(err):
                raise
            if time.monotonic() + backoff > deadline:
                raise errors.AbortedError(
                    f"metadata store {address} stayed locked by other writers for "
                    f"{LOCK_RETRY_S:g} s ({what}): {failure_reason(err)}"
                ) from None
        # Full jitter, so writers that collided do not collide again at the same moment.
        time.sleep(random.uniform(0, backoff))
        backoff = min(backoff * 2, _MAX_BACKOFF_S)


def _is_locked(err: BaseException) -> bool:
    """True for MLMD's report of a lock another writer holds (ABORTED, or at open its text)."""
    return isinstance(err, errors.AbortedError) or _LOCKED_MESSAGE in str(err)


def failure_reason(err: BaseException) -> str:
    """An MLMD error on one line, without the SQL statement MLMD appends to some."""
    text = " ".join(str(err).split())
    # "...Error when executing query: <why> query: <the SQL>": keep the why.
    return re.sub(r"(executing query: .*?) query: .*", r"\1", text).rstrip(".")


def _parse_service(uri: str) -> _Service | None:
    """The gRPC address in `uri`, None for a SQLite path; UserError for a malformed address."""
    match = _SERVICE_RE.fullmatch(uri)
    if match is None:
        if "://" in uri or _ADDRESS_LIKE_RE.fullmatch(uri):
            raise UserError(f"metadata store {uri!r} is not supported: pass {_FORMS}")
        return None
    port, tls, query = int(match["port"]), match["scheme"] == "grpcs", match["query"]
    if not 0 < port < 65536:
        raise UserError(f"metadata store {uri!r}: port {port} is not in 1-65535")
    if query is None:
        return _Service(match["host"], port, tls, None)
    # The CA path is taken verbatim, not URL-decoded, so any file name works as written.
    if not (tls and query.startswith("ca=") and len(query) > len("ca=")):
        raise UserError(
            f"metadata store {uri!r}: the only option is ?ca=CA_FILE, with grpcs:// (a PEM "
            "file of the CAs that signed the service's certificate)"
        )
    return _Service(match["host"], port, tls, query[len("ca=") :])


def _read_ca(uri: str, ca_file: str) -> str:
    """The PEM text of a CA file, checked enough that a wrong file is named, not a TLS error."""
    path = Path(ca_file).expanduser()
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"metadata store {uri!r}: cannot read CA file {path}: {err}") from None
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise UserError(
            f"metadata store {uri!r}: CA file {path} holds no PEM certificate "
            "(-----BEGIN CERTIFICATE-----)"
        )
    return text


def _unreachable_message(uri: str, config: Any, err: errors.StatusError) -> str:
    """One line saying why a gRPC store did not answer, and what to check."""
    reason = " ".join(str(err).split())
    if isinstance(err, errors.DeadlineExceededError):
        reason = f"no answer within {config.client_timeout_sec:g} s"
    if config.HasField("ssl_config") and re.search(r"ssl|handshake|certificate", reason, re.I):
        fix = (
            "the TLS handshake failed: check that the service speaks TLS and that the CA "
            "(grpcs://host:port?ca=CA_FILE) signed its certificate for this host name"
        )
    else:
        fix = "check the address, that the MLMD gRPC service runs, and whether it needs grpcs://"
    return f"metadata store {uri} is unreachable ({reason}): {fix}"
