"""Argo's part of running a KFP 2.5.0 pipeline, for tests/doubles/kfp/backend.py.

The Argo Workflow that backend/src/v2/compiler/argocompiler (argo.go, dag.go, container.go)
makes of a pipeline, executed by argo-workflows 3.5 (the version KFP 2.5.0 builds against):
- a DAG template per DAG: a task starts when every upstream task `Succeeded` (dag.go depends);
  after a failure no new task starts (Argo's failFast default); a task's exit hook (an
  ExitHandler's exit task, dag.go/common.go addExitTask) runs when it ends, however it ends;
- the executor template of a root-DAG task with a retry policy has a retryStrategy
  (container.go getTaskRetryStrategy): each retry is a new pod;
- termination (the KFP API's TerminateRun sets activeDeadlineSeconds to 0,
  apiserver/resource/resource_manager.go): running pods are stopped, no new pods start, except
  exit handlers', which ignore the deadline (argo workflow/controller/workflowpod.go,
  exec_control.go, exit_handler.go). The run reads FAILED (KFP never reports CANCELED: below);
- an exit hook that fails leaves the run's state as the group made it (dag.go assessDAGPhase).
Tasks run one at a time in name order where Argo would run ready tasks in parallel.
"""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any

from google.protobuf import struct_pb2
from kfp.pipeline_spec import pipeline_spec_pb2 as pb

from tests.doubles.kfp.cache import ExecutionRecord
from tests.doubles.kfp.driver import (
    ContainerPlan,
    DagExecution,
    DriverError,
    RunContext,
    container_task,
    dag_task,
    pod_for,
)
from tests.doubles.kfp.gojson import message_to_py, value_to_py
from tests.doubles.kfp.ir import EXIT_STRATEGY, Pipeline, dag_dependencies, exit_hooks, retry_policy
from tests.doubles.kfp.launcher import Sandbox, launch
from tests.doubles.kfp.objectstore import BucketConfig
from tests.doubles.kfp.results import (
    CACHED,
    FAILED,
    SUCCEEDED,
    ArtifactResult,
    Attempt,
    RunResult,
    TaskResult,
)
from tests.processes import signal_group, wait_unreaped

if TYPE_CHECKING:
    from tests.doubles.kfp.backend import KfpBackend

_DONE_OK = (SUCCEEDED, CACHED)  # argocompiler/dag.go depends(): "<task>.Succeeded"
_K8S_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery's rand.String alphabet
_Running = tuple[subprocess.Popen[bytes], bool]  # a task's pod process, and: part of an exit hook


