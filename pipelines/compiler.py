"""Compile the pipeline to the YAML that the KFP UI and API accept."""

import json
from pathlib import Path

from kfp import compiler

from contracts.errors import UserError
from pipelines.paths import check_output
from pipelines.pipeline import Images, Target, build
from trainer.config import Config

DIGEST_LOCK = Path(__file__).resolve().parent.parent / "images" / "digests.json"
UNPINNED_IMAGES = Images(
    pipeline="ghcr.io/gptpipe/gptpipe-pipeline:latest",
    trainer="ghcr.io/gptpipe/gptpipe-trainer:latest",
)


def load_images(lock: Path | None = None, allow_unpinned: bool = False) -> Images:
    """Read image references from the digest lock (`make images` writes it).

    Every reference must carry a digest (`repo@sha256:...`), so a cluster runs exactly the
    images that were built; without a lock, `allow_unpinned` falls back to `:latest` tags.
    """
    lock = lock or DIGEST_LOCK
    if not lock.is_file():
        if allow_unpinned:
            return UNPINNED_IMAGES
        raise UserError(
            f"no image digest lock at {lock}: run `make images REGISTRY=...` to build and pin the "
            "images, or pass --allow-unpinned to compile with unpinned tags"
        )
    try:
        refs = json.loads(lock.read_text(encoding="utf-8"))
    except (ValueError, OSError) as err:
        raise UserError(f"image digest lock {lock} cannot be read as JSON: {err}") from None
    if not isinstance(refs, dict) or not all(isinstance(v, str) for v in refs.values()):
        raise UserError(
            f"image digest lock {lock} is not a JSON object of image references "
            '({"pipeline": "repo@sha256:...", "trainer": "repo@sha256:..."}): run `make images`'
        )
    images = Images(pipeline=refs.get("pipeline", ""), trainer=refs.get("trainer", ""))
    for name, ref in (("pipeline", images.pipeline), ("trainer", images.trainer)):
        if "@sha256:" not in ref and not allow_unpinned:
            raise UserError(
                f"image {name!r} in {lock} is not pinned by digest ({ref!r}); "
                "expected repo@sha256:..., or pass --allow-unpinned"
            )
    return images


def check_pipeline_root(root: str) -> None:
    """Refuse a pipeline root that is not gs://: the steps and TFJob workers share it.

    KFP's own default is `minio://mlpipeline/v2/artifacts`, which the storage layer cannot
    reach; "" leaves the root to KFP's defaultPipelineRoot, which must then be gs:// too.
    """
    if root and not root.startswith("gs://"):
        raise UserError(
            f"pipeline root {root!r} is not gs://: gptpipe's steps and TFJob workers share "
            "artifacts on GCS; pass --pipeline-root gs://BUCKET/PATH (and set KFP's "
            "defaultPipelineRoot, in its kfp-launcher ConfigMap, to a gs:// bucket as well)"
        )


def compile_pipeline(output: str | Path, target: Target, config: Config) -> Path:
    """Write the compiled pipeline YAML to `output` and return its path.

    `config`, resolved by the caller, is the default of the pipeline's `config` parameter; a run
    may pass another resolved config (`gptpipe` resolves presets, YAML files and overrides).
    `target.pipeline_root` becomes the YAML's defaultPipelineRoot and artifact_root's default.
    """
    check_pipeline_root(target.pipeline_root)
    check_output(output, "--output", (".yaml", ".yml"))  # KFP's compiler takes either
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build(target, config), str(output))
    return output
