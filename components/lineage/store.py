"""Store addressing: one string names an ML Metadata store, a SQLite file or a gRPC service.

A local path is a SQLite file (created on first use), and `host:port` or `grpc://host:port` is
an MLMD gRPC service, such as KFP's `metadata-grpc-service.kubeflow:8080`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

from contracts.errors import UserError

# The generated protos have no type stubs; annotations in this package name them as Any.
mlmd: Any = metadata_store_pb2

_GRPC_RE = re.compile(r"(?:grpc://)?(?P<host>[A-Za-z0-9.\-]+):(?P<port>\d{1,5})")


def store_config(uri: str) -> Any:
    """Build the MLMD connection config for a store address (gRPC service or SQLite path)."""
    uri = uri.strip()
    if not uri:
        raise UserError("metadata store address is empty: pass a SQLite path or host:port")
    grpc_match = _GRPC_RE.fullmatch(uri)
    if grpc_match:
        return mlmd.MetadataStoreClientConfig(host=grpc_match["host"], port=int(grpc_match["port"]))
    if "://" in uri:
        raise UserError(
            f"metadata store {uri!r} is not supported: pass a local SQLite path "
            "or an MLMD gRPC address (host:port or grpc://host:port)"
        )
    config = mlmd.ConnectionConfig()
    config.sqlite.filename_uri = str(Path(uri).expanduser().resolve())
    config.sqlite.connection_mode = mlmd.SqliteMetadataSourceConfig.READWRITE_OPENCREATE
    return config


def is_service(uri: str) -> bool:
    """True when a store address names an MLMD gRPC service rather than a SQLite file."""
    return _GRPC_RE.fullmatch(uri.strip()) is not None


def open_store(uri: str) -> metadata_store.MetadataStore:
    """Open the raw MLMD store at an address; for tests and tools that need the MLMD API.

    A SQLite store's parent folder is created. A gRPC store is not contacted until first use.
    """
    config = store_config(uri)
    if isinstance(config, mlmd.ConnectionConfig):
        Path(config.sqlite.filename_uri).parent.mkdir(parents=True, exist_ok=True)
    return metadata_store.MetadataStore(config)
