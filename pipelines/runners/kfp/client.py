"""Calls to the KFP API server through kfp.Client: retried when the server may recover, and
every failure turned into one line (`KfpError`, a `UserError`) that names the host, the
credential on a 401/403, and what the server said.

Retries: an answer of 5xx, a refused connection and a reset one are retried with exponential
backoff, at most `retries` times; a 4xx never is. A call that creates something (a run, a
recurring run, an experiment) is retried only when the request cannot have been processed: a
503 or a refused connection; a 500 or a reset may mean it was, and a second run would start.
Uploads are retried like reads: if the first attempt did land, the retry's 409 says so.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import kfp
import kfp_server_api
from urllib3.exceptions import ConnectTimeoutError, MaxRetryError
from urllib3.exceptions import HTTPError as Urllib3Error

from contracts.errors import UserError
from pipelines.runners.kfp import auth

T = TypeVar("T")

HOST_ENV = "KF_PIPELINES_ENDPOINT"  # kfp.Client's own variable for the API address
DEFAULT_RETRIES = 4  # waits 1, 2, 4, 8 s: a restarting API server pod is back within that
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
_UNPROCESSED = frozenset({503})  # the server refused before doing anything
CONNECT_TIMEOUT_S = 10.0  # each request's: a host that does not accept the connection
READ_TIMEOUT_S = 120.0  # each request's: a connection that stays silent (half-open)


class KfpError(UserError):
    """The KFP API server refused a call, or could not be reached. `status` 0: no answer."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Endpoint:
    """Where and as whom to call KFP; resolved once from the options and the environment."""

    host: str  # the API server's URL, e.g. http://localhost:8888 or https://kubeflow.example
    credential: auth.Credential  # the bearer token's source
    namespace: str = ""  # the profile namespace on a multi-user KFP; "" on a single-user one
    retries: int = DEFAULT_RETRIES  # extra attempts after a 5xx or a lost connection


def endpoint(
    host: str | None,
    token_file: Path | None,
    namespace: str,
    retries: int | None,
    env: Mapping[str, str],
) -> Endpoint:
    """The endpoint from the CLI's options, falling back to KFP's variables in `env`.

    `retries` None is DEFAULT_RETRIES.
    """
    address = host or env.get(HOST_ENV, "")
    if not address:
        raise UserError(
            f"no KFP host: pass --host URL (e.g. http://localhost:8888 after `kubectl -n "
            f"kubeflow port-forward svc/ml-pipeline 8888`) or set ${HOST_ENV}"
        )
    if not address.startswith(("http://", "https://")):
        raise UserError(f"KFP host {address!r} has no scheme: pass --host http(s)://HOST[:PORT]")
    retries = DEFAULT_RETRIES if retries is None else retries
    if retries < 0:
        raise UserError(f"--retries {retries} is negative: pass 0 or more")
    credential = auth.choose(token_file, env.get(auth.TOKEN_PATH_ENV, ""))
    return Endpoint(address.rstrip("/"), credential, namespace, retries)


class _Client(kfp.Client):  # type: ignore[misc]
    """kfp.Client whose constructor's health check is one call, not five 5-second retries.

    kfp.Client asks /healthz whether KFP is multi-user when it has no namespace; its own loop
    would hide a 401 behind 25 seconds of retries. Retrying is `Api.call`'s job.
    """

    multi_user = False

    def get_kfp_healthz(self, sleep_duration: int = 5) -> Any:
        found = self._healthz_api.healthz_service_get_healthz()
        self.multi_user = bool(found.multi_user)
        return found


