"""KFP component for the evaluate step: a thin shell over `executor.run`."""

from kfp import dsl
from kfp.dsl import HTML, Artifact, Input, Markdown, Metrics, Model, Output


def evaluate(
    examples_uri: str,
    dataset_version: str,
    model: Input[Model],
    serving_dir: str,
    max_nats_per_char: float,
    tolerance: float,
    metadata: str,
    pipeline_name: str,
    image: str,
    metrics: Output[Metrics],
    report: Output[Markdown],
    blessing: Output[Artifact],
    html_report: Output[HTML],
):
    """Compare the candidate with the model in service on the same eval text; bless or not.

    The Examples arrive as their content-addressed URI, as train's do: the KFP artifact of
    tokenize holds only their manifest, and evaluate reads only the eval text.

    `html_report` is one self-contained HTML file, which the KFP UI shows as it is; it also
    tells this run's steps so far, read back from lineage. `metrics` holds its key numbers.
    """
    import os

    from components import kfp_metadata, lineage, step_edge, storage
    from components.evaluate import executor

    params = {
        "serving_dir": serving_dir,
        "max_nats_per_char": max_nats_per_char,
        "tolerance": tolerance,
    }
    edge = step_edge.read("evaluate", image, metadata, os.environ)
    with lineage.step(
        edge.store, "evaluate", pipeline_name, edge.run_id, params, edge.provenance
    ) as rec:
        # The serving folder is shared with TF Serving and later runs: gs:// in a cluster.
        storage.check_shared_root(serving_dir, "serving_dir", in_cluster=edge.in_cluster)
        rec.input("examples", lineage.EXAMPLES_TYPE, examples_uri, upstream=True)
        rec.input("model", lineage.MODEL_TYPE, model.uri, upstream=True)
        facts = executor.RunFacts(
            dataset_version=dataset_version,
            code_version=str(edge.provenance.get("code_version", "")),
            executions=list(lineage.run_summary(edge.store, edge.run_id)["steps"].values()),
        )
        result = executor.run(
            model.path,
            examples_uri,
            serving_dir,
            blessing.path,
            report.path,
            max_nats_per_char=max_nats_per_char,
            tolerance=tolerance,
            html_report_path=html_report.path,
            run_facts=facts,
        )
        numbers = executor.metrics(result)
        for name, value in kfp_metadata.recordable(numbers).items():
            metrics.log_metric(name, value)
        decided = executor.model_blessing(result, model.uri)
        blessing.metadata.update(kfp_metadata.recordable(decided.properties()))
        rec.output("evaluation", lineage.MODEL_EVALUATION_TYPE, metrics.uri, numbers)
        rec.output("blessing", lineage.MODEL_BLESSING_TYPE, blessing.uri, dict(blessing.metadata))
        html = {"media_type": "text/html"}
        rec.output("html_report", lineage.MODEL_EVALUATION_TYPE, html_report.uri, html)
        rec.dataset_version = dataset_version


def make(image: str) -> dsl.component:
    """Return the evaluate component running in `image`."""
    return dsl.component(evaluate, base_image=image, install_kfp_package=False)
