"""The storage layer: the only module that moves bytes for the pipeline steps.

Every public function takes a local path or a `gs://bucket/key` URI. `gs://` goes through
google-cloud-storage with:

- retries with exponential backoff on 429, 408, 5xx and connection errors (`RETRY`), passed on
  every call, uploads included: every object this module writes is a fresh key or a rewrite
  of the same bytes, so retrying a write is safe;
- resumable uploads in `UPLOAD_CHUNK_BYTES` chunks for objects over `RESUMABLE_THRESHOLD`, so
  a dropped connection resends one chunk, not the file;
- crc32c checked on every transfer: by the client on whole-object uploads and downloads, and
  here on streamed reads and published folders;
- a thread pool (`WORKERS`) for folders of many objects.

The trainer, inside TFJob workers, reads and writes `gs://` through TensorFlow's own file
system (`tf.io.gfile`, `tf.data`), never through this module.

The client is made once per process by `client()`. google-cloud-storage itself reads
`STORAGE_EMULATOR_HOST` (and then uses anonymous credentials), which is how tests and
`gptpipe run --local` point it at gcp-storage-emulator; `set_client` replaces it.

Mistakes a user can make (a missing bucket, 403, an empty prefix, an object replaced while a
step reads it, a destination that is an object) raise one `UserError` naming the URI.
"""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import hashlib
import io
import json
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

import google_crc32c
from google.api_core import exceptions as gexc
from google.cloud import storage as gcs
from google.cloud.storage.retry import DEFAULT_RETRY

from contracts.errors import UserError

_CHUNK = 1 << 20
GS = "gs://"
WORKERS = 8  # threads for folders of many objects; GCS serves each object independently
RESUMABLE_THRESHOLD = 8 << 20  # bigger objects upload in resumable chunks (the client's own cut)
UPLOAD_CHUNK_BYTES = 8 << 20  # resumable chunk; GCS requires a multiple of 256 KiB
READ_CHUNK_BYTES = 4 << 20  # one ranged GET of a streamed read
# 0.5 s, 1 s, 2 s ... up to 32 s between tries, for at most 5 minutes per call.
RETRY = DEFAULT_RETRY.with_delay(initial=0.5, maximum=32.0, multiplier=2.0).with_timeout(300.0)
STAGING_PREFIX = ".staging-"  # gs:// publish: `<parent>/.staging-<name>/` beside `<parent>/<name>/`
STAGING_MANIFEST = ".publish.json"  # written last into a staging folder: the upload is complete
STALE_STAGING_S = 3600.0  # an unfinished staging upload older than this is abandoned

_T = TypeVar("_T")


class ObjectChangedError(UserError):
    """An object was replaced between the step listing it and reading it."""


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


# ---- URIs and the client ---------------------------------------------------------------------


def is_gcs(uri: str | os.PathLike[str]) -> bool:
    """True for a `gs://` URI."""
    return str(uri).startswith(GS)


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
    return bucket, key


_CLIENT: dict[str, gcs.Client] = {}  # the process's client, made on first use
_CLIENT_LOCK = threading.Lock()


def client() -> gcs.Client:
    """The process's google-cloud-storage client (it honours STORAGE_EMULATOR_HOST)."""
    with _CLIENT_LOCK:
        if "client" not in _CLIENT:
            _CLIENT["client"] = gcs.Client()
        return _CLIENT["client"]


def set_client(new: gcs.Client | None) -> None:
    """Use `new` for every later call; None makes a fresh default client on next use."""
    with _CLIENT_LOCK:
        _CLIENT.clear()
        if new is not None:
            _CLIENT["client"] = new


def _blob(uri: str, generation: int | None = None) -> gcs.Blob:
    bucket, key = split_gcs(uri)
    if not key:
        raise UserError(f"{uri!r} names a bucket, not an object")
    return client().bucket(bucket).blob(key, generation=generation)


@contextlib.contextmanager
def _errors(uri: str) -> Iterator[None]:
    """Turn GCS errors a user can cause into one UserError that names the URI."""
    try:
        yield
    except gexc.Forbidden as e:
        bucket = split_gcs(uri)[0]
        raise UserError(
            f"permission denied (403) on {uri}: grant the pipeline's service account "
            f"roles/storage.objectAdmin (or objectViewer to read) on bucket {bucket!r}; "
            f"GCS said: {e.message}"
        ) from None
    except gexc.Unauthorized:
        raise UserError(
            f"not authenticated (401) for {uri}: run `gcloud auth application-default login` "
            "or set GOOGLE_APPLICATION_CREDENTIALS"
        ) from None
    except gexc.NotFound:
        bucket = split_gcs(uri)[0]
        if not _bucket_exists(bucket):
            raise UserError(
                f"bucket {bucket!r} does not exist (from {uri}); create it or fix the URI"
            ) from None
        raise UserError(f"object {uri} not found") from None


