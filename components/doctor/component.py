"""KFP component of `gptpipe doctor --in-cluster`: one call to `pod.main`."""

from kfp import dsl


def doctor(pipeline_root: str, train_job: dict):
    """Check, as this step's identity, what a run's steps will need (components/doctor)."""
    import os

    from components.doctor import pod

    pod.main(pipeline_root, train_job, dict(os.environ))


def make(image: str) -> dsl.component:
    """Return the doctor component running in `image`."""
    return dsl.component(doctor, base_image=image, install_kfp_package=False)
