"""KFP component for train's exit handler: delete the run's TFJobs, however the run ended.

The TFJob's ownerReference to the train step's pod acts only when that pod object is deleted,
which KFP does up to a day after the run; a cancelled run, a step killed by OOM or eviction,
or a launcher that crashed would otherwise leave workers holding GPUs until
`activeDeadlineSeconds`. The pipeline wraps its steps in `dsl.ExitHandler(release)`.
"""

from kfp import dsl


def release(launcher: str) -> int:
    """Delete every TFJob labelled with this run's id in this namespace; return how many.

    Nothing to do for the local launcher, whose workers are the train step's own children.
    """
    import os

    from components import kube, provenance
    from components.train import tfjob

    if launcher != "tfjob":
        print("release: the local launcher leaves no TFJob behind")
        return 0
    run_id = provenance.run_id(os.environ)
    pod = kube.pod_identity(os.environ)
    deleted = tfjob.delete_run_jobs(kube.default_api_client(), pod.namespace, run_id)
    print(f"release: deleted {len(deleted)} TFJob(s) of run {run_id}: {', '.join(deleted)}")
    return len(deleted)


def make(image: str) -> dsl.component:
    """Return the release component running in `image`."""
    return dsl.component(release, base_image=image, install_kfp_package=False)
