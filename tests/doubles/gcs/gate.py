"""The precondition gate the test GCS proxy puts in front of gcp-storage-emulator.

gcp-storage-emulator ignores GCS's request preconditions (`ifGenerationMatch` and the rest);
`PreconditionGate` checks them against the emulator's live generations, under a per-object lock,
before forwarding a request, and answers as GCS does (412 `conditionNotMet`, 304). The proxy in
proxy.py (`FaultProxy`) uses it; tests/faults/test_gcs_proxy.py pins what it adds.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import http.server
import json
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.parser import BytesParser
from urllib.parse import parse_qs, quote, unquote, urlparse, urlsplit

# ---- talking to the emulator ------------------------------------------------------------------

Reply = tuple[int, list[tuple[str, str]], bytes]  # status, headers, body
Key = tuple[str, str]  # (bucket, object name)
Send = Callable[[], Reply]  # forwards the request being handled to the emulator


def forward(
    upstream: str, method: str, path: str, headers: dict[str, str], body: bytes | None
) -> Reply:
    """Send one request to the emulator and read its whole reply."""
    url = urlparse(upstream)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.getheaders(), response.read()
    finally:
        conn.close()


def _error_body(status: int) -> bytes:
    reason = {
        403: "forbidden",
        412: "conditionNotMet",
        429: "rateLimitExceeded",
        503: "backendError",
    }.get(status, "error")
    message = {
        403: "anonymous caller does not have storage.objects.list access to the bucket.",
        412: "At least one of the pre-conditions you specified did not hold.",
        429: "The rate of change requests to the object is too high.",
        503: "Backend Error",
    }.get(status, "error")
    error = {
        "code": status,
        "message": message,
        "errors": [{"message": message, "domain": "global", "reason": reason}],
    }
    return json.dumps({"error": error}).encode()


def error_reply(status: int) -> Reply:
    """GCS's reply for an error status: its JSON error body, or none for 304."""
    if status == 304:  # Not Modified carries no body
        return 304, [], b""
    return status, [("Content-Type", "application/json; charset=UTF-8")], _error_body(status)


# ---- preconditions ----------------------------------------------------------------------------
# Sources, named again where each is used:
# [docs] https://cloud.google.com/storage/docs/request-preconditions (the JSON API's four query
#        parameters; a failed *Match is 412 Precondition Failed, a failed *NotMatch is 304 Not
#        Modified; ifGenerationMatch=0: the object must not exist).
# [testbench] googleapis/storage-testbench, Google's own GCS emulator for its client libraries:
#        testbench/common.py `make_json_preconditions` (how each condition reads, a missing object
#        counting as generation and metageneration 0, 412 via error.mismatch, 304 via
#        error.notchanged), testbench/database.py (`insert_object` checks a write's conditions
#        where the object is stored; reads, deletes and patches look the object up first, so a
#        missing one is 404), gcs/upload.py (a resumable upload's conditions are given when it
#        starts and used when it completes).
# [python-storage] googleapis/python-storage: blob.py and bucket.py send these parameters
#        (`_helpers._GENERATION_MATCH_PARAMETERS`), `ifSource*` on copyTo/rewriteTo.

CONDITIONS = (
    "GenerationMatch",
    "MetagenerationMatch",
    "GenerationNotMatch",
    "MetagenerationNotMatch",
)
# The emulator's routes (gcp_storage_emulator/server.py), the `/storage/v1` prefix optional there.
_API = r"(?:/storage/v1)?"
_UPLOAD = re.compile(r"^/upload/storage/v1/b/(?P<bucket>[^/]+)/o$")
_COPY = re.compile(
    rf"^{_API}/b/(?P<bucket>[^/]+)/o/(?P<name>.+)/(?:copyTo|rewriteTo)/b/(?P<dest_bucket>[^/]+)"
    r"/o/(?P<dest>.+)$"
)
_COMPOSE = re.compile(rf"^{_API}/b/(?P<bucket>[^/]+)/o/(?P<name>.+)/compose$")
_OBJECT_EXTRA = re.compile(rf"^{_API}/b/[^/]+/o/.+/(?:acl|restore)$")
_OBJECT = re.compile(rf"^(?:/download/storage/v1|{_API})/b/(?P<bucket>[^/]+)/o/(?P<name>.+)$")
_CONTENT_RANGE = re.compile(r"bytes (?:(?P<start>\d+)-(?:\d+|\*)|\*)/(?P<total>\d+|\*)")


def conditions(query: dict[str, list[str]], prefix: str = "if") -> dict[str, int]:
    """The preconditions a request names, as {"GenerationMatch": 0, ...}.

    Names are matched without regard to case: python-storage's multipart upload spells one
    `ifMetaGenerationNotMatch` (blob.py `_do_multipart_upload`).
    """
    given = {key.lower(): values[-1] for key, values in query.items()}
    names = {c: (prefix + c).lower() for c in CONDITIONS}
    return {c: int(given[name]) for c, name in names.items() if name in given}