class Api:
    """A connected kfp.Client and `call`, the one way this package calls it."""

    def __init__(self, where: Endpoint, sleep: Callable[[float], None] = time.sleep) -> None:
        self.where = where
        self._sleep = sleep
        # urllib3 retries a refused connection 3 times itself and logs a warning for each;
        # the one line `call` ends with says all of it.
        logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
        self.client: Any = self.call("read its health check", self._connect)
        if self.client.multi_user and not self.client.get_user_namespace():
            raise UserError(
                f"KFP at {where.host} is multi-user: pass --namespace, your profile namespace"
            )

    def _connect(self) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # "only works with KFP 2.0.0-beta.2+"
            client = _Client(
                host=self.where.host,
                namespace=self.where.namespace or "kubeflow",  # kfp.Client's "not set" value
                credentials=self.where.credential.kfp_credentials(),
            )
        _with_timeouts(client._run_api.api_client.rest_client)  # every service API's client
        return client

    @property
    def namespace(self) -> str:
        """The namespace requests are made in ("" on a single-user KFP)."""
        return str(self.client.get_user_namespace() or "")

    def call(self, what: str, fn: Callable[[], T], *, creates: bool = False) -> T:
        """Run one API call: retry what may recover, and explain the rest in one line.

        `what` names the call in messages ("list pipelines"); `creates` marks a call that a
        retry could do twice (see the module's docstring).
        """
        attempt = 0
        while True:
            try:
                return fn()
            except kfp_server_api.ApiException as err:
                status = int(err.status or 0)
                failure = self._answer_error(what, status, err, attempt + 1)
                retry = status in _UNPROCESSED if creates else status >= 500
                detail = f"HTTP {status}: {_server_message(err)}"
            except (Urllib3Error, OSError) as err:
                if isinstance(err, OSError) and err.filename:  # the token file, re-read per call
                    raise UserError(
                        f"cannot read the KFP token file {err.filename} "
                        f"({self.where.credential.source}): {err.strerror}"
                    ) from None
                failure = self._connection_error(what, err, attempt + 1)
                retry = _never_reached(err) or not creates
                detail = _connection_reason(err)
            if creates and not retry and failure.status not in range(400, 500):
                raise self._maybe_done(what, detail, failure.status) from None
            if not retry or attempt >= self.where.retries:
                raise failure from None
            delay = min(FIRST_BACKOFF_S * 2**attempt, MAX_BACKOFF_S)
            logging.getLogger(__name__).info("%s; retrying in %.0f s", failure, delay)
            self._sleep(delay)
            attempt += 1

    def _answer_error(self, what: str, status: int, err: Any, attempts: int) -> KfpError:
        host, said = self.where.host, _server_message(err)
        if status == 0:  # kfp_server_api's wrapping of a TLS failure: no HTTP answer at all
            return KfpError(f"cannot reach KFP at {host} to {what}: {said}")
        tries = f" ({attempts} attempts)" if attempts > 1 else ""
        if status in (401, 403):
            if status == 403:
                hint = (
                    "the token's identity has no access here: check the profile's contributors"
                    " or the RoleBinding, and --namespace"
                )
            elif self.where.credential.path is None:
                hint = f"pass --token-file, or set ${auth.TOKEN_PATH_ENV}"
            else:
                hint = "check the token's audience (pipelines.kubeflow.org) and its expiry"
            return KfpError(
                f"KFP at {host} refused {self.where.credential.describe()}: HTTP {status} "
                f"{_reason(err)} to {what}: {said}; {hint}",
                status,
            )
        answer = f"KFP at {host} answered {what} with HTTP {status}{tries}: {said}"
        if status >= 500:
            return KfpError(
                f"{answer}; the API server failed: see its log (`kubectl -n kubeflow logs "
                "deploy/ml-pipeline`), then run the command again",
                status,
            )
        return KfpError(answer, status)

    def _maybe_done(self, what: str, detail: str, status: int) -> KfpError:
        """A call that creates something failed after it may have reached the server (a 5xx
        or a lost reply): not retried, and "run it again" would be wrong advice."""
        return KfpError(
            f"{what} may have happened: KFP at {self.where.host} gave no clear answer "
            f"({detail}); check whether it did (the KFP UI, `gptpipe kfp runs`) before running "
            "the command again, which would do it twice",
            status,
        )

    def _connection_error(self, what: str, err: BaseException, attempts: int) -> KfpError:
        why = _connection_reason(err)
        return KfpError(
            f"cannot reach KFP at {self.where.host} to {what} ({why}, {attempts} attempt"
            f"{'s' if attempts > 1 else ''}): check --host and that the API server is up"
        )


def _with_timeouts(rest: Any) -> None:
    """Give every request of `rest` (kfp_server_api's RESTClientObject) CONNECT_TIMEOUT_S and
    READ_TIMEOUT_S. Its `request` waits forever unless a call passes `_request_timeout`
    (kfp_server_api/rest.py: `timeout = None` otherwise), and kfp.Client passes none: a
    half-open connection (a dropped port-forward during a day-long `--wait`) would hang the
    command instead of ending in an error that is retried."""
    request = rest.request

    def timed(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = (CONNECT_TIMEOUT_S, READ_TIMEOUT_S)
        return request(*args, **kwargs)

    rest.request = timed


def _never_reached(err: BaseException) -> bool:
    """True when the request never left: a refused connection, an unknown host, or a
    connection not made in time (urllib3's NewConnectionError is a ConnectTimeoutError)."""
    return isinstance(err, ConnectTimeoutError) or (
        isinstance(err, MaxRetryError) and isinstance(err.reason, ConnectTimeoutError)
    )


def _connection_reason(err: BaseException) -> str:
    if _never_reached(err):
        reason = err.reason if isinstance(err, MaxRetryError) else err
        text = str(reason)
        return "connection refused" if "refused" in text.lower() else _one_line(text, 120)
    cause = err.reason if isinstance(err, MaxRetryError) and err.reason else err
    return _one_line(f"{type(cause).__name__}: {cause}", 160)


def _reason(err: Any) -> str:
    return str(err.reason or "").strip() or "error"


def _server_message(err: Any) -> str:
    """What the server said, from its JSON error body (grpc-gateway's `message`, the upload
    handler's `error_message`) or the raw text."""
    body = err.body
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    text = str(body or "").strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        text = str(parsed.get("message") or parsed.get("error_message") or parsed.get("error"))
    return _one_line(text or str(err.reason or "no message"), 300)


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
