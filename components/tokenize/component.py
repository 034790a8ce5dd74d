"""KFP component for the tokenize step: a thin shell over `executor.run_content_addressed`."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Dataset, Output


def tokenize(
    corpus: str,
    config: str,
    overrides: list,
    eval_fraction: float,
    tokenizer: str,
    work_root: str,
    metadata: str,
    pipeline_name: str,
    image: str,
    examples: Output[Dataset],
) -> NamedTuple(  # type: ignore[valid-type]  # KFP reads outputs from this form
    "TokenizeOutputs", [("examples_uri", str), ("dataset_version", str), ("config_hash", str)]
):
    """Tokenize a text corpus into sharded TFRecords (TFX Examples layout).

    `tokenizer` is a SentencePiece model to reuse; "" trains one on the corpus.

    The Examples live at `<work_root>/datasets/<dataset_version>/`, written once per version and
    reused after: the output artifact points there. Returns that URI, the dataset version and
    the trainer config's hash as output parameters, so the train task's KFP cache key follows
    the data and the config, and nothing per-run (docs/lineage.md).
    """
    import os

    from components import lineage, provenance
    from components.tokenize import executor
    from trainer.config import config_hash, resolve_config

    params = {
        "corpus": corpus,
        "config": config,
        "overrides": overrides,
        "eval_fraction": eval_fraction,
        "tokenizer": tokenizer,
    }
    run_id, found = provenance.at_step_start(image, os.environ)
    with lineage.step(metadata, "tokenize", pipeline_name, run_id, params, found) as rec:
        cfg = resolve_config(config, overrides)
        rec.set(vocab_size=cfg.model.vocab_size, seq_len=cfg.model.seq_len)
        dataset = executor.run_content_addressed(
            corpus,
            f"{work_root}/datasets",
            vocab_size=cfg.model.vocab_size,
            seq_len=cfg.model.seq_len,
            eval_fraction=eval_fraction,
            tokenizer=tokenizer or None,
        )
        manifest = dataset.manifest
        rec.set(reused=int(dataset.reused))
        examples.uri = dataset.uri  # the artifact is the content-addressed folder
        props = executor.artifact_properties(manifest)
        examples.metadata.update(props)
        rec.output("examples", "Examples", examples.uri, props)
        rec.dataset_version = manifest["dataset_version"]
    return (dataset.uri, manifest["dataset_version"], config_hash(cfg))


def make(image: str) -> dsl.component:
    """Return the tokenize component running in `image`."""
    return dsl.component(tokenize, base_image=image, install_kfp_package=False)