def _bucket_exists(bucket: str) -> bool:
    try:
        return client().bucket(bucket).exists(retry=RETRY)
    except gexc.Forbidden:
        return True  # it exists; we may not read its metadata


def _crc32c_b64(data: bytes) -> str:
    return base64.b64encode(google_crc32c.Checksum(data).digest()).decode("ascii")


def crc32c_file(path: str | os.PathLike[str]) -> str:
    """Return a local file's CRC32C as GCS reports it (base64 of the big-endian value)."""
    checksum = google_crc32c.Checksum()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            checksum.update(chunk)
    return base64.b64encode(checksum.digest()).decode("ascii")


def _parallel(fn: Callable[[Any], _T], items: Iterable[Any], workers: int) -> list[_T]:
    """Run fn over items on a thread pool; the first error is raised after all finish."""
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        return list(pool.map(fn, items))


# ---- list -----------------------------------------------------------------------------------


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Return the hex sha256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _has_wildcard(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def list_files(pattern: str) -> list[FileInfo]:
    """Resolve a file, a folder (recursively) or a glob into sorted files with fingerprints.

    Works for local paths and gs:// URIs. Hidden files and folders (names starting with '.')
    are skipped, so half-written temporaries and staging folders are never read as input. A
    gs:// listing downloads nothing: the fingerprints are GCS's own crc32c and md5.
    """
    if is_gcs(pattern):
        return _list_gcs(pattern)
    path = Path(pattern)
    if _has_wildcard(pattern):
        anchor = Path(path.anchor) if path.is_absolute() else Path(".")
        relative = str(path.relative_to(path.anchor)) if path.is_absolute() else pattern
        found = [p for p in anchor.glob(relative) if p.is_file()]
    elif path.is_dir():
        found = [p for p in path.rglob("*") if p.is_file()]
    elif path.is_file():
        found = [path]
    else:
        raise UserError(f"corpus not found: {pattern!r} is not a file, folder or matching glob")
    base = path.parent if path.is_file() else (path if path.is_dir() else Path(_glob_root(pattern)))
    found = [p for p in found if not _hidden_path(p, base)]
    files = sorted({p.resolve() for p in found})
    return [FileInfo(str(p), p.stat().st_size, sha256_file(p)) for p in files]


def _info(bucket: str, blob: gcs.Blob) -> FileInfo:
    return FileInfo(
        f"{GS}{bucket}/{blob.name}",
        int(blob.size or 0),
        "",
        int(blob.generation) if blob.generation is not None else None,
        blob.crc32c or "",
        blob.md5_hash or "",
    )


def _glob_root(pattern: str) -> str:
    """The fixed folder part of a glob: everything before the first wildcard segment."""
    parts = Path(pattern).parts
    fixed = [p for p in parts[: next(i for i, p in enumerate(parts) if _has_wildcard(p))]]
    return str(Path(*fixed)) if fixed else "."


def _hidden_path(path: Path, base: Path) -> bool:
    """True if any part of `path` below `base` starts with '.' (.git/, .staging-*, temps)."""
    try:
        parts = path.resolve().relative_to(base.resolve()).parts
    except ValueError:
        parts = path.parts[-1:]
    return any(part.startswith(".") for part in parts)


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


def _list_blobs(bucket: str, prefix: str, uri: str, **kwargs: Any) -> list[gcs.Blob]:
    with _errors(uri):
        return list(client().list_blobs(bucket, prefix=prefix, retry=RETRY, **kwargs))


def _list_gcs(pattern: str) -> list[FileInfo]:
    bucket, key = split_gcs(pattern)
    if _has_wildcard(key):
        fixed = key[: min(key.index(c) for c in "*?[" if c in key)]
        under = fixed[: fixed.rfind("/") + 1]
        regex = _glob_regex(key)
        blobs = [
            b
            for b in _list_blobs(bucket, under, pattern)
            if regex.match(b.name) and not _hidden(b.name, under)
        ]
        return [_info(bucket, b) for b in blobs]
    folder = key.rstrip("/") + "/" if key else ""
    blobs = _list_blobs(bucket, key.rstrip("/"), pattern)
    exact = [b for b in blobs if b.name == key]
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
    """Every file under a folder (hidden ones included), keyed by its '/'-separated relative name.

    A missing folder is empty.
    """
    if not is_gcs(uri):
        root = Path(uri)
        if not root.is_dir():
            return {}
        return {
            p.relative_to(root).as_posix(): FileInfo(str(p), p.stat().st_size, "")
            for p in sorted(root.rglob("*"))
            if p.is_file()
        }
    bucket, key = split_gcs(uri)
    folder = key.rstrip("/") + "/" if key else ""
    blobs = _list_blobs(bucket, folder, uri)
    return {b.name[len(folder) :]: _info(bucket, b) for b in blobs if not b.name.endswith("/")}


def has_content(uri: str) -> bool:
    """True if `uri` is a file or object, or a folder holding anything."""
    if not is_gcs(uri):
        path = Path(uri)
        return path.exists() and not (path.is_dir() and not any(path.iterdir()))
    bucket, key = split_gcs(uri)
    key = key.rstrip("/")
    folder = key + "/" if key else ""
    return bool(_list_blobs(bucket, folder, uri, max_results=1)) or _is_object(uri)


def _is_object(uri: str) -> bool:
    bucket, key = split_gcs(uri)
    if not key.rstrip("/"):
        return False
    with _errors(uri):
        return client().bucket(bucket).blob(key.rstrip("/")).exists(retry=RETRY)


def check_folder(uri: str, what: str) -> None:
    """Raise UserError if `uri` is a file or an object, so it cannot be a folder."""
    if not is_gcs(uri):
        if Path(uri).exists() and not Path(uri).is_dir():
            raise UserError(f"{what} is not a folder: {uri} is a file")
        return
    if _is_object(uri):
        raise UserError(f"{what} is not a folder: {uri} is an object; give a prefix")


def tree_crc32c(uri: str) -> dict[str, str]:
    """{relative name: crc32c} of every file under a folder (GCS's listing for gs://)."""
    files = list_tree(uri)
    if is_gcs(uri):
        return {rel: info.crc32c for rel, info in files.items()}
    return {rel: crc32c_file(info.uri) for rel, info in files.items()}


def same_files(a: str, b: str) -> bool:
    """True if two folders (local or gs://) hold the same names with the same bytes (crc32c)."""
    return tree_crc32c(a) == tree_crc32c(b)


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
        kwargs: dict[str, Any] = {"retry": RETRY}
        if generation is not None:
            kwargs["if_generation_match"] = generation
        with _errors(uri):
            blob = _blob(uri)
            blob.reload(retry=RETRY)
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
        except gexc.PreconditionFailed:
            raise self._changed("replaced while being read") from None
        if not data and not self._done:
            self._done = True
            self._verify()
        self._crc.update(data)
        buffer[: len(data)] = data
        return len(data)

    def _verify(self) -> None:
        crc = base64.b64encode(self._crc.digest()).decode("ascii")
        with _errors(self._uri):
            self._blob.reload(retry=RETRY)
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


@contextlib.contextmanager
def open_read(uri: str, expect: FileInfo | None = None) -> Iterator[IO[bytes]]:
    """Open a file or object for a streamed binary read.

    For gs:// the read is checked against `expect` (a FileInfo from `list_files`): if the
    object's generation or bytes differ from the listing, the read raises ObjectChangedError,
    so a step never mixes a fingerprint of one version with the bytes of another.
    """
    if not is_gcs(uri):
        with open(uri, "rb") as f:
            yield f
        return
    with io.BufferedReader(_CheckedGcsReader(uri, expect), buffer_size=_CHUNK) as f:
        yield f


def read_bytes(uri: str, expect: FileInfo | None = None) -> bytes:
    """Read a whole file or object (checked as `open_read` does)."""
    with open_read(uri, expect) as f:
        return f.read()


# ---- write and copy -------------------------------------------------------------------------


def write_bytes(uri: str, data: bytes) -> None:
    """Write a file or object in one step: readers see the old bytes or the new, never half."""
    if not is_gcs(uri):
        _write_local_atomic(Path(uri), data)
        return
    with _errors(uri):
        _blob(uri).upload_from_string(data, retry=RETRY, checksum="crc32c")


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write a UTF-8 text file (local: a temporary sibling and a rename; gs://: one upload)."""
    write_bytes(str(path), text.encode("utf-8"))


def _write_local_atomic(final_path: Path, data: bytes) -> None:
    final_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_sibling(final_path)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, final_path)
    finally:
        tmp.unlink(missing_ok=True)


def upload_file(path: str | os.PathLike[str], uri: str) -> FileInfo:
    """Upload one local file; resumable in chunks when large; the client checks crc32c."""
    size = os.path.getsize(path)
    blob = _blob(uri)
    if size > RESUMABLE_THRESHOLD:
        blob.chunk_size = UPLOAD_CHUNK_BYTES
    with _errors(uri):
        blob.upload_from_filename(str(path), retry=RETRY, checksum="crc32c")
    return _info(split_gcs(uri)[0], blob)


def download_file(uri: str, path: str | os.PathLike[str]) -> None:
    """Download one object to a local file; the client checks crc32c of whole downloads."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with _errors(uri):
        _blob(uri).download_to_filename(str(path), retry=RETRY, checksum="crc32c")


def copy(source: str, destination: str) -> None:
    """Copy one file or object; gs:// to gs:// is a server-side copy (no bytes through here)."""
    if is_gcs(source) and is_gcs(destination):
        _copy_object(source, destination)
    elif is_gcs(destination):
        upload_file(source, destination)
    elif is_gcs(source):
        download_file(source, destination)
    else:
        Path(destination).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination)


