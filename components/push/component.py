"""KFP component for the push step: its signature, and one call to `executor.execute`."""

from kfp import dsl
from kfp.dsl import Artifact, Input, Model, Output


def push(
    model: Input[Model],
    blessing: Input[Artifact],
    serving_dir: str,
    metadata: str,
    pipeline_name: str,
    image: str,
    pushed_model: Output[Artifact],
):
    """Publish the model to the serving destination if, and only if, it is blessed."""
    inputs = dict(locals())
    from components import step
    from components.push import executor

    step.run("push", executor.execute, inputs)


def make(image: str) -> dsl.component:
    """Return the push component running in `image`."""
    return dsl.component(push, base_image=image, install_kfp_package=False)
