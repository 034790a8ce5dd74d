"""KFP component for the train step: launches the trainer workers and collects the Model."""

from kfp import dsl
from kfp.dsl import Model, Output


def train(
    examples_uri: str,
    config: str,
    overrides: list,
    launcher: str,
    workers: int,
    gpus_per_worker: int,
    backoff_limit: int,
    deadline_seconds: int,
    node_selector: dict,
    tolerations: list,
    trainer_image: str,
    work_root: str,
    metadata: str,
    pipeline_name: str,
    image: str,
    dataset_version: str,
    config_hash: str,
    model: Output[Model],
):
    """Train the GPT on the Examples with `workers` trainer processes (a TFJob or local).

    `deadline_seconds` 0 means no deadline. `examples_uri` (content-addressed),
    `dataset_version` and `config_hash` come from the tokenize task as parameters, not as an
    artifact: KFP keys an input artifact by its identity, new every run, while these values
    change exactly when the data or the config do. So they make this task's KFP cache key.
    """
    import os

    from components import lineage, provenance
    from components.train import executor

    placement = executor.cluster_placement(os.environ) if launcher == "tfjob" else {}
    job = executor.TrainJob(
        launcher=launcher,
        workers=workers,
        gpus_per_worker=gpus_per_worker,
        image=trainer_image,
        backoff_limit=backoff_limit,
        deadline_seconds=deadline_seconds or None,
        node_selector=node_selector,
        tolerations=tolerations,
        **placement,
    )
    params = {
        "config": config,
        "overrides": overrides,
        "launcher": launcher,
        "workers": workers,
        "gpus_per_worker": gpus_per_worker,
        "backoff_limit": backoff_limit,
        "deadline_seconds": deadline_seconds,
        "node_selector": node_selector,
        "tolerations": tolerations,
        "trainer_image": trainer_image,
        "config_hash": config_hash,
    }
    run_id, found = provenance.at_step_start(image, os.environ)
    with lineage.step(metadata, "train", pipeline_name, run_id, params, found) as rec:
        rec.input("examples", "Examples", examples_uri, upstream=True)
        executor.check_cache_inputs(
            examples_uri, dataset_version, config_hash, config=config, overrides=overrides
        )
        result = executor.run(
            examples_uri,
            model.uri,
            f"{work_root}/work/{run_id}/train",
            config=config,
            overrides=overrides,
            job=job,
            run_id=run_id,
        )
        properties = {**result.model_properties, "dataset_version": dataset_version}
        model.metadata.update(properties)
        rec.set(**result.execution_properties)
        rec.output("model", "Model", model.uri, properties)
        rec.dataset_version = dataset_version


def make(image: str) -> dsl.component:
    """Return the train component running in `image`."""
    return dsl.component(train, base_image=image, install_kfp_package=False)
