"""KFP component for the evaluate step: its signature, and one call to `executor.execute`."""

from kfp import dsl
from kfp.dsl import HTML, Artifact, Input, Markdown, Metrics, Model, Output


def evaluate(
    examples_uri: str,
    dataset_version: str,
    model: Input[Model],
    serving_dir: str,
    eval_policy: dict,
    metadata: str,
    pipeline_name: str,
    image: str,
    metrics: Output[Metrics],
    report: Output[Markdown],
    blessing: Output[Artifact],
    html_report: Output[HTML],
):
    """Compare the candidate with the model in service on the same eval text; bless or not.

    `eval_policy` is `contracts.params.EvalPolicy` as a JSON object. `html_report` is one
    self-contained HTML file, which the KFP UI shows as it is; `metrics` holds its key numbers.
    """
    inputs = dict(locals())
    from components import step
    from components.evaluate import executor

    step.run("evaluate", executor.execute, inputs)


def make(image: str) -> dsl.component:
    """Return the evaluate component running in `image`."""
    return dsl.component(evaluate, base_image=image, install_kfp_package=False)
