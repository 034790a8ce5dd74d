"""Google Cloud Storage through google-cloud-storage: the client, and every call this layer makes.

- retries with exponential backoff on 429, 408, 5xx and connection errors (`retry()`), passed on
  every call, uploads included: every object this layer writes is a fresh key or a rewrite
  of the same bytes, so retrying a write is safe;
- resumable uploads in `UPLOAD_CHUNK_BYTES` chunks for objects over `RESUMABLE_THRESHOLD`, so
  a dropped connection resends one chunk, not the file;
- crc32c checked on every transfer: by the client on whole-object uploads and downloads, and
  here on streamed reads (`open_read`);
- a thread pool (`WORKERS`, `parallel`) for folders of many objects.

The client is made once per process by `client()`. google-cloud-storage itself reads
`STORAGE_EMULATOR_HOST` (and then uses anonymous credentials), which is how tests and
`gptpipe run --local` point it at gcp-storage-emulator; `set_client` replaces it.

Mistakes a user can make (a missing bucket, 403, an empty prefix, an object replaced while a
step reads it) raise one `UserError` naming the URI.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import io
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import google_crc32c

from components.storage.uris import (
    GS,
    FileInfo,
    ObjectChangedError,
    crc32c_b64,
    folder_key,
    has_wildcard,
    split_gcs,
)
from contracts.errors import UserError

if TYPE_CHECKING:
    from google.cloud import storage as google_storage

WORKERS = 8  # threads for folders of many objects; GCS serves each object independently
RESUMABLE_THRESHOLD = 8 << 20  # bigger objects upload in resumable chunks (the client's own cut)
UPLOAD_CHUNK_BYTES = 8 << 20  # resumable chunk; GCS requires a multiple of 256 KiB
READ_CHUNK_BYTES = 4 << 20  # one ranged GET of a streamed read
# 0.5 s, 1 s, 2 s ... up to 32 s between tries, for at most 5 minutes per call.


@functools.cache
def retry() -> Any:
    """The client's DEFAULT_RETRY with our backoff (exponential from 0.5 s to 32 s, 300 s in
    all). google-cloud-storage is imported on first use, here and in `client`: a process that
    touches no gs:// URI (a local run's steps and parts, most commands) never loads it, 0.25 s
    of start-up each."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    return DEFAULT_RETRY.with_delay(initial=0.5, maximum=32.0, multiplier=2.0).with_timeout(300.0)


def api_errors() -> Any:
    """google.api_core.exceptions, imported on first use (`retry`)."""
    from google.api_core import exceptions

    return exceptions


_T = TypeVar("_T")


# ---- the client -----------------------------------------------------------------------------

_CLIENT: dict[str, google_storage.Client] = {}  # the process's client, made on first use
_CLIENT_LOCK = threading.Lock()


def client() -> google_storage.Client:
    """The process's google-cloud-storage client (it honours STORAGE_EMULATOR_HOST)."""
    from google.auth.exceptions import DefaultCredentialsError

    with _CLIENT_LOCK:
        if "client" not in _CLIENT:
            try:
                from google.cloud import storage as google_storage

                _CLIENT["client"] = google_storage.Client()
            except DefaultCredentialsError as e:
                reason = str(e).split(". ")[0].rstrip(".")
                raise UserError(
                    f"no Google Cloud credentials to reach gs:// ({reason}): run `gcloud auth "
                    "application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a key "
                    "file (in a cluster: Workload Identity for the pipeline's service account)"
                ) from None
        return _CLIENT["client"]


def set_client(new: google_storage.Client | None) -> None:
    """Use `new` for every later call; None makes a fresh default client on next use."""
    with _CLIENT_LOCK:
        _CLIENT.clear()
        if new is not None:
            _CLIENT["client"] = new


def _blob(uri: str, generation: int | None = None) -> google_storage.Blob:
    bucket, key = split_gcs(uri)
    if not key:
        raise UserError(f"{uri!r} names a bucket, not an object")
    return client().bucket(bucket).blob(key, generation=generation)


class ObjectNotFound(UserError):
    """An object that is not there (404) in a bucket that is."""