def _copy_object(
    source: str, destination: str, *, if_generation_match: int | None = None
) -> FileInfo:
    src = _blob(source)
    dst_bucket, dst_key = split_gcs(destination)
    kwargs: dict[str, Any] = {"retry": RETRY}
    if if_generation_match is not None:
        kwargs["if_generation_match"] = if_generation_match
    with _errors(source):
        new = src.bucket.copy_blob(src, client().bucket(dst_bucket), dst_key, **kwargs)
    return _info(dst_bucket, new)


def upload_dir(
    source: str | os.PathLike[str], destination: str, workers: int = WORKERS
) -> dict[str, FileInfo]:
    """Upload every file under a local folder to a gs:// prefix on a thread pool."""
    files = list_tree(str(source))
    infos = _parallel(
        lambda rel: upload_file(files[rel].uri, join(destination, rel)), files, workers
    )
    return dict(zip(files, infos, strict=True))


def download_dir(source: str, destination: str | os.PathLike[str], workers: int = WORKERS) -> int:
    """Download every object under a gs:// prefix into a local folder; return the count."""
    objects = list_tree(source)
    if not objects:
        raise UserError(f"nothing to download: no objects under {source}; check the prefix")
    _parallel(lambda rel: download_file(objects[rel].uri, Path(destination, rel)), objects, workers)
    return len(objects)


