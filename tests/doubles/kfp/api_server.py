"""A wire-level double of KFP 2.5's v2beta1 REST API, for the real `kfp.Client(host=...)`.

It serves what `gptpipe kfp` calls, over HTTP from a thread: pipelines (list with a filter,
create, upload, get), pipeline versions (upload, list), experiments (list, create), runs
(create, get, list) and recurring runs (list, create, delete, disable). Request bodies are
parsed into kfp_server_api's models and answers are those models' JSON, the shapes of
backend/api/v2beta1/*.proto with original (snake_case) field names, as grpc-gateway v1.16
marshals them (OrigName, no default values: an empty list is left out).

Each behaviour names the KFP 2.5.0 source it follows. Faults for tests: `fail_next` (an HTTP
error such as a 503, then the real answer), `reset_next` (the connection dropped unanswered)
and `refuse` (nothing listens any more). Runs follow `RunScript`s: each GET of a run moves it
on, PENDING, then RUNNING, then SUCCEEDED or FAILED, so no test waits on a clock.
"""

from __future__ import annotations

import datetime
import email.parser
import email.policy
import json
import re
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kfp_server_api

from tests.doubles.kfp import pipeline_spec, run_details, wire
from tests.doubles.kfp.run_details import RunScript
from tests.doubles.kfp.scope import NamespaceScope
from tests.doubles.kfp.wire import ApiError, dump, parse

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_START = datetime.datetime(2025, 1, 6, 2, 0, tzinfo=datetime.UTC)
RESET = -1  # a fault that drops the connection instead of answering
STALL = -2  # a fault that answers nothing for STALL_S, then drops it (a half-open connection)
STALL_S = 3.0