@contextlib.contextmanager
def _errors(uri: str) -> Iterator[None]:
    """Turn GCS errors a user can cause into one UserError that names the URI."""
    try:
        yield
    except api_errors().Forbidden as e:
        bucket = split_gcs(uri)[0]
        raise UserError(
            f"permission denied (403) on {uri}: grant the pipeline's service account "
            f"roles/storage.objectAdmin (or objectViewer to read) on bucket {bucket!r}; "
            f"GCS said: {e.message}"
        ) from None
    except api_errors().Unauthorized:
        raise UserError(
            f"not authenticated (401) for {uri}: run `gcloud auth application-default login` "
            "or set GOOGLE_APPLICATION_CREDENTIALS"
        ) from None
    except api_errors().NotFound:
        bucket = split_gcs(uri)[0]
        if not _bucket_exists(bucket):
            raise UserError(
                f"bucket {bucket!r} does not exist (from {uri}); create it or fix the URI"
            ) from None
        raise ObjectNotFound(f"object {uri} not found") from None


def _bucket_exists(bucket: str) -> bool:
    try:
        return client().bucket(bucket).exists(retry=retry())
    except api_errors().Forbidden:
        return True  # it exists; we may not read its metadata


def _info(bucket: str, blob: google_storage.Blob) -> FileInfo:
    return FileInfo(
        f"{GS}{bucket}/{blob.name}",
        int(blob.size or 0),
        "",
        int(blob.generation) if blob.generation is not None else None,
        blob.crc32c or "",
        blob.md5_hash or "",
    )


def parallel(fn: Callable[[Any], _T], items: Iterable[Any], workers: int) -> list[_T]:
    """Run fn over items on a thread pool; the first error is raised after all finish."""
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        return list(pool.map(fn, items))


# ---- listing --------------------------------------------------------------------------------


def _hidden(key: str, under: str) -> bool:
    """True for a folder placeholder or a name under `under` with a part starting with '.'."""
    rest = key[len(under) :]
    return key.endswith("/") or any(part.startswith(".") for part in rest.split("/"))


def _glob_regex(glob: str) -> re.Pattern[str]:
    """Translate a glob on object names: `*`, `?`, `[..]` stay in one `/` level, `**` crosses."""
    out = []
    for token in re.split(r"(\*\*|\*|\?|\[[^]]*\])", glob):
        if token == "**":
            out.append(".*")
        elif token == "*":
            out.append("[^/]*")
        elif token == "?":
            out.append("[^/]")
        elif token.startswith("[") and token.endswith("]") and len(token) > 2:
            out.append(fnmatch.translate(token)[4:-3])  # fnmatch's character class
        else:
            out.append(re.escape(token))
    return re.compile("".join(out) + r"\Z")


def _list_blobs(bucket: str, prefix: str, uri: str, **kwargs: Any) -> list[google_storage.Blob]:
    with _errors(uri):
        return list(client().list_blobs(bucket, prefix=prefix, retry=retry(), **kwargs))


def list_files(pattern: str) -> list[FileInfo]:
    """`storage.list_files` for a gs:// object, prefix or glob; downloads nothing. An object
    named exactly is taken as it is, even when its name holds `[`, `?` or `*`."""
    bucket, key = split_gcs(pattern)
    if has_wildcard(key):
        fixed = key[: min(key.index(c) for c in "*?[" if c in key)]
        under = fixed[: fixed.rfind("/") + 1]
        listed = _list_blobs(bucket, under, pattern)
        exact = [b for b in listed if b.name == key and not key.endswith("/")]
        if exact:
            return [_info(bucket, exact[0])]
        regex = _glob_regex(key)
        blobs = [b for b in listed if regex.match(b.name) and not _hidden(b.name, under)]
        return [_info(bucket, b) for b in blobs]
    folder = folder_key(key)
    blobs = _list_blobs(bucket, key.rstrip("/"), pattern)
    # A key ending in "/" names a folder: its zero-byte placeholder (the Cloud Console's
    # "Create folder", TensorFlow's makedirs) is no file, and the folder's files are listed.
    exact = [b for b in blobs if b.name == key and not key.endswith("/")]
    if exact:
        return [_info(bucket, exact[0])]
    members = [b for b in blobs if b.name.startswith(folder) and not _hidden(b.name, folder)]
    if not members:
        raise UserError(
            f"nothing at {pattern}: bucket {bucket!r} has no object {key!r} and no objects "
            f"under {folder!r}; check the prefix"
        )
    return [_info(bucket, b) for b in members]


def list_tree(uri: str) -> dict[str, FileInfo]:
    """`storage.list_tree` for a gs:// prefix: every object under it, by relative name."""
    bucket, key = split_gcs(uri)
    folder = folder_key(key)
    blobs = _list_blobs(bucket, folder, uri)
    return {b.name[len(folder) :]: _info(bucket, b) for b in blobs if not b.name.endswith("/")}