class RunHandle:
    """A run in progress: wait for it, cancel it, or kill a task's pod."""

    def __init__(
        self,
        backend: KfpBackend,
        pipeline: Pipeline,
        run_id: str,
        params: dict[str, struct_pb2.Value],
        display_name: str,
    ) -> None:
        self.backend = backend
        self.pipeline = pipeline
        self.run_id = run_id
        suffix = "".join(random.choice(_K8S_NAME_CHARS) for _ in range(5))
        self.run_name = f"{pipeline.name.split('/')[-1]}-{suffix}"  # argo.go GenerateName
        root, _, query = backend.pipeline_root.partition("?")
        self.run_root = f"{root.rstrip('/')}/{pipeline.name}/{run_id}" + (
            f"?{query}" if query else ""
        )
        self.params = params
        self.display_name = display_name
        self.tasks: dict[str, TaskResult] = {}
        self.cancelled = threading.Event()
        self._lock = threading.Lock()
        self._running: dict[str, _Running] = {}
        self._sandboxes: dict[str, Sandbox] = {}
        self._result: RunResult | None = None
        self.thread = threading.Thread(target=self._main, name=f"kfp-run-{run_id}", daemon=True)

    # ---- control -------------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> RunResult:
        self.thread.join(timeout)
        if self.thread.is_alive() or self._result is None:
            raise TimeoutError(f"run {self.run_id} still running after {timeout} s")
        return self._result

    def cancel(self, grace_seconds: float | None = None) -> None:
        """Terminate the run as the KFP API does (apiserver/resource/resource_manager.go
        TerminateWorkflow: activeDeadlineSeconds 0). Argo stops every pod that is not part of an
        exit handler: SIGTERM to the container, SIGKILL after the grace period (the kubelet); it
        starts no new pods except exit handlers', which ignore the deadline (argo-workflows
        3.5 workflow/controller/workflowpod.go, exec_control.go)."""
        self.cancelled.set()
        grace = self.backend.grace_seconds if grace_seconds is None else grace_seconds
        with self._lock:
            victims = [p for p, on_exit in self._running.values() if not on_exit]
        for process in victims:
            threading.Thread(target=_terminate, args=(process, grace), daemon=True).start()

    def kill_task(self, name: str, timeout: float = 30.0) -> None:
        """SIGKILL task `name`'s running pod (an OOM kill, a lost node), once it runs."""
        process = self._wait_running(name, timeout)
        signal_group(process, signal.SIGKILL)

    def wait_for_log(self, name: str, text: str, timeout: float = 30.0) -> None:
        """Block until the current attempt of task `name` has `text` in its log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sandbox = self._sandboxes.get(name)
            if (
                sandbox is not None
                and sandbox.log.exists()
                and text in sandbox.log.read_text(errors="replace")
            ):
                return
            time.sleep(0.05)
        raise TimeoutError(f"task {name!r} did not log {text!r} within {timeout} s")

    def _wait_running(self, name: str, timeout: float) -> subprocess.Popen[bytes]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if name in self._running:
                    return self._running[name][0]
            time.sleep(0.05)
        raise TimeoutError(f"task {name!r} was not running within {timeout} s")

    # ---- Argo ----------------------------------------------------------------------------

    def _main(self) -> None:
        backend = self.backend
        context = RunContext(
            self.pipeline,
            self.run_id,
            self.run_name,
            self.display_name,
            self.run_root,
            backend.namespace,
            backend.cache,
        )
        root = DagExecution(backend.cache.new_id(), dict(self.params), {})
        try:
            ok = self._run_dag(context, self.pipeline.spec.root.dag, root)
        except Exception as err:  # a harness bug must not hang wait(): report it as the run's error
            self._result = RunResult(
                self.run_id, self.run_name, self.run_root, FAILED, self.tasks, repr(err)
            )
            raise
        # A terminated run is FAILED in KFP 2.5: TerminateRun (apiserver/storage/run_store.go)
        # marks it CANCELING, and once the workflow has ended, ReportWorkflowResource
        # (resource/resource_manager.go) takes the workflow's own condition, a failure on the
        # zero deadline; IsTerminating (common/util/workflow.go) is false for an ended
        # workflow, so the run never reads CANCELED.
        state = SUCCEEDED if ok and not self.cancelled.is_set() else FAILED
        self._result = RunResult(
            self.run_id,
            self.run_name,
            self.run_root,
            state,
            self.tasks,
            self._error(),
            list(self.pipeline.warnings),
        )

    def _error(self) -> str:
        for task in self.tasks.values():
            if task.state == FAILED and task.kind == "CONTAINER":
                return f"task {task.name!r} failed: {task.error}\n{task.log_tail()}"
        return ""

    def _run_dag(
        self, context: RunContext, dag: pb.DagSpec, execution: DagExecution, on_exit: bool = False
    ) -> bool:
        """One DAG template: ready tasks in name order, one at a time (Argo runs them in
        parallel); after a failure no new task starts (failFast); exit hooks always run."""
        deps = dag_dependencies(dag)
        hooks = exit_hooks(dag)
        exits = {n for n, t in dag.tasks.items() if t.trigger_policy.strategy == EXIT_STRATEGY}
        pending = sorted(set(dag.tasks) - exits)
        states: dict[str, str] = {}
        failed = False
        while pending:
            ready = [n for n in pending if all(states.get(d) in _DONE_OK for d in deps[n])]
            stopped = failed or (self.cancelled.is_set() and not on_exit)
            if stopped or not ready:
                break
            name = ready[0]
            pending.remove(name)
            states[name] = self._run_task(context, execution, name, dag.tasks[name], on_exit)
            failed = failed or states[name] == FAILED
            for hook in hooks.get(name, []):  # dag.go/common.go addExitTask: the task's exit hook
                # Argo 3.5 exit_handler.go runOnExitNode hangs the hook's node under the task's,
                # and dag.go assessDAGPhase takes a DAG's phase from its target tasks alone: a
                # failed exit hook shows only as its own task's state, never the run's (KFP
                # PR #11470: "the run's status is not impacted" by the exit task).
                states[hook] = self._run_task(context, execution, hook, dag.tasks[hook], True)
        for name in dag.tasks:
            if name not in states:
                self.tasks.setdefault(
                    name, TaskResult(name, _kind(context.pipeline, dag.tasks[name]))
                )
        return not failed and not (self.cancelled.is_set() and not on_exit) and not pending

    def _run_task(
        self,
        context: RunContext,
        dag: DagExecution,
        name: str,
        task: pb.PipelineTaskSpec,
        on_exit: bool,
    ) -> str:
        component = context.pipeline.component(task)
        if component.HasField("dag"):
            result = self.tasks[name] = TaskResult(name, "DAG")
            try:
                child = dag_task(context, dag, name, task)
            except DriverError as err:
                result.state, result.error = FAILED, f"driver: {err}"
                return FAILED
            result.state = (
                SUCCEEDED if self._run_dag(context, component.dag, child, on_exit) else FAILED
            )
            return result.state
        return self._run_container(context, dag, name, task, on_exit)

    def _run_container(
        self,
        context: RunContext,
        dag: DagExecution,
        name: str,
        task: pb.PipelineTaskSpec,
        on_exit: bool,
    ) -> str:
        result = self.tasks[name] = TaskResult(name, "CONTAINER")
        try:
            plan = container_task(context, dag, name, task)
        except DriverError as err:
            result.state, result.error = FAILED, f"driver: {err}"
            return FAILED
        result.executor_input = _plain(plan.executor_input)
        result.fingerprint = plan.fingerprint
        if plan.cached is not None:  # driver.go: reuse the outputs, publish CACHED, start no pod
            reused = ExecutionRecord(plan.execution_id, name, self.run_id)
            reused.output_parameters = dict(plan.cached.output_parameters)
            reused.output_artifacts = dict(plan.cached.output_artifacts)
            context.store.record_execution(reused)
            dag.record(task.task_info.name, reused)
            result.cached_from_run = plan.cached.run_id
            _fill_outputs(result, reused)
            result.state = CACHED
            return CACHED
        policy = retry_policy(context.pipeline.spec, name)
        record = self._attempts(context, plan, result, policy, on_exit)
        if record is None:  # the launcher published a FAILED execution, without outputs
            dag.record(task.task_info.name, ExecutionRecord(plan.execution_id, name, self.run_id))
            result.state = FAILED
            return FAILED
        context.store.record_execution(record)
        if plan.fingerprint:  # launcher_v2.go Execute: CreateExecutionCache after success
            context.store.add_entry(
                plan.fingerprint, context.pipeline.name, context.namespace, record
            )
        dag.record(task.task_info.name, record)
        _fill_outputs(result, record)
        result.state = SUCCEEDED
        return SUCCEEDED

    def _attempts(
        self,
        context: RunContext,
        plan: ContainerPlan,
        result: TaskResult,
        policy: pb.PipelineTaskSpec.RetryPolicy | None,
        on_exit: bool,
    ) -> ExecutionRecord | None:
        """The executor template's pods; container.go getTaskRetryStrategy: Argo retries a failed
        pod up to maxRetryCount times, waiting duration * factor^n (factor cut to an integer)."""
        limit = policy.max_retry_count if policy is not None else 0
        first = time.monotonic()
        for attempt in range(limit + 1):
            if attempt and policy is not None:
                factor = int(policy.backoff_factor or 1)
                wait = policy.backoff_duration.seconds * factor ** (attempt - 1)
                max_total = policy.backoff_max_duration.seconds
                if max_total and time.monotonic() - first + wait > max_total:
                    break
                time.sleep(wait)
            if self.cancelled.is_set() and not on_exit:
                break  # no new pods after termination; the node is failed, not retried
            record = self._one_attempt(context, plan, result, on_exit)
            if record is not None or (self.cancelled.is_set() and not on_exit):
                return record
        return None

    def _one_attempt(
        self, context: RunContext, plan: ContainerPlan, result: TaskResult, on_exit: bool
    ) -> ExecutionRecord | None:
        try:
            pod = pod_for(context, plan, self.backend.settings)
        except DriverError as err:
            result.error = str(err)
            result.attempts.append(Attempt("", "", -1, str(err), ""))
            return None
        sandbox = Sandbox.create(self.backend.work_dir / self.run_id, pod)
        self._sandboxes[plan.task_name] = sandbox
        launch_context = {
            "client": self.backend.client,
            "bucket": BucketConfig.parse(context.run_root),
            "env": self.backend.env,
            "store": context.store,
            "run_id": self.run_id,
        }
        timer: list[threading.Timer] = []
        grace = self.backend.grace_seconds
        deadline_hit = threading.Event()

        def past_deadline(process: subprocess.Popen[bytes]) -> None:
            deadline_hit.set()
            _terminate(process, grace)

        def started(process: subprocess.Popen[bytes]) -> None:
            with self._lock:
                self._running[plan.task_name] = (process, on_exit)
            if self.cancelled.is_set() and not on_exit:
                threading.Thread(target=_terminate, args=(process, grace), daemon=True).start()
            if pod.active_deadline_seconds:  # the pod's activeDeadlineSeconds (Kubernetes config)
                timer.append(
                    threading.Timer(pod.active_deadline_seconds, past_deadline, (process,))
                )
                timer[0].start()

        try:
            outcome = launch(plan, pod, sandbox, launch_context, started)
        finally:
            with self._lock:
                self._running.pop(plan.task_name, None)
            for t in timer:
                t.cancel()
        error = outcome.error
        if outcome.record is None and deadline_hit.is_set():
            error = f"DeadlineExceeded: pod active longer than its activeDeadlineSeconds ({error})"
        if self.cancelled.is_set() and not on_exit and outcome.record is None:
            error = f"Step exceeded its deadline ({error})"  # exec_control.go, on termination
        log = (
            sandbox.log.read_text(encoding="utf-8", errors="replace")
            if sandbox.log.exists()
            else ""
        )
        result.attempts.append(Attempt(pod.name, pod.uid, outcome.exit_code, error, log))
        result.error = error
        return outcome.record


def _kind(pipeline: Pipeline, task: pb.PipelineTaskSpec) -> str:
    return "DAG" if pipeline.component(task).HasField("dag") else "CONTAINER"


def _plain(message: Any) -> dict[str, Any]:
    return dict(message_to_py(message))


def _fill_outputs(result: TaskResult, record: ExecutionRecord) -> None:
    result.output_parameters = {k: value_to_py(v) for k, v in record.output_parameters.items()}
    result.output_artifacts = {
        k: ArtifactResult(a.uri, dict(a.custom_properties))
        for k, a in record.output_artifacts.items()
    }


def _terminate(process: subprocess.Popen[bytes], grace: float) -> None:
    """The kubelet stopping a container: SIGTERM (Argo's emissary forwards it to the process
    group), then SIGKILL when the grace period is over."""
    signal_group(process, signal.SIGTERM)
    # Not process.wait: the launcher thread (launcher.run_user_command) is the one that
    # reaps, after it has SIGKILLed what the process left in its group.
    if not wait_unreaped(process, grace):
        signal_group(process, signal.SIGKILL)