def verdict(wanted: dict[str, int], live: tuple[int, int] | None) -> int | None:
    """The status GCS answers when `wanted` does not hold for `live`, else None.

    `live` is the object's (generation, metageneration), None if it does not exist, which
    counts as (0, 0) [testbench common.py]: so ifGenerationMatch=0 holds only for a missing
    object, ifGenerationNotMatch=0 only for an existing one. A failed *Match is 412, a failed
    *NotMatch 304, for reads and writes alike [docs; testbench error.mismatch/notchanged].
    """
    generation, metageneration = live or (0, 0)
    actual = {"Generation": generation, "Metageneration": metageneration}
    for name, value in wanted.items():
        negated = name.endswith("NotMatch")
        current = actual[name.removesuffix("NotMatch").removesuffix("Match")]
        if negated and value == current:
            return 304
        if not negated and value != current:
            return 412
    return None


@dataclass
class _Upload:
    """A resumable upload started with preconditions: checked when it completes [testbench]."""

    key: Key
    wanted: dict[str, int]  # conditions(...) of the request that started it
    received: int = 0  # bytes the emulator has confirmed (its last 308 Range)


@dataclass
class PreconditionGate:
    """Enforces GCS request preconditions in front of an emulator that ignores them.

    Each checked request holds one lock per object it names while it reads the object's live
    generation from the emulator and forwards the write, so the check and the write are one
    step for every client of this proxy, other processes included. Writes that go straight to
    the emulator (the `gcs` fixture's client) are seen but not serialized with these.

    Generations are the emulator's own: a fresh `time.time_ns()` per write, reported in every
    object resource (handlers/objects.py `_make_object_resource`). Preconditions need only
    that they differ between writes, which they do, so no table of generations is kept here.
    (They are not ordered by completion: a resumable upload takes its generation when it
    starts; nothing here compares them by size.) Its metagenerations start at 2, not GCS's 1,
    after any write that carries metadata, as every google-cloud-storage upload and copy does
    (`_make_object_resource` applies that metadata as a patch), and rise by 1 per PATCH as on
    GCS: compared as the emulator reports them, which is what clients see.
    """

    upstream: str
    uploads: dict[str, _Upload] = field(default_factory=dict)  # by resumable upload id
    refused: list[tuple[str, str, int]] = field(default_factory=list)  # (method, b/o, status)
    _locks: dict[Key, threading.Lock] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def relay(self, method: str, path: str, headers: dict[str, str], body: bytes | None) -> Reply:
        """Answer one request: refused here if a precondition fails, else the emulator's reply."""
        url = urlsplit(path)
        query = parse_qs(url.query)
        send = functools.partial(forward, self.upstream, method, path, headers, body)
        upload = _UPLOAD.match(url.path)
        if upload and "upload_id" in query and method in ("PUT", "POST"):
            return self._upload_chunk(query["upload_id"][0], headers, body, send)
        if upload and method == "POST":
            kind = query.get("uploadType", [""])[0]
            name = query.get("name", [None])[0] or _name_in_body(kind, headers, body)
            key = (unquote(upload["bucket"]), name or "")
            if kind == "resumable":
                return self._start_upload(key, conditions(query), send)
            return self._write(key, conditions(query), send)
        copy = _COPY.match(url.path)
        if copy and method == "POST":
            # copyTo and rewriteTo: if* names the destination, ifSource* the source
            # [python-storage bucket.py `copy_blob`, blob.py `rewrite`; testbench].
            source = (unquote(copy["bucket"]), unquote(copy["name"]))
            key = (unquote(copy["dest_bucket"]), unquote(copy["dest"]))
            return self._write(key, conditions(query), send, source, conditions(query, "ifSource"))
        compose = _COMPOSE.match(url.path)
        if compose and method == "POST":
            key = (unquote(compose["bucket"]), unquote(compose["name"]))
            return self._write(key, conditions(query), send)
        target = _OBJECT.match(url.path)
        if target and not _OBJECT_EXTRA.match(url.path) and method in ("GET", "DELETE", "PATCH"):
            key = (unquote(target["bucket"]), unquote(target["name"]))
            return self._existing(method, key, conditions(query), send)
        return send()

    # -- the kinds of request ------------------------------------------------------------------

    def _write(
        self,
        key: Key,
        wanted: dict[str, int],
        send: Send,
        source: Key | None = None,
        source_wanted: dict[str, int] | None = None,
    ) -> Reply:
        """A request that makes a new generation of `key` (upload, copy, rewrite, compose).

        Checked against the live object where the write lands [testbench database.py
        `insert_object`]; a copy's or rewrite's source is looked up first, so a missing one
        is 404 whatever the destination's conditions say (the emulator's 404) [testbench
        rest_server.py `objects_copy`: `db.get_object` of the source, with its ifSource*
        conditions, before `db.insert_object` of the destination].
        """
        if not wanted and not source_wanted:
            return send()
        with self._locked([key, source] if source else [key]):
            if source:
                live = self._live(source)
                if live is None:
                    return send()
                refusal = verdict(source_wanted or {}, live)
                if refusal:
                    return self._refuse("POST", source, refusal)
            refusal = verdict(wanted, self._live(key))
            if refusal:
                return self._refuse("POST", key, refusal)
            return send()

    def _existing(self, method: str, key: Key, wanted: dict[str, int], send: Send) -> Reply:
        """A read (metadata or media), delete or metadata patch of an existing object.

        A missing one is the emulator's 404 before any condition is read [testbench
        database.py `__get_object`].
        """
        if not wanted:
            return send()
        with self._locked([key]):
            live = self._live(key)
            refusal = verdict(wanted, live) if live else None
            if refusal:
                return self._refuse(method, key, refusal)
            return send()

    def _start_upload(self, key: Key, wanted: dict[str, int], send: Send) -> Reply:
        """Start a resumable upload; its conditions wait for its last request [testbench
        gcs/upload.py: "pre-conditions, are provided at the start of the upload, but are used
        when the upload completes"], so an upload started while the object exists may still
        create it if it is gone by then.
        """
        reply = send()
        status, headers, _ = reply
        location = dict((k.lower(), v) for k, v in headers).get("location", "")
        upload_id = parse_qs(urlsplit(location).query).get("upload_id", [""])[0]
        if wanted and status == 200 and upload_id:
            with self._guard:
                self.uploads[upload_id] = _Upload(key, wanted)
        return reply

    def _upload_chunk(
        self, upload_id: str, headers: dict[str, str], body: bytes | None, send: Send
    ) -> Reply:
        """One PUT of a resumable upload: the one that completes it is checked and forwarded
        under the object's lock [testbench gcs/upload.py]; the others go straight through."""
        with self._guard:
            upload = self.uploads.get(upload_id)
        if upload is None:
            return send()
        with self._locked([upload.key]):
            if _completes(upload, headers, len(body or b"")):
                refusal = verdict(upload.wanted, self._live(upload.key))
                if refusal:
                    return self._refuse("PUT", upload.key, refusal)
            reply = send()
            status, reply_headers, _ = reply
            done = dict((k.lower(), v) for k, v in reply_headers).get("range", "")
            if status == 308 and re.fullmatch(r"bytes=0-\d+", done):
                upload.received = int(done.rpartition("-")[2]) + 1
            elif status in (200, 201):
                with self._guard:
                    self.uploads.pop(upload_id, None)
            return reply

    # -- helpers -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self, keys: list[Key]) -> Iterator[None]:
        """Hold the locks of `keys`, taken in sorted order so two requests cannot deadlock."""
        with self._guard:
            locks = [self._locks.setdefault(k, threading.Lock()) for k in sorted(set(keys))]
        with contextlib.ExitStack() as stack:
            for lock in locks:
                stack.enter_context(lock)
            yield

    def _live(self, key: Key) -> tuple[int, int] | None:
        """(generation, metageneration) of the object `key` on the emulator; None if missing."""
        bucket, name = key
        path = f"/storage/v1/b/{bucket}/o/{quote(name, safe='')}"
        status, _, data = forward(self.upstream, "GET", path, {}, None)
        if status == 404:
            return None
        if status != 200:
            raise RuntimeError(f"emulator answered {status} to {path}: {data[:200]!r}")
        resource = json.loads(data)
        return int(resource["generation"]), int(resource["metageneration"])

    def _refuse(self, method: str, key: Key, status: int) -> Reply:
        with self._guard:
            self.refused.append((method, "/".join(key), status))
        return error_reply(status)


def _name_in_body(kind: str, headers: dict[str, str], body: bytes | None) -> str | None:
    """The object name a multipart upload's metadata part, or a resumable start's JSON, gives."""
    if not body:
        return None
    content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    if kind == "multipart" and content_type.startswith("multipart/"):
        message = BytesParser().parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode() + body)
        parts = message.get_payload()
        return json.loads(parts[0].get_payload()).get("name") if parts else None
    if kind == "resumable":
        with contextlib.suppress(ValueError):
            return json.loads(body).get("name")
    return None


def _completes(upload: _Upload, headers: dict[str, str], length: int) -> bool:
    """Whether this PUT finishes the upload, by its Content-Range (how the emulator decides:
    handlers/objects.py `upload_partial`); one without a Content-Range is the whole object."""
    value = next((v for k, v in headers.items() if k.lower() == "content-range"), "")
    if not value:
        return True
    match = _CONTENT_RANGE.fullmatch(value.strip())
    if match is None or match["total"] == "*":
        return False
    total = int(match["total"])
    if match["start"] is None:  # `bytes */TOTAL`: completes if every byte is already there
        return upload.received >= total
    return int(match["start"]) + length >= total
