"""KFP component for the run's exit handler: delete its TFJobs and Jobs, close its lineage.

The TFJob's ownerReference to the train step's pod acts only when that pod object is deleted,
which KFP does up to a day after the run. On a cancelled run the step pods die at once (the
component's `sh` wrapper does not pass SIGTERM on to Python), and a step killed by OOM or
eviction runs no cleanup either: without this, workers would hold GPUs until
`activeDeadlineSeconds`, and those steps would stay RUNNING in lineage. The same holds for the
batch/v1 Indexed Jobs that run tokenize's parts (components/jobs/indexed). The pipeline wraps
its steps in `dsl.ExitHandler(release)`, which runs however the steps end.
"""

from kfp import dsl


def release(train_job: dict, metadata: str) -> int:
    """Delete this run's unfinished TFJobs and Indexed Jobs in this namespace; return how many.

    `train_job` is the train step's `contracts.params.TrainJob`, as a JSON object. The local
    launcher leaves no TFJob (its workers are the train step's own children). Indexed Jobs
    are looked for whenever this runs in a KFP pod (on a cluster, where tokenize's parts run
    as one unless its launcher is local).
    Steps whose execution is still RUNNING were killed: lineage records them FAILED. The jobs
    go first: GPUs matter more than the record, which a lineage outage must not block; a
    failure to delete them (RBAC, the API server) fails the exit task once lineage is closed.
    """
    import os

    from components import lineage, provenance
    from components.jobs import kube
    from contracts.errors import UserError, one_line_errors
    from contracts.params import TrainJob

    with one_line_errors("gptpipe release"):
        run_id = provenance.run_id(os.environ)
    try:
        launcher = TrainJob.from_dict(train_job).launcher
    except UserError as err:  # the cleanup still runs: a TFJob may hold GPUs
        print(f"release: {err}; deleting the run's TFJobs, if any")
        launcher = "tfjob"
    from components.jobs.indexed import cleanup as indexed_cleanup
    from components.jobs.tfjob import cleanup as tfjob_cleanup

    pod = kube.pod_identity(os.environ)
    kinds = [("TFJob", tfjob_cleanup.delete_run_jobs)] if launcher == "tfjob" else []
    if pod.name:
        kinds.append(("Job", indexed_cleanup.delete_run_jobs))
    deleted: list[str] = []
    not_deleted: Exception | None = None
    for kind, delete_run_jobs in kinds:
        try:
            gone = delete_run_jobs(kube.default_api_client(), pod.namespace, run_id)
        except Exception as err:  # noqa: BLE001 -- raised below, once lineage is closed
            not_deleted = not_deleted or err
            print(f"release: could not delete the {kind}s of run {run_id}: {err}")
        else:
            print(f"release: deleted {len(gone)} {kind}(s) of run {run_id}")
            for name in gone:
                print(f"  {name}")
            deleted += gone
    why = "the step's pod ended before the step did (killed, evicted, or the run was cancelled)"
    try:
        closed = lineage.close_unfinished(lineage.store_address(metadata, os.environ), run_id, why)
    except Exception as err:  # noqa: BLE001 -- the record is best effort here, the jobs are not
        print(f"release: could not close the run's lineage: {err}")
        closed = []
    if closed:
        print(f"release: recorded {', '.join(closed)} as FAILED: their pods were stopped")
    if not_deleted is not None:
        raise not_deleted
    return len(deleted)


def make(image: str) -> dsl.component:
    """Return the release component running in `image`."""
    return dsl.component(release, base_image=image, install_kfp_package=False)