def delete_tree(uri: str, workers: int = WORKERS) -> None:
    """Delete a folder and everything under it; a missing one is fine."""
    if not is_gcs(uri):
        shutil.rmtree(uri, ignore_errors=True)
        return
    _parallel(lambda info: _delete_object(info.uri), list_tree(uri).values(), workers)


def _delete_object(uri: str) -> None:
    with contextlib.suppress(gexc.NotFound), _errors(uri):
        _blob(uri).delete(retry=RETRY)


@contextlib.contextmanager
def local_copy(uri: str) -> Iterator[Path]:
    """Yield a local folder with the files of `uri`: itself, or a temporary download."""
    if not is_gcs(uri):
        yield Path(uri)
        return
    with tempfile.TemporaryDirectory(prefix="gptpipe-") as tmp:
        download_dir(uri, tmp)
        yield Path(tmp)


# ---- atomic folders -------------------------------------------------------------------------


def _temp_sibling(final: Path) -> Path:
    return final.parent / f".{final.name}.tmp-{secrets.token_hex(4)}"


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike[str], ready: str = "") -> Iterator[Path]:
    """Yield a local temporary folder that becomes `final` only if the block succeeds.

    Local: the folder is a sibling of `final`, renamed into place; if `final` already exists
    as an empty folder (KFP may create it) it is replaced. gs://: the folder is published
    with `publish_dir`, `ready` (a relative name, such as the manifest) copied last. A
    failure leaves nothing at `final`.
    """
    if is_gcs(final):
        with tempfile.TemporaryDirectory(prefix="gptpipe-") as tmp:
            yield Path(tmp)
            publish_dir(tmp, str(final), ready=ready)
        return
    final_path = Path(final)
    final_path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = _temp_sibling(final_path)
    tmp_path.mkdir()
    try:
        yield tmp_path
        if final_path.is_dir() and not any(final_path.iterdir()):
            final_path.rmdir()
        os.rename(tmp_path, final_path)
    except BaseException:
        shutil.rmtree(tmp_path, ignore_errors=True)
        raise


