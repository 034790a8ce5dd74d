"""The one-step pipeline of `gptpipe doctor --in-cluster`: doctor's checks in a step's pod.

Its step runs as the run's steps do (the same image, namespace, service account, metadata
address and pull secrets), so what it finds is what they will find.
"""

from kfp import compiler, dsl, kubernetes

from components.doctor import component
from components.jobs import kube

NAME = "gptpipe-doctor"


def build(
    image: str, image_pull_secrets: tuple[str, ...] = ()
) -> dsl.graph_component.GraphComponent:
    """The pipeline, its step in `image`."""
    doctor_op = component.make(image)

    @dsl.pipeline(name=NAME, description="gptpipe doctor's checks, as a run's step")
    def doctor_pipeline(pipeline_root: str, train_job: dict) -> None:
        task = doctor_op(pipeline_root=pipeline_root, train_job=train_job)
        task.set_caching_options(enable_caching=False).set_display_name("doctor")
        kubernetes.use_field_path_as_env(task, kube.POD_NAMESPACE_ENV, kube.POD_NAMESPACE_FIELD)
        if image_pull_secrets:
            kubernetes.set_image_pull_secrets(task, list(image_pull_secrets))

    return doctor_pipeline


def compile_to(path: str, image: str, image_pull_secrets: tuple[str, ...] = ()) -> None:
    """Write the compiled pipeline YAML to `path`."""
    compiler.Compiler().compile(build(image, image_pull_secrets), path)
