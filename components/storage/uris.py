"""Where a file is (a local path or a `gs://` URI) and what identifies its bytes."""

from __future__ import annotations

import base64
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import google_crc32c

from contracts.errors import UserError

GS = "gs://"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
CHUNK = 1 << 20  # bytes read at a time when hashing or streaming


def is_gcs(uri: str | os.PathLike[str]) -> bool:
    """True for a `gs://` URI, False for a local path; any other scheme is refused.

    Every storage function decides local-or-GCS here, so this is where a `minio://` or `s3://`
    URI (KFP's default pipeline root is `minio://mlpipeline/v2/artifacts`) stops, instead of
    silently becoming a relative local path inside a pod.
    """
    text = str(uri)
    if text.startswith(GS):
        return True
    scheme = _SCHEME.match(text)
    if scheme:
        raise UserError(
            f"{text!r}: gptpipe stores artifacts on gs:// or a local path, not {scheme[0]}; "
            "on a cluster, set KFP's pipeline root (its defaultPipelineRoot setting, or "
            "`gptpipe compile --pipeline-root gs://BUCKET/PATH`) and artifact_root to gs://"
        )
    return False


def check_shared_root(uri: str, what: str, *, in_cluster: bool) -> None:
    """Refuse a root other steps and pods cannot reach: empty, or a local path in a cluster.

    Each KFP task runs in its own pod with its own disk, so on a cluster everything shared
    between steps and TFJob workers must be on gs://; locally (kfp.local) any path is shared.
    """
    if not uri:
        raise UserError(
            f"{what} is empty: pass {what}=gs://BUCKET/PATH, or compile with "
            "`gptpipe compile --pipeline-root gs://BUCKET/PATH`, which makes it the default"
        )
    if in_cluster and not is_gcs(uri):
        raise UserError(
            f"{what} {uri!r} is a local path, which other pods cannot see: use gs://BUCKET/PATH"
        )


def join(base: str | os.PathLike[str], *parts: str) -> str:
    """Join path parts onto a local path or a gs:// URI."""
    if not is_gcs(base):
        return str(Path(base, *parts))
    return "/".join([str(base).rstrip("/"), *(p.strip("/") for p in parts)])


def split_gcs(uri: str) -> tuple[str, str]:
    """Split `gs://bucket/key` into (bucket, key); the key may be ""."""
    bucket, _, key = uri[len(GS) :].partition("/")
    if not bucket:
        raise UserError(f"{uri!r} names no bucket; write gs://BUCKET/PATH")
    if unsafe_name(key):
        raise UserError(
            f"{uri!r}: a gs:// key is a name, not a path: GCS keeps '..', '.' and a leading '/' "
            "literally, so this names some other object; write the key without them"
        )
    return bucket, key


def unsafe_name(relative: str) -> bool:
    """True for an object or file name that is absolute or walks out (`..`, `.` segments).

    Such names are legal in GCS but would land outside a folder they are copied into, or name
    an object other than the one a path-minded reader means.
    """
    parts = relative.split("/")
    return relative.startswith("/") or any(p in ("..", ".") for p in parts)


def has_wildcard(pattern: str) -> bool:
    """True if a path or key holds a glob wildcard (`*`, `?` or `[`)."""
    return any(ch in pattern for ch in "*?[")


def folder_key(key: str) -> str:
    """The listing prefix of the folder `key`: "a/b" -> "a/b/", the bucket's root -> ""."""
    return key.rstrip("/") + "/" if key else ""


@dataclass(frozen=True)
class FileInfo:
    """One source file or object: where it is, how big, and a content fingerprint.

    Local files carry the sha256 of their bytes. `gs://` objects carry what GCS already
    knows, read from the listing without downloading: crc32c, md5 (absent for composite
    objects) and the generation (which changes on every write, even of the same bytes).
    """

    uri: str  # the absolute path, or the gs:// URI
    size: int  # bytes
    sha256: str  # hex digest of the content; "" for gs:// objects (it would need a download)
    generation: int | None = None  # gs:// only: the object's generation when listed
    crc32c: str = ""  # gs:// only: base64 big-endian CRC32C, as GCS reports it
    md5: str = ""  # gs:// only: base64 MD5, "" for composite objects

    @property
    def fingerprint(self) -> str:
        """A content fingerprint: the sha256 locally, crc32c+md5+size for gs:// objects."""
        if not is_gcs(self.uri):
            return self.sha256
        return f"crc32c={self.crc32c};md5={self.md5};size={self.size}"


class ObjectChangedError(UserError):
    """A file or object was rewritten between the step listing it and reading it."""


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Return the hex sha256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def crc32c_file(path: str | os.PathLike[str]) -> str:
    """Return a local file's CRC32C as GCS reports it (base64 of the big-endian value)."""
    checksum = google_crc32c.Checksum()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            checksum.update(chunk)
    return crc32c_b64(checksum)


def crc32c_b64(checksum: google_crc32c.Checksum) -> str:
    """A running CRC32C as GCS writes it: base64 of the big-endian value."""
    return base64.b64encode(checksum.digest()).decode("ascii")