class KfpApiDouble(NamespaceScope):
    """The double's state and its HTTP server. Use as a context manager; `host` is its URL."""

    def __init__(self, token: str | None = "secret-token", multi_user: bool = False) -> None:
        self.token = token  # the bearer token it accepts; None accepts any request
        self.multi_user = multi_user
        self.pipelines: dict[str, Any] = {}
        self.versions: dict[str, Any] = {}
        self.version_yaml: dict[str, str] = {}
        self.experiments: dict[str, Any] = {}
        self.runs: dict[str, Any] = {}
        # run id -> its namespace: model.Run's, which the v2beta1 Run does not carry
        self.run_namespaces: dict[str, str] = {}
        self.recurring_runs: dict[str, Any] = {}
        self.run_scripts: list[RunScript] = []  # for the next created runs; then the default
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status) answered
        self._scripts: dict[str, tuple[RunScript, int]] = {}
        self._faults: list[tuple[int, str, str]] = []  # (status or RESET, method, path prefix)
        self._clock = _START
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None

    # ---- lifecycle and faults ------------------------------------------------------------

    def __enter__(self) -> KfpApiDouble:
        handler = type("Handler", (_Handler,), {"double": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.host = f"http://127.0.0.1:{self._server.server_address[1]}"
        # A short poll: shutdown() waits for the loop to look, 0.5 s by default, at every exit.
        threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.refuse()

    def refuse(self) -> None:
        """Stop listening: every later connection is refused."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def fail_next(
        self, status: int = 503, times: int = 1, method: str = "", path: str = ""
    ) -> None:
        """Answer the next `times` matching requests with `status` instead of serving them."""
        self._faults += [(status, method, path)] * times

    def stall_next(self, times: int = 1, method: str = "", path: str = "") -> None:
        """Leave the next `times` matching requests unanswered for STALL_S, then drop them."""
        self._faults += [(STALL, method, path)] * times

    def reset_next(self, times: int = 1, method: str = "", path: str = "") -> None:
        """Drop the next `times` matching connections without an answer (a reset)."""
        self._faults += [(RESET, method, path)] * times

    def statuses(self, method: str, path: str) -> list[int]:
        """The statuses answered to `method path`, in order."""
        return [s for m, p, s in self.requests if m == method and p == path]

    # ---- seeding -------------------------------------------------------------------------

    def tick(self, seconds: int = 1) -> datetime.datetime:
        """The double's clock, moved on: creation times are distinct and ordered."""
        self._clock += datetime.timedelta(seconds=seconds)
        return self._clock

    def add_run(self, name: str, state: str, version_id: str = "", duration_s: int = 0) -> str:
        """A run that is already where a test needs it (finished, or still RUNNING)."""
        created = self.tick(60)
        run = kfp_server_api.V2beta1Run(
            run_id=str(uuid.uuid4()),
            display_name=name,
            experiment_id="",
            state=state,
            storage_state="AVAILABLE",
            created_at=created,
            finished_at=created + datetime.timedelta(seconds=duration_s) if duration_s else _EPOCH,
            pipeline_version_reference=kfp_server_api.V2beta1PipelineVersionReference(
                pipeline_id="", pipeline_version_id=version_id
            ),
        )
        self.runs[run.run_id] = run
        return str(run.run_id)

    # ---- pipelines and versions ----------------------------------------------------------

    def list_pipelines(self, query: dict[str, str]) -> dict[str, Any]:
        # pipeline_server.go listPipelines: the filter (filter.proto) over display_name, in
        # exactly the namespace (pipeline_store.go ListPipelines: Namespace = ns; "" is the
        # shared pipelines', listed apart from any namespace's).
        found = self._exactly_in(self.pipelines.values(), query)
        return wire.page("pipelines", wire.listed(found, query))

    def create_pipeline(self, body: bytes) -> Any:
        pipeline = parse(body, "V2beta1Pipeline")
        pipeline.namespace = self.namespace(pipeline.namespace) or None  # pipeline_server.go
        self._unique_pipeline(pipeline.display_name, pipeline.namespace)
        pipeline.pipeline_id = str(uuid.uuid4())
        pipeline.created_at = self.tick()
        self.pipelines[pipeline.pipeline_id] = pipeline
        return dump(pipeline)

    def _unique_pipeline(self, name: str, namespace: str | None) -> None:
        # pipeline_store.go CreatePipeline: a duplicate (name, namespace) is AlreadyExists.
        if any(
            p.display_name == name and (p.namespace or "") == (namespace or "")
            for p in self.pipelines.values()
        ):
            raise ApiError(
                409, 6, f"Failed to create a new pipeline. The name {name} already exists."
            )

    def upload_pipeline(self, query: dict[str, str], form: tuple[str, bytes]) -> Any:
        # pipeline_upload_server.go UploadPipeline: a pipeline and its first version, both
        # named after `name` (else the file name); 409 in the upload handler's error shape.
        filename, data = form
        name = query.get("name") or filename
        try:
            self._unique_pipeline(name, self.namespace(query.get("namespace")))
        except ApiError as err:
            raise ApiError(409, 6, err.message, upload=True) from None
        pipeline = kfp_server_api.V2beta1Pipeline(
            pipeline_id=str(uuid.uuid4()),
            display_name=name,
            description=query.get("description"),
            namespace=self.namespace(query.get("namespace")) or None,  # upload server's
            created_at=self.tick(),
        )
        self.pipelines[pipeline.pipeline_id] = pipeline
        self._add_version(pipeline.pipeline_id, name, data.decode())
        return dump(pipeline)

    def upload_version(self, query: dict[str, str], form: tuple[str, bytes]) -> Any:
        # pipeline_upload_server.go UploadPipelineVersion: `pipelineid` is required (400);
        # a name taken in the pipeline is AlreadyExists (pipeline_store.go), answered 409; any
        # other failure, an unknown pipeline included, is a 500.
        pipeline_id = query.get("pipelineid", "")
        if not pipeline_id:
            raise ApiError(
                400,
                3,
                "Failed to create a pipeline version due to error reading pipeline id",
                upload=True,
            )
        if pipeline_id not in self.pipelines:
            raise ApiError(
                500,
                5,
                f"Failed to create a pipeline version: pipeline {pipeline_id} not found",
                upload=True,
            )
        name = query.get("name") or form[0]
        if any(
            v.pipeline_id == pipeline_id and v.display_name == name for v in self.versions.values()
        ):
            raise ApiError(
                409,
                6,
                "Failed to create a pipeline version. The pipeline already exists.: Failed to "
                f"create a new pipeline version. The name {name} already exist. Specify a new name",
                upload=True,
            )
        return dump(self._add_version(pipeline_id, name, form[1].decode()))

    def _add_version(self, pipeline_id: str, name: str, text: str) -> Any:
        version = kfp_server_api.V2beta1PipelineVersion(
            pipeline_id=pipeline_id,
            pipeline_version_id=str(uuid.uuid4()),
            display_name=name,
            created_at=self.tick(),
            pipeline_spec=pipeline_spec.spec_struct(text),
        )
        self.versions[version.pipeline_version_id] = version
        self.version_yaml[version.pipeline_version_id] = text
        return version

    def get_pipeline(self, pipeline_id: str) -> Any:
        # pipeline_server.go GetPipeline: an unknown id is NotFound (404).
        if pipeline_id not in self.pipelines:
            raise ApiError(404, 5, f"Pipeline {pipeline_id} not found")
        return dump(self.pipelines[pipeline_id])

    def list_versions(self, pipeline_id: str, query: dict[str, str]) -> dict[str, Any]:
        # pipeline_server.go ListPipelineVersions: 404 for an unknown pipeline; filter, then
        # sort_by ("created_at desc"), then page_size.
        if pipeline_id not in self.pipelines:
            raise ApiError(404, 5, f"Pipeline {pipeline_id} not found")
        mine = [v for v in self.versions.values() if v.pipeline_id == pipeline_id]
        return wire.page("pipeline_versions", wire.listed(mine, query))

    def latest_version(self, pipeline_id: str) -> Any:
        # resource_manager.go GetLatestPipelineVersion: the newest by creation time.
        mine = [v for v in self.versions.values() if v.pipeline_id == pipeline_id]
        if pipeline_id not in self.pipelines or not mine:
            raise ApiError(404, 5, f"Failed to get the latest pipeline version of {pipeline_id}")
        return max(mine, key=lambda v: v.created_at)

    # ---- experiments ---------------------------------------------------------------------

    def list_experiments(self, query: dict[str, str]) -> dict[str, Any]:
        # experiment_server.go listExperiments: the filter, in exactly the namespace
        # (experiment_store.go ListExperiments: Namespace = ns); multi-user mode refuses ""
        # (canAccessExperiment).
        if self.multi_user and not query.get("namespace"):
            raise ApiError(
                400,
                3,
                "List experiments failed: Failed to authorize with API: Invalid input error: "
                "An experiment cannot have an empty namespace in multi-user mode",
            )
        found = self._exactly_in(self.experiments.values(), query)
        return wire.page("experiments", wire.listed(found, query))

    def create_experiment(self, body: bytes) -> Any:
        # experiment_server.go createExperiment: the namespace through ReplaceNamespace;
        # experiment_store.go CreateExperiment: a duplicate (name, namespace) is AlreadyExists.
        experiment = parse(body, "V2beta1Experiment")
        experiment.namespace = self.namespace(experiment.namespace) or None
        if any(
            e.display_name == experiment.display_name
            and (e.namespace or "") == (experiment.namespace or "")
            for e in self.experiments.values()
        ):
            raise ApiError(409, 6, f"Experiment {experiment.display_name} already exists")
        experiment.experiment_id = str(uuid.uuid4())
        experiment.created_at = self.tick()
        experiment.storage_state = "AVAILABLE"
        self.experiments[experiment.experiment_id] = experiment
        return dump(experiment)

    # ---- runs ----------------------------------------------------------------------------

    def create_run(self, body: bytes) -> Any:
        # run_server.go CreateRun over resource_manager.go CreateRun: the experiment must exist;
        # a version reference without a version id runs the newest version
        # (fetchPipelineVersionFromPipelineSpec) and the run records the version it ran.
        run = parse(body, "V2beta1Run")
        if not run.display_name:  # run_server.go createRun
            raise ApiError(
                400,
                3,
                "Failed to create a new run: Failed to create a run due to invalid name: Invalid "
                "input error: The run name is empty. Please specify a valid name",
            )
        if run.experiment_id not in self.experiments:
            raise ApiError(404, 5, f"Experiment {run.experiment_id} not found")
        reference = run.pipeline_version_reference
        if reference is not None:
            version = (
                self.versions.get(reference.pipeline_version_id)
                if reference.pipeline_version_id
                else self.latest_version(reference.pipeline_id)
            )
            if version is None:
                raise ApiError(
                    404, 5, f"Pipeline version {reference.pipeline_version_id} not found"
                )
            reference.pipeline_version_id = version.pipeline_version_id
            spec = pipeline_spec.root_spec(self.version_yaml[version.pipeline_version_id])
        elif not run.pipeline_spec:
            raise ApiError(400, 3, "Failed to create a run: a pipeline spec source is missing")
        else:
            spec = run.pipeline_spec.get("pipeline_spec", run.pipeline_spec)
        # resource_manager.go CreateRun -> v2_template.go RunWorkflow, validatePipelineJobInputs
        problem = pipeline_spec.invalid_inputs(spec, run.runtime_config)
        if problem:
            raise ApiError(
                400,
                3,
                "Failed to create a new run: Failed to generate the ExecutionSpec: invalid "
                f"pipeline job inputs: Invalid input error: {problem}",
            )
        script = self.run_scripts.pop(0) if self.run_scripts else RunScript()
        run.run_id = script.run_id or str(uuid.uuid4())
        run.state = "PENDING"
        run.storage_state = "AVAILABLE"
        run.created_at = self.tick()
        run.finished_at = _EPOCH  # toApiRun: an unfinished run's FinishedAtInSec is 0
        self.runs[run.run_id] = run
        # createRun: the run's namespace is its experiment's (GetValidExperimentNamespacePair)
        self.run_namespaces[run.run_id] = self.experiments[run.experiment_id].namespace or ""
        self._scripts[run.run_id] = (script, 0)
        return dump(run)

    def get_run(self, run_id: str) -> Any:
        # run_server.go GetRun: an unknown id is NotFound; a known one moves on (RunScript).
        if run_id not in self.runs:
            raise ApiError(404, 5, f"Run {run_id} not found")
        run = self.runs[run_id]
        if run_id in self._scripts:
            script, polls = self._scripts[run_id]
            self._scripts[run_id] = (script, polls + 1)
            run_details.advance(run, script, polls + 1)
        return dump(run)

    def list_runs(self, query: dict[str, str]) -> dict[str, Any]:
        # run_server.go listRuns: filter, sort_by, page_size, within the experiment or the
        # namespace (`_scoped`).
        found = self._scoped(
            self.runs.values(),
            query,
            lambda r: self.run_namespaces.get(r.run_id, ""),
            "A run cannot have an empty namespace in multi-user mode",
            "Failed to list runs",
        )
        return wire.page("runs", wire.listed(found, query))

    # ---- recurring runs ------------------------------------------------------------------

    def list_recurring_runs(self, query: dict[str, str]) -> dict[str, Any]:
        # job_server.go listJobs, scoped as runs are; recurring_run.proto
        # ListRecurringRunsResponse: the field is named `recurringRuns`.
        found = self._scoped(
            self.recurring_runs.values(),
            query,
            lambda j: j.namespace or "",
            "a recurring run cannot have an empty namespace in multi-user mode",
            "Failed to list jobs",
        )
        return wire.page("recurringRuns", wire.listed(found, query))

    def create_recurring_run(self, body: bytes) -> Any:
        # resource_manager.go CreateJob: a pipeline id without a version id leaves the version
        # out (the controller's runs take the newest), but the parameters are checked on the
        # newest version (v2_template.go ScheduledWorkflow, validatePipelineJobInputs).
        # api_converter.go toModelJob checks the cron with robfig's Parse. job_server.go
        # createJob: the namespace is the experiment's, else the one given (ReplaceNamespace).
        job = parse(body, "V2beta1RecurringRun")
        reference = job.pipeline_version_reference
        if reference is None or not reference.pipeline_id:
            raise ApiError(400, 3, "Cannot create a job with an empty pipeline ID")
        latest = self.latest_version(reference.pipeline_id)
        problem = pipeline_spec.invalid_inputs(
            pipeline_spec.root_spec(self.version_yaml[latest.pipeline_version_id]),
            job.runtime_config,
        )
        if problem:
            raise ApiError(
                400,
                3,
                "Failed to create a recurring run: Failed to validate the input parameters on "
                "the latest pipeline version: invalid pipeline job inputs: Invalid input "
                f"error: {problem}",
            )
        experiment = self.experiments.get(job.experiment_id or "")
        job.namespace = (experiment.namespace if experiment else None) or (
            self.namespace(job.namespace) or None
        )
        cron = job.trigger.cron_schedule.cron if job.trigger and job.trigger.cron_schedule else ""
        if cron and not (cron.startswith("@") or len(cron.split()) in (5, 6)):
            raise ApiError(400, 3, f"Schedule cron is not a supported format: {cron}")
        job.recurring_run_id = str(uuid.uuid4())
        job.created_at = job.updated_at = self.tick()
        job.status = "ENABLED" if job.mode != "DISABLE" else "DISABLED"
        self.recurring_runs[job.recurring_run_id] = job
        return dump(job)

    def delete_recurring_run(self, recurring_run_id: str) -> Any:
        # resource_manager.go DeleteJob: an unknown id is NotFound.
        if self.recurring_runs.pop(recurring_run_id, None) is None:
            raise ApiError(404, 5, f"RecurringRun {recurring_run_id} not found")
        return {}

    def disable_recurring_run(self, recurring_run_id: str) -> Any:
        # resource_manager.go ChangeJobMode: mode DISABLE, the ScheduledWorkflow disabled.
        job = self.recurring_runs.get(recurring_run_id)
        if job is None:
            raise ApiError(404, 5, f"RecurringRun {recurring_run_id} not found")
        job.mode, job.status = "DISABLE", "DISABLED"
        return {}


_ROUTES: list[tuple[str, re.Pattern[str], Callable[..., Any]]] = []


def _route(method: str, pattern: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        _ROUTES.append((method, re.compile(f"/apis/v2beta1/{pattern}$"), fn))
        return fn

    return register


class _Handler(BaseHTTPRequestHandler):
    """HTTP in front of KfpApiDouble: faults, the bearer token, routing, error shapes."""

    protocol_version = "HTTP/1.1"
    double: KfpApiDouble

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        double = self.double
        with double._lock:
            fault = self._take_fault(method, url.path)
        if fault == STALL:  # outside the lock: other requests are served meanwhile
            time.sleep(STALL_S)
            self.close_connection = True
            return
        with double._lock:
            if fault == RESET:
                self._reset(method, url.path)
                return
            try:
                if fault:
                    raise ApiError(fault, 14, "upstream connect error or disconnect/reset")
                self._authenticate(url.path)
                status, payload = 200, self._dispatch(method, url.path, query, body)
            except ApiError as err:
                status, payload = err.status, wire.error_body(err)
            double.requests.append((method, url.path, status))
        self._send(status, payload)

    def _take_fault(self, method: str, path: str) -> int:
        for index, (status, want_method, prefix) in enumerate(self.double._faults):
            if want_method in ("", method) and path.startswith(prefix):
                del self.double._faults[index]
                return status
        return 0

    def _authenticate(self, path: str) -> None:
        # main.go serves /healthz outside the authenticated API; everything else goes through
        # the auth interceptor (auth/authenticator_token_review.go: a bearer token, reviewed).
        token = self.double.token
        if token is None or path.endswith("/healthz"):
            return
        if self.headers.get("Authorization", "") != f"Bearer {token}":
            raise ApiError(
                401,
                16,
                "Request header error: Failed to review the token provided: the token "
                "is not valid for audience pipelines.kubeflow.org",
            )

    def _dispatch(self, method: str, path: str, query: dict[str, str], body: bytes) -> Any:
        for want, pattern, fn in _ROUTES:
            match = pattern.match(path)
            if want == method and match:
                return fn(self, query, body, **match.groupdict())
        raise ApiError(404, 5, f"Not Found: {method} {path}")

    def _form_file(self, body: bytes) -> tuple[str, bytes]:
        """The `uploadfile` part of a multipart form (pipeline_upload_server.go FormFileKey)."""
        head = f"Content-Type: {self.headers['Content-Type']}\r\n\r\n".encode()
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
        for part in message.iter_parts():
            if part.get_param("name", header="content-disposition") == "uploadfile":
                return part.get_filename() or "", part.get_payload(decode=True)
        raise ApiError(400, 3, "Failed to read pipeline from file: no uploadfile", upload=True)

    def _reset(self, method: str, path: str) -> None:
        self.double.requests.append((method, path, RESET))
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()

    def _send(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    # ---- routes (paths from kfp_server_api's *_service_api.py) ---------------------------

    @_route("GET", "healthz")
    def _healthz(self, query: dict[str, str], body: bytes) -> Any:
        # main.go: {"commit_sha", "tag_name", "multi_user"}.
        return {"commit_sha": "double", "tag_name": "2.5.0", "multi_user": self.double.multi_user}

    @_route("GET", "pipelines")
    def _list_pipelines(self, query: dict[str, str], body: bytes) -> Any:
        return self.double.list_pipelines(query)

    @_route("POST", "pipelines")
    def _create_pipeline(self, query: dict[str, str], body: bytes) -> Any:
        return self.double.create_pipeline(body)

    @_route("POST", "pipelines/upload")
    def _upload(self, query: dict[str, str], body: bytes) -> Any:
        return self.double.upload_pipeline(query, self._form_file(body))

    @_route("POST", "pipelines/upload_version")
    def _upload_version(self, query: dict[str, str], body: bytes) -> Any:
        return self.double.upload_version(query, self._form_file(body))

    @_route("GET", "pipelines/(?P<pipeline_id>[^/]+)")
    def _get_pipeline(self, query: dict[str, str], body: bytes, pipeline_id: str) -> Any:
        return self.double.get_pipeline(pipeline_id)

    @_route("GET", "pipelines/(?P<pipeline_id>[^/]+)/versions")
    def _list_versions(self, query: dict[str, str], body: bytes, pipeline_id: str) -> Any:
        return self.double.list_versions(pipeline_id, query)

    @_route("GET", "experiments")
    def _list_experiments(self, query: dict[str, str], body: bytes) -> Any:
        return self.double.list_experiments(query)

    @_route("POST", "experiments")
    def _create_experiment(self, query: dict[str, str], body: bytes) -> Any:
        return self.double.create_experiment(body)

    @_route("POST", "runs")
    def _create_run(self, query: dict[str, str], body: bytes) -> Any:
        return self.double.create_run(body)

    @_route("GET", "runs")
    def _list_runs(self, query: dict[str, str], body: bytes) -> Any:
        return self.double.list_runs(query)

    @_route("GET", "runs/(?P<run_id>[^/:]+)")
    def _get_run(self, query: dict[str, str], body: bytes, run_id: str) -> Any:
        return self.double.get_run(run_id)

    @_route("GET", "recurringruns")
    def _list_recurring(self, query: dict[str, str], body: bytes) -> Any:
        return self.double.list_recurring_runs(query)

    @_route("POST", "recurringruns")
    def _create_recurring(self, query: dict[str, str], body: bytes) -> Any:
        return self.double.create_recurring_run(body)

    @_route("DELETE", "recurringruns/(?P<rid>[^/:]+)")
    def _delete_recurring(self, query: dict[str, str], body: bytes, rid: str) -> Any:
        return self.double.delete_recurring_run(rid)

    @_route("POST", "recurringruns/(?P<rid>[^/:]+):disable")
    def _disable_recurring(self, query: dict[str, str], body: bytes, rid: str) -> Any:
        return self.double.disable_recurring_run(rid)
