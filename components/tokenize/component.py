"""KFP component for the tokenize step: its signature, and one call to `executor.execute`."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Dataset, Output


def tokenize(
    corpus: str,
    config: dict,
    tokenize: dict,
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
    the Examples. `tokenize` is `contracts.params.TokenizeParams` as a JSON object.

    The Examples live at `<artifact_root>/datasets/<dataset_version>/`, written once per version
    and reused after: the output artifact points there. Returns that URI and the dataset version
    as output parameters, so the train task's KFP cache key follows the data, and nothing per-run
    (docs/lineage.md).
    """
    inputs = dict(locals())
    from components import step
    from components.tokenize import executor

    return step.run("tokenize", executor.execute, inputs)


def make(image: str) -> dsl.component:
    """Return the tokenize component running in `image`."""
    return dsl.component(tokenize, base_image=image, install_kfp_package=False)
