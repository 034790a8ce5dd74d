"""How the KFP API double's runs go: a `RunScript` per run, and the task details KFP 2.5
builds from the Argo workflow's nodes once a run has ended."""

from __future__ import annotations

import datetime
import uuid
from dataclasses import dataclass
from typing import Any

import kfp_server_api


@dataclass
class RunScript:
    """How the next created run goes."""

    outcome: str = "SUCCEEDED"  # or "FAILED"
    running_polls: int = 2  # GETs that answer RUNNING before the outcome
    failed_task: str = "train"  # the task that fails when the outcome is FAILED
    duration_s: int = 3725  # created_at to finished_at
    run_id: str = ""  # the id the run gets ("" for a fresh uuid), to seed ML Metadata with
    release_fails: bool = False  # the exit task fails (the run's state stays the steps')
    attempts: int = 1  # pods the failed task ran (KFP 2.14+ honours a retry policy)
    flaked_task: str = ""  # a task whose first pod failed and whose retry succeeded


def advance(run: Any, script: RunScript, polls: int) -> None:
    """Move a run on by one GET: RUNNING for `running_polls`, then the outcome."""
    if polls <= script.running_polls:
        run.state = "RUNNING"
        return
    if run.state in ("SUCCEEDED", "FAILED"):
        return
    run.state = script.outcome
    run.finished_at = run.created_at + datetime.timedelta(seconds=script.duration_s)
    run.run_details = kfp_server_api.V2beta1RunDetails(task_details=tasks(run, script))


def tasks(run: Any, script: RunScript) -> list[Any]:
    """Task details as KFP 2.5 builds them, one per Argo node (apiserver/server/api_converter.go
    toModelTask for util.NodeStatus: `pod_name` is the node id, `child_tasks` the node's
    Children, no `parent_task_id`). The nodes are those of the Workflow argocompiler makes:
    argo.go/dag.go the entrypoint's "root-driver" then "root", per task "<name>-driver" then
    "<name>"; container.go an executor DAG whose pod node is "executor"; dag.go addExitTask
    the ExitHandler's exit task as a lifecycle hook of "exit-handler-1". They are linked as
    argo-workflows 3.5 links them: dag.go executeDAGTask makes a task without dependencies a
    child of its DAG's node and any other a child of its dependencies' outbound (pod) nodes, so
    the steps form a chain, not a fan; exit_handler.go runOnExitNode makes the hook's node a
    child of the task's. A failed exit hook does not fail its parent (dag.go assessDAGPhase)."""
    failed = script.outcome == "FAILED"
    outcome = "FAILED" if failed else "SUCCEEDED"
    nodes: list[dict[str, Any]] = []

    def node(name: str, state: str = "SUCCEEDED", parent: Any = None) -> Any:
        made = {"name": name, "state": state, "children": []}
        made["id"] = f"{run.run_id[:8]}-{len(nodes)}"
        if parent is not None:
            parent["children"].append(made["id"])
        nodes.append(made)
        return made

    workflow = node(f"gptpipe-{run.run_id[:5]}", outcome)
    root = node("root", outcome, node("root-driver", parent=workflow))
    handler = node("exit-handler-1", outcome, node("exit-handler-1-driver", parent=root))
    outbound = handler  # the first task hangs off the DAG's node, each next off the last pod
    for step in ("tokenize", "train", "evaluate", "push"):
        fails = failed and step == script.failed_task
        state = "FAILED" if fails else "SUCCEEDED"
        task = node(step, state, node(f"{step}-driver", parent=outbound))
        attempts = script.attempts if fails else (2 if step == script.flaked_task else 1)
        if attempts == 1:
            outbound = node("executor", state, task)
        else:  # a retryStrategy (container.go): a Retry node over pods "executor(<attempt>)"
            retry = node("executor", state, task)  # (argo operator.go processNodeRetries)
            for attempt in range(attempts):
                last = attempt == attempts - 1
                pod_state = state if last else "FAILED"
                outbound = node(f"executor({attempt})", pod_state, retry)
        if fails:
            break
    release_state = "FAILED" if script.release_fails else "SUCCEEDED"
    hook = node("exit-handler-1.onExit", release_state, handler)
    release = node("release", release_state, node("release-driver", parent=hook))
    node("executor", release_state, release)
    return [task_detail(run, made) for made in nodes]


def task_detail(run: Any, made: dict[str, Any]) -> Any:
    """api_converter.go toApiPipelineTaskDetail: no `error`, in the task or its state history
    (set only when the task's own record cannot be converted)."""
    return kfp_server_api.V2beta1PipelineTaskDetail(
        run_id=run.run_id,
        task_id=str(uuid.uuid4()),
        display_name=made["name"],
        state=made["state"],
        pod_name=made["id"],
        state_history=[kfp_server_api.V2beta1RuntimeStatus(state=made["state"])],
        child_tasks=[
            kfp_server_api.PipelineTaskDetailChildTask(pod_name=child) for child in made["children"]
        ]
        or None,
    )
