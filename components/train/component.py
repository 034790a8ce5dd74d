"""KFP component for the train step: launches the trainer workers and collects the Model."""

from kfp import dsl
from kfp.dsl import Model, Output


def train(
    examples_uri: str,
    config: dict,
    launcher: str,
    workers: int,
    gpus_per_worker: int,
    backoff_limit: int,
    deadline_seconds: int,
    node_selector: dict,
    tolerations: list,
    trainer_image: str,
    artifact_root: str,
    metadata: str,
    pipeline_name: str,
    image: str,
    dataset_version: str,
    model: Output[Model],
    # KFP takes a lightweight component's defaults as literals: they equal JobSpec's (a test
    # checks), whose fields they fill.
    worker_cpu: str = "4",
    worker_memory: str = "16Gi",
    service_account: str = "",
):
    """Train the GPT on the Examples with `workers` trainer processes (a TFJob or local).

    `config` is the resolved trainer config (`config_to_dict`), resolved once where the run was
    defined. `deadline_seconds` 0 means no deadline. `examples_uri` (content-addressed) and
    `dataset_version` come from the tokenize task as parameters, not as an artifact: KFP keys an
    input artifact by its identity, new every run, while these values change exactly when the
    data does. With `config`, they make this task's KFP cache key. The training work folder
    (checkpoints, backup) is `<artifact_root>/work/<run>/train`.

    TFJob workers get `worker_cpu` and `worker_memory` as requests and limits, and run as
    `service_account`; "" means the train step's own, and they always get the step's image
    pull secrets.
    """
    import os

    from components import kfp_metadata, lineage, step_edge, storage
    from components.train import executor
    from contracts.artifacts import step_work_dir
    from trainer.config import config_from_dict, config_hash

    params = {
        "config": config,
        "launcher": launcher,
        "workers": workers,
        "gpus_per_worker": gpus_per_worker,
        "backoff_limit": backoff_limit,
        "deadline_seconds": deadline_seconds,
        "node_selector": node_selector,
        "tolerations": tolerations,
        "trainer_image": trainer_image,
        "worker_cpu": worker_cpu,
        "worker_memory": worker_memory,
        "service_account": service_account,
    }
    edge = step_edge.read("train", image, metadata, os.environ)
    with lineage.step(
        edge.store, "train", pipeline_name, edge.run_id, params, edge.provenance
    ) as rec:
        rec.input("examples", lineage.EXAMPLES_TYPE, examples_uri, upstream=True)
        cfg = config_from_dict(config)  # a hand-edited config fails here, on the record
        rec.parameters["config_hash"] = config_hash(cfg)
        executor.check_cache_inputs(examples_uri, dataset_version)
        # The workers write the Model and the work folder themselves: both must be on gs://
        # in a cluster (a minio:// pipeline root is refused here, before any GPU starts).
        storage.check_shared_root(artifact_root, "artifact_root", in_cluster=edge.in_cluster)
        storage.check_shared_root(model.uri, "the pipeline root", in_cluster=edge.in_cluster)
        placement = (
            executor.cluster_placement(edge.pod, service_account) if launcher == "tfjob" else {}
        )
        work_dir = storage.join(artifact_root, step_work_dir(edge.run_id, "train"))
        spec = executor.job_spec(
            examples_uri,
            model.uri,
            work_dir,
            cfg,
            launcher=launcher,
            run_id=edge.run_id,
            image=trainer_image,
            workers=workers,
            gpus_per_worker=gpus_per_worker,
            cpu=worker_cpu,
            memory=worker_memory,
            backoff_limit=backoff_limit,
            active_deadline_seconds=deadline_seconds or None,  # the one place the names differ
            node_selector=node_selector,
            tolerations=tolerations,
            allow_unpinned=executor.allows_unpinned(launcher, image),
            **placement,
        )
        launched_by = executor.make_launcher(launcher, work_dir)
        result = executor.run(spec, cfg, model.uri, work_dir, launched_by)
        properties = {**result.model_properties, "dataset_version": dataset_version}
        model.metadata.update(kfp_metadata.recordable(properties))
        rec.set(**result.execution_properties)
        rec.output("model", lineage.MODEL_TYPE, model.uri, properties)
        rec.dataset_version = dataset_version


def make(image: str) -> dsl.component:
    """Return the train component running in `image`."""
    return dsl.component(train, base_image=image, install_kfp_package=False)