def folder_markers(uri: str) -> list[str]:
    """The empty `<folder>/` objects under a folder (and its own), which some writers leave."""
    bucket, key = split_gcs(uri)
    folder = folder_key(key)
    blobs = _list_blobs(bucket, folder, uri)
    return [f"gs://{bucket}/{b.name}" for b in blobs if b.name.endswith("/") and not b.size]


def has_content(uri: str) -> bool:
    """True if `uri` is an object, or a prefix with objects under it."""
    bucket, key = split_gcs(uri)
    key = key.rstrip("/")
    folder = folder_key(key)
    return bool(_list_blobs(bucket, folder, uri, max_results=1)) or is_object(uri)


def is_object(uri: str) -> bool:
    """True if `uri` names an object (not a prefix, not the bucket)."""
    bucket, key = split_gcs(uri)
    if not key.rstrip("/"):
        return False
    with _errors(uri):
        return client().bucket(bucket).blob(key.rstrip("/")).exists(retry=retry())


def subfolders(uri: str) -> list[str]:
    """Names of the immediate sub-folders (common prefixes) of a gs:// folder."""
    bucket, key = split_gcs(uri)
    folder = folder_key(key)
    with _errors(uri):
        listing = client().list_blobs(bucket, prefix=folder, delimiter="/", retry=retry())
        list(listing)
    return [p[len(folder) :].rstrip("/") for p in listing.prefixes]


def folders_holding(uri: str, name: str) -> list[str]:
    """Names of the immediate sub-folders of a gs:// folder that hold an object `name`."""
    bucket, key = split_gcs(uri)
    folder = folder_key(key)
    blobs = _list_blobs(bucket, folder, uri, match_glob=f"{folder}*/{name}")
    return sorted({b.name[len(folder) :].split("/")[0] for b in blobs})


# ---- read -----------------------------------------------------------------------------------


class _CheckedGcsReader(io.RawIOBase):
    """A streamed read of one object that checks, at the end, it read what was listed.

    Every ranged GET asks for the listed generation (`if_generation_match`), so real GCS
    fails with 412 as soon as the object is replaced. The end-of-stream check (crc32c of the
    bytes read, then the live generation) catches the same thing on servers that ignore
    preconditions, and corruption anywhere.
    """

    def __init__(self, uri: str, expect: FileInfo | None) -> None:
        super().__init__()
        self._uri = uri
        self._expect = expect
        generation = expect.generation if expect else None
        kwargs: dict[str, Any] = {"retry": retry()}
        if generation is not None:
            kwargs["if_generation_match"] = generation
        with _errors(uri):
            blob = _blob(uri)
            blob.reload(retry=retry())
        self._blob = blob
        self._listed = expect or _info(split_gcs(uri)[0], blob)
        self._check_generation(blob.generation)
        self._raw = blob.open("rb", chunk_size=READ_CHUNK_BYTES, **kwargs)
        self._crc = google_crc32c.Checksum()
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            with _errors(self._uri):
                data = self._raw.read(len(buffer))
        except api_errors().PreconditionFailed:
            raise self._changed("replaced while being read") from None
        if not data and not self._done:
            self._done = True
            self._verify()
        self._crc.update(data)
        buffer[: len(data)] = data
        return len(data)

    def _verify(self) -> None:
        crc = crc32c_b64(self._crc)
        with _errors(self._uri):
            self._blob.reload(retry=retry())
        self._check_generation(self._blob.generation)
        if self._listed.crc32c and crc != self._listed.crc32c:
            raise self._changed(f"read bytes with crc32c {crc}, listed {self._listed.crc32c}")

    def _check_generation(self, live: int | None) -> None:
        listed = self._listed.generation
        if listed is not None and live is not None and int(live) != listed:
            raise self._changed(f"generation {listed} when listed, {live} now")

    def _changed(self, detail: str) -> ObjectChangedError:
        return ObjectChangedError(
            f"object {self._uri} changed during the run ({detail}); rerun the step so it "
            "reads one consistent version, and do not write to its input while it runs"
        )

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


def open_read(uri: str, expect: FileInfo | None, buffer_size: int) -> io.BufferedReader:
    """A buffered, checked streamed read of one object (see `storage.open_read`)."""
    return io.BufferedReader(_CheckedGcsReader(uri, expect), buffer_size=buffer_size)


