"""KFP component for the tokenize step: a thin shell over `executor.run_content_addressed`."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Dataset, Output


def tokenize(
    corpus: str,
    config: dict,
    eval_fraction: float,
    tokenizer: str,
    artifact_root: str,
    metadata: str,
    pipeline_name: str,
    image: str,
    examples: Output[Dataset],
) -> NamedTuple(  # type: ignore[valid-type]  # KFP reads outputs from this form
    "TokenizeOutputs", [("examples_uri", str), ("dataset_version", str)]
):
    """Tokenize a text corpus into sharded TFRecords (TFX Examples layout).

    `config` is the resolved trainer config (`config_to_dict`); its vocab_size and seq_len shape
    the Examples. `tokenizer` is a SentencePiece model to reuse; "" trains one on the corpus.

    The Examples live at `<artifact_root>/datasets/<dataset_version>/`, written once per version and
    reused after: the output artifact points there. Returns that URI and the dataset version as
    output parameters, so the train task's KFP cache key follows the data, and nothing per-run
    (docs/lineage.md).
    """
    import os

    from components import kfp_metadata, lineage, step_edge, storage
    from components.tokenize import executor
    from contracts.artifacts import DATASETS_DIR
    from contracts.progress import Progress
    from trainer.config import config_from_dict

    params = {
        "corpus": corpus,
        "config": config,
        "eval_fraction": eval_fraction,
        "tokenizer": tokenizer,
        "artifact_root": artifact_root,
    }
    edge = step_edge.read("tokenize", image, metadata, os.environ)
    reporter = Progress.from_env(os.environ, "tokenize")  # the run view's events, if watched
    with lineage.step(
        edge.store, "tokenize", pipeline_name, edge.run_id, params, edge.provenance
    ) as rec:
        cfg = config_from_dict(config)
        storage.check_shared_root(artifact_root, "artifact_root", in_cluster=edge.in_cluster)
        storage.check_shared_root(examples.uri, "the pipeline root", in_cluster=edge.in_cluster)
        rec.set(vocab_size=cfg.model.vocab_size, seq_len=cfg.model.seq_len)
        dataset = executor.run_content_addressed(
            corpus,
            storage.join(artifact_root, DATASETS_DIR),
            vocab_size=cfg.model.vocab_size,
            seq_len=cfg.model.seq_len,
            eval_fraction=eval_fraction,
            tokenizer=tokenizer or None,
            reporter=reporter,
        )
        manifest = dataset.manifest
        rec.set(reused=int(dataset.reused))
        props = executor.artifact_properties(manifest)
        # The KFP artifact stays in the run's folder (KFP 2.5.0's launcher fails a task whose
        # output URI leaves it) and points at the content-addressed Examples, which lineage
        # records as the Examples.
        executor.write_reference(examples.path, dataset)
        examples.metadata.update(kfp_metadata.recordable({**props, "examples_uri": dataset.uri}))
        rec.output("examples", lineage.EXAMPLES_TYPE, dataset.uri, props)
        rec.dataset_version = manifest.dataset_version
    return (dataset.uri, manifest.dataset_version)


def make(image: str) -> dsl.component:
    """Return the tokenize component running in `image`."""
    return dsl.component(tokenize, base_image=image, install_kfp_package=False)