def publish_dir(
    source: str | os.PathLike[str], final: str | os.PathLike[str], ready: str = ""
) -> None:
    """Copy folder `source` to `final` atomically, so no reader sees part of it.

    Local: a copy beside `final`, then one rename. gs:// (GCS has no rename) follows the
    staging protocol of `_publish_gcs`; readers must treat `ready` (a relative name) as the
    signal that the folder is complete. `source` may be local or gs:// in either case.

    Raises FileExistsError if `final` exists (gs://: holds `ready`, or anything when
    `ready` is ""), so two publishers never overwrite each other.
    """
    if is_gcs(final):
        _publish_gcs(str(source), str(final), ready)
        return
    final_path = Path(final)
    final_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_sibling(final_path)
    try:
        with local_copy(str(source)) as local_source:
            shutil.copytree(local_source, tmp)
        if final_path.exists():
            raise FileExistsError(final_path)
        os.rename(tmp, final_path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def staging_uri(final: str) -> str:
    """Where `_publish_gcs` stages `final`: `<parent>/.staging-<name>`."""
    parent, _, name = final.rstrip("/").rpartition("/")
    return f"{parent}/{STAGING_PREFIX}{name}"


def _publish_gcs(source: str, final: str, ready: str) -> None:
    """Publish a folder to gs:// without a rename.

    1. upload (or server-side copy) every file to `<parent>/.staging-<name>/`, then write
       `.publish.json` there listing each name with its crc32c: the staging is complete;
    2. copy each staged object into `final/`, `ready` last (TF Serving loads a version once
       `saved_model.pb` appears), `ready` only if no one else published it (precondition);
    3. check `final/` holds exactly the listed names with the listed crc32c;
    4. delete the staging folder.

    An interruption before step 1 ends leaves only a staging folder without `.publish.json`;
    after it, a staging folder `finish_publishes` completes. `final/` never holds `ready`
    without everything else.
    """
    staging = staging_uri(final)
    if _taken(final, ready):
        raise FileExistsError(final)
    expected = _stage(source, staging)
    write_bytes(join(staging, STAGING_MANIFEST), json.dumps(expected, sort_keys=True).encode())
    _promote(staging, final, expected, ready)


def _taken(final: str, ready: str) -> bool:
    existing = list_tree(final)
    return ready in existing if ready else bool(existing)


def _stage(source: str, staging: str) -> dict[str, str]:
    """Put every file of `source` under `staging`; return {relative name: crc32c}."""
    delete_tree(staging)
    if is_gcs(source):
        objects = list_tree(source)
        if not objects:
            raise UserError(f"nothing to publish: no objects under {source}")
        infos = _parallel(
            lambda rel: _copy_object(objects[rel].uri, join(staging, rel)), objects, WORKERS
        )
        return {rel: info.crc32c for rel, info in zip(objects, infos, strict=True)}
    local = list_tree(source)
    if not local:
        raise UserError(f"nothing to publish: folder {source} is empty")
    expected = {rel: crc32c_file(info.uri) for rel, info in local.items()}
    uploaded = upload_dir(source, staging)
    _check_same(staging, expected, {rel: info.crc32c for rel, info in uploaded.items()})
    return expected


def _promote(staging: str, final: str, expected: dict[str, str], ready: str) -> None:
    """Copy the staged objects into `final` (`ready` last), verify, delete the staging."""
    rest = sorted(rel for rel in expected if rel != ready)
    _parallel(lambda rel: _copy_object(join(staging, rel), join(final, rel)), rest, WORKERS)
    if ready in expected:
        try:
            _copy_object(join(staging, ready), join(final, ready), if_generation_match=0)
        except gexc.PreconditionFailed:
            raise FileExistsError(final) from None
    found = {rel: info.crc32c for rel, info in list_tree(final).items()}
    _check_same(final, expected, found)
    delete_tree(staging)


def _check_same(where: str, expected: dict[str, str], found: dict[str, str]) -> None:
    if found != expected:
        missing = sorted(set(expected) - set(found))
        extra = sorted(set(found) - set(expected))
        differ = sorted(r for r in set(found) & set(expected) if found[r] != expected[r])
        raise RuntimeError(
            f"publish check failed at {where}: {len(found)} objects, expected {len(expected)}; "
            f"missing {missing}, unexpected {extra}, crc32c differs for {differ}"
        )


def finish_publishes(
    parent: str, ready: str = "", stale_after_s: float = STALE_STAGING_S
) -> dict[str, str]:
    """Complete or clean up the gs:// publishes under `parent` that a crash interrupted.

    A staging folder with `.publish.json` was fully uploaded: its copy into place is
    finished. One without it is abandoned once its newest object is older than
    `stale_after_s` (younger ones may belong to a publisher still uploading): the staging and
    any objects already in its final folder (never `ready`, which is only copied after the
    manifest exists) are deleted. Returns {final URI: "finished" | "cleaned"}.
    Local publishes need nothing: a dead publisher leaves only a hidden temporary folder.
    """
    if not is_gcs(parent):
        return {}
    bucket, key = split_gcs(parent)
    folder = key.rstrip("/") + "/" if key else ""
    with _errors(parent):
        listing = client().list_blobs(bucket, prefix=folder, delimiter="/", retry=RETRY)
        list(listing)
    done: dict[str, str] = {}
    for prefix in sorted(listing.prefixes):
        name = prefix[len(folder) :].rstrip("/")
        if name.startswith(STAGING_PREFIX):
            final = f"{GS}{bucket}/{folder}{name[len(STAGING_PREFIX) :]}"
            outcome = _finish_one(f"{GS}{bucket}/{prefix}", final, ready, stale_after_s)
            if outcome:
                done[final] = outcome
    return done


def _finish_one(staging: str, final: str, ready: str, stale_after_s: float) -> str:
    staged = list_tree(staging)
    if STAGING_MANIFEST in staged:
        expected = json.loads(read_bytes(staged[STAGING_MANIFEST].uri))
        if ready in list_tree(final):
            _check_same(final, expected, {r: i.crc32c for r, i in list_tree(final).items()})
            delete_tree(staging)
        else:
            _promote(staging, final, expected, ready)
        return "finished"
    newest = max((_updated(info.uri) for info in staged.values()), default=0.0)
    if time.time() - newest < stale_after_s:
        return ""
    if ready and ready not in list_tree(final):
        delete_tree(final)
    delete_tree(staging)
    return "cleaned"


def _updated(uri: str) -> float:
    blob = _blob(uri)
    with _errors(uri):
        blob.reload(retry=RETRY)
    return blob.updated.timestamp() if blob.updated else 0.0


# ---- TF Serving versions --------------------------------------------------------------------


def _gcs_children(uri: str) -> list[str]:
    """Names of the immediate sub-folders of a gs:// folder."""
    bucket, key = split_gcs(uri)
    folder = key.rstrip("/") + "/" if key else ""
    with _errors(uri):
        listing = client().list_blobs(bucket, prefix=folder, delimiter="/", retry=RETRY)
        list(listing)
    return [p[len(folder) :].rstrip("/") for p in listing.prefixes]


def serving_versions(destination: str | os.PathLike[str]) -> list[int]:
    """Return the complete model versions under a TF Serving destination, ascending.

    A version is a folder named by an integer that holds `saved_model.pb`; anything else
    (temporaries, staging folders, half-copied folders, stray files) is ignored.
    """
    if is_gcs(destination):
        bucket, key = split_gcs(str(destination))
        folder = key.rstrip("/") + "/" if key else ""
        blobs = _list_blobs(
            bucket, folder, str(destination), match_glob=f"{folder}*/saved_model.pb"
        )
        names = {b.name[len(folder) :].split("/")[0] for b in blobs}
        return sorted(int(n) for n in names if n.isdigit())
    root = Path(destination)
    if not root.is_dir():
        return []
    return sorted(
        int(p.name) for p in root.iterdir() if p.name.isdigit() and (p / "saved_model.pb").is_file()
    )


def next_serving_version(destination: str | os.PathLike[str]) -> int:
    """Return one more than the highest integer-named entry, complete, staged or not."""
    if is_gcs(destination):
        names = [n.removeprefix(STAGING_PREFIX) for n in _gcs_children(str(destination))]
    else:
        root = Path(destination)
        names = [p.name for p in root.iterdir()] if root.is_dir() else []
    return max((int(n) for n in names if n.isdigit()), default=0) + 1