# ---- write, copy and delete -----------------------------------------------------------------


def write_bytes(uri: str, data: bytes) -> None:
    """Write one object in one request (GCS replaces an object whole)."""
    with _errors(uri):
        _blob(uri).upload_from_string(data, retry=retry(), checksum="crc32c")


def create_object(uri: str, data: bytes) -> bool:
    """Write an object only if none exists (`ifGenerationMatch=0`); True if this call made it.

    A retried create whose first try landed (the response was lost) meets its own object and
    is refused with 412; the bytes read back tell that case apart, so `data` should be unique
    to the writer (a claim holds a random token).
    """
    try:
        with _errors(uri):
            _blob(uri).upload_from_string(
                data, retry=retry(), checksum="crc32c", if_generation_match=0
            )
        return True
    except api_errors().PreconditionFailed:
        return read_generation(uri)[0] == data


def read_generation(uri: str) -> tuple[bytes | None, int]:
    """An object's bytes and generation; (None, 0) if it does not exist (0: "create only")."""
    blob = _blob(uri)
    with _errors(uri):
        try:
            blob.reload(retry=retry())
            generation = int(blob.generation or 0)
            data = blob.download_as_bytes(
                retry=retry(), checksum="crc32c", if_generation_match=generation
            )
        except api_errors().NotFound:
            return None, 0
        except api_errors().PreconditionFailed:  # rewritten between the two requests: read again
            return read_generation(uri)
    return data, generation


def write_if_generation(uri: str, data: bytes, generation: int) -> bool:
    """Replace an object only if it is still at `generation` (0: absent); False if it moved."""
    try:
        with _errors(uri):
            _blob(uri).upload_from_string(
                data, retry=retry(), checksum="crc32c", if_generation_match=generation
            )
        return True
    except api_errors().PreconditionFailed:
        return False


def upload_file(path: str | os.PathLike[str], uri: str) -> FileInfo:
    """Upload one local file; resumable in chunks when large; the client checks crc32c."""
    size = os.path.getsize(path)
    blob = _blob(uri)
    if size > RESUMABLE_THRESHOLD:
        blob.chunk_size = UPLOAD_CHUNK_BYTES
    with _errors(uri):
        blob.upload_from_filename(str(path), retry=retry(), checksum="crc32c")
    return _info(split_gcs(uri)[0], blob)


def download_file(uri: str, path: str | os.PathLike[str]) -> None:
    """Download one object to a local file; the client checks crc32c of whole downloads."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with _errors(uri):
        _blob(uri).download_to_filename(str(path), retry=retry(), checksum="crc32c")


def copy_object(
    source: str, destination: str, *, if_generation_match: int | None = None
) -> FileInfo:
    """Server-side copy of one object (no bytes through here); return the new object."""
    src = _blob(source)
    dst_bucket, dst_key = split_gcs(destination)
    kwargs: dict[str, Any] = {"retry": retry()}
    if if_generation_match is not None:
        kwargs["if_generation_match"] = if_generation_match
    with _errors(source):
        new = src.bucket.copy_blob(src, client().bucket(dst_bucket), dst_key, **kwargs)
    return _info(dst_bucket, new)


def stat(uri: str) -> FileInfo | None:
    """One object's listing entry (size, generation, crc32c), or None if it does not exist."""
    blob = _blob(uri)
    with _errors(uri):
        try:
            blob.reload(retry=retry())
        except api_errors().NotFound:
            return None
    return _info(split_gcs(uri)[0], blob)


def delete_if_generation(uri: str, generation: int) -> bool:
    """Delete an object only if it is still at `generation`; False if it moved or is gone."""
    try:
        with _errors(uri):
            try:
                _blob(uri).delete(retry=retry(), if_generation_match=generation)
            except api_errors().NotFound:
                return False
        return True
    except api_errors().PreconditionFailed:
        return False


def delete_object(uri: str) -> None:
    """Delete one object; a missing one is fine."""
    with contextlib.suppress(api_errors().NotFound), _errors(uri):
        _blob(uri).delete(retry=retry())


def updated(uri: str) -> float:
    """When an object was last written, in epoch seconds (0.0 if GCS does not say)."""
    blob = _blob(uri)
    with _errors(uri):
        blob.reload(retry=retry())
    return blob.updated.timestamp() if blob.updated else 0.0
