"""The embedded model server whole: the versions, the REST API and the HTTP server, started
in that order and stopped together."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from contracts.errors import UserError
from server import servable
from server.guards import Limits
from server.httpd import DEFAULT_MAX_BODY_BYTES, RestServer
from server.rest import RestApi
from server.versions import Load, Versions

DEFAULT_PORT = 8501  # TF Serving's REST port in its images and docs
DEFAULT_HOST = "127.0.0.1"  # this machine only, unless told otherwise
DEFAULT_POLL_SECONDS = 1.0  # TF Serving's --file_system_poll_wait_seconds
SHUTDOWN_POLL_S = 0.1  # how soon the HTTP server notices it is to stop


@dataclass(frozen=True)
class Settings:
    """How to serve one model."""

    source: str  # the TF Serving destination: <source>/<N>/ per version, local or gs://
    name: str  # the model's name in the paths (TF Serving's --model_name)
    host: str = DEFAULT_HOST  # the address to listen on
    port: int = DEFAULT_PORT  # 0: any free port (`Running.port` says which)
    poll_seconds: float = DEFAULT_POLL_SECONDS  # how often the folder is looked at
    limits: Limits = field(default_factory=Limits)  # what one request may ask
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # the largest request body read


@dataclass(frozen=True)
class Running:
    """A server that answers requests."""

    settings: Settings
    versions: Versions
    port: int  # the port it listens on

    @property
    def url(self) -> str:
        """The model's REST URL, `http://HOST:PORT/v1/models/NAME`."""
        host = self.settings.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/v1/models/{self.settings.name}"


@contextlib.contextmanager
def running(settings: Settings, load: Load = servable.load) -> Iterator[Running]:
    """Listen, load the newest version (before the first request is answered), then answer
    requests and poll for versions in background threads until the block ends.

    An address that cannot be listened on (a port in use) is a UserError.
    """
    versions = Versions(settings.name, settings.source, load)
    api = RestApi(versions, settings.limits)
    try:
        server = RestServer((settings.host, settings.port), api.handle, settings.max_body_bytes)
    except OSError as err:
        raise UserError(
            f"cannot listen on {settings.host}:{settings.port} ({err.strerror or err}): pass "
            "another --port (0: any free one) or --host"
        ) from None
    try:
        versions.start(settings.poll_seconds)
        thread = threading.Thread(
            target=server.serve_forever, args=(SHUTDOWN_POLL_S,), name="rest-server", daemon=True
        )
        thread.start()
        try:
            yield Running(settings, versions, server.port)
        finally:
            server.shutdown()
    finally:
        server.server_close()
        versions.stop()
