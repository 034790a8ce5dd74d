"""KFP's object store access from inside a pod, for tests/doubles/kfp/launcher.py.

Follows KFP backend 2.5.0: backend/src/v2/component/launcher_v2.go (LocalPathForURI) and
backend/src/v2/objectstore/config.go (ParseBucketConfig, PrefixedBucket, KeyFromURI) and
object_store.go (UploadBlob, DownloadBlob), for gs:// only, through google-cloud-storage.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from google.cloud import storage as gcs_lib


class ObjectStoreError(RuntimeError):
    """What objectstore returns as an error."""


def local_path_for_uri(uri: str) -> str | None:
    """LocalPathForURI: where the launcher keeps an artifact inside the pod (gs:// only here)."""
    if uri.startswith("gs://"):
        return "/gcs/" + uri[len("gs://") :]
    return None  # minio://, s3://, oci:// are not reproduced; others are not storage URIs


@dataclass(frozen=True)
class BucketConfig:
    """objectstore.Config parsed from the run's root (ParseBucketConfig)."""

    bucket: str
    prefix: str  # "" or ending in "/"

    @classmethod
    def parse(cls, root: str) -> BucketConfig:
        if not root.startswith("gs://"):
            raise ObjectStoreError(
                f"parse bucket config failed: unsupported Cloud bucket: {root!r}"
            )
        bucket, _, prefix = root[len("gs://") :].partition("/")
        prefix = prefix.split("?")[0].lstrip("/")
        return cls(bucket, prefix if not prefix or prefix.endswith("/") else prefix + "/")

    def key_from_uri(self, uri: str) -> str:
        """KeyFromURI: a URI outside the run's root is an error, even without local files."""
        prefixed = "gs://" + "/".join(p for p in (self.bucket, self.prefix.rstrip("/")) if p)
        if not uri.startswith(prefixed):
            raise ObjectStoreError(f"URI {uri!r} does not have expected bucket prefix {prefixed!r}")
        key = uri[len(prefixed) :].lstrip("/")
        if not key:
            raise ObjectStoreError(f"URI {uri!r} has empty key given prefixed bucket {prefixed!r}")
        return self.prefix + key


def download(client: gcs_lib.Client, uri: str, local: str) -> None:
    """DownloadBlob: every object whose key starts with the artifact's key (no trailing slash),
    each read by its key (downloadFile's bucket.NewReader), into the file its key names
    relative to the artifact's. An empty `<folder>/` object is a file too: the artifact's
    own makes `local` a file, a sub-folder's a file where that folder must go
    (kubeflow/pipelines#13476)."""
    bucket, _, key = uri[len("gs://") :].partition("/")
    for blob in client.list_blobs(bucket, prefix=key):
        target = os.path.normpath(os.path.join(local, os.path.relpath(blob.name, key)))
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        client.bucket(bucket).blob(blob.name).download_to_filename(target)


def upload(client: gcs_lib.Client, bucket: str, local: str, key: str) -> None:
    """UploadBlob: a file, or a folder walked recursively; FileNotFoundError if it is missing."""
    if not os.path.exists(local):
        raise FileNotFoundError(local)
    if os.path.isfile(local):
        client.bucket(bucket).blob(key).upload_from_filename(local)
        return
    for entry in sorted(os.listdir(local)):
        upload(client, bucket, os.path.join(local, entry), f"{key}/{entry}")
