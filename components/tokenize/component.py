"""KFP component for the tokenize step: a thin shell over `executor.run`."""

from kfp import dsl
from kfp.dsl import Dataset, Output


def tokenize(
    corpus: str,
    config: str,
    overrides: list,
    eval_fraction: float,
    metadata: str,
    pipeline_name: str,
    run_id: str,
    examples: Output[Dataset],
):
    """Tokenize a text corpus into sharded TFRecords (TFX Examples layout)."""
    from components import lineage
    from components.tokenize import executor
    from trainer.config import resolve_config

    cfg = resolve_config(config, overrides)
    params = {"corpus": corpus, "config": config, "overrides": overrides,
              "eval_fraction": eval_fraction, "vocab_size": cfg.model.vocab_size,
              "seq_len": cfg.model.seq_len}
    with lineage.step(metadata, "tokenize", pipeline_name, run_id, params) as rec:
        manifest = executor.run(corpus, examples.path, vocab_size=cfg.model.vocab_size,
                                seq_len=cfg.model.seq_len, eval_fraction=eval_fraction)
        props = executor.artifact_properties(manifest)
        examples.metadata.update(props)
        rec.output("examples", "Examples", examples.uri, props)
        rec.dataset_version = manifest["dataset_version"]


def make(image: str) -> dsl.component:
    """Return the tokenize component running in `image`."""
    return dsl.component(tokenize, base_image=image, install_kfp_package=False)
