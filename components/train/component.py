"""KFP component for the train step: its signature, and one call to `executor.execute`."""

from kfp import dsl
from kfp.dsl import Model, Output


def train(
    examples_uri: str,
    dataset_version: str,
    config: dict,
    train_job: dict,
    trainer_image: str,
    artifact_root: str,
    metadata: str,
    pipeline_name: str,
    image: str,
    model: Output[Model],
):
    """Train the GPT on the Examples with `train_job`'s workers (a TFJob or local processes).

    `config` is the resolved trainer config (`config_to_dict`), resolved once where the run was
    defined; `train_job` is `contracts.params.TrainJob` as a JSON object. `examples_uri`
    (content-addressed) and `dataset_version` come from the tokenize task as parameters, not as
    an artifact: KFP keys an input artifact by its identity, new every run, while these values
    change exactly when the data does. With `config` and `train_job`, they make this task's KFP
    cache key. The training work folder (checkpoints, backup) is
    `<artifact_root>/work/<run>/train`.
    """
    inputs = dict(locals())
    from components import step
    from components.train import executor

    step.run("train", executor.execute, inputs)


def make(image: str) -> dsl.component:
    """Return the train component running in `image`."""
    return dsl.component(train, base_image=image, install_kfp_package=False)
