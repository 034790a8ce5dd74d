"""KFP component for the push step: a thin shell over `executor.run`."""

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
    import os

    from components import kfp_metadata, lineage, step_edge, storage
    from components.push import executor
    from contracts.progress import Progress

    params = {"serving_dir": serving_dir}
    edge = step_edge.read("push", image, metadata, os.environ)
    reporter = Progress.from_env(os.environ, "push")  # the run view's events, if watched
    with lineage.step(
        edge.store, "push", pipeline_name, edge.run_id, params, edge.provenance
    ) as rec:
        # The serving folder is shared with TF Serving and later runs: gs:// in a cluster.
        storage.check_shared_root(serving_dir, "serving_dir", in_cluster=edge.in_cluster)
        rec.input("model", lineage.MODEL_TYPE, model.uri, upstream=True)
        rec.input("blessing", lineage.MODEL_BLESSING_TYPE, blessing.uri, upstream=True)
        result = executor.run(
            model.path,
            blessing.path,
            serving_dir,
            pushed_model.path,
            already_pushed=lambda uri: (
                lineage.find_artifact(edge.store, uri, lineage.PUSHED_MODEL_TYPE) is not None
            ),
            reporter=reporter,
        )
        props = {
            "pushed": result.pushed,
            "pushed_destination": result.pushed_destination,
            "pushed_version": result.pushed_version,
            "reason": result.reason,
        }
        pushed_model.metadata.update(kfp_metadata.recordable(props))
        rec.output("pushed_model", lineage.PUSHED_MODEL_TYPE, executor.pushed_uri(result), props)
        rec.dataset_version = model.metadata.get("dataset_version")


def make(image: str) -> dsl.component:
    """Return the push component running in `image`."""
    return dsl.component(push, base_image=image, install_kfp_package=False)
