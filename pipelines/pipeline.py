"""The gptpipe DAG: tokenize -> train -> evaluate -> push. Only the DAG; runners live elsewhere."""

from dataclasses import dataclass

from kfp import dsl, kubernetes

from components import provenance
from components.evaluate import component as evaluate_component
from components.push import component as push_component
from components.tokenize import component as tokenize_component
from components.train import component as train_component
from pipelines.config import RunConfig
from trainer.config import Config, config_to_dict

PIPELINE_NAME = "gptpipe"
_DEFAULTS = RunConfig()


@dataclass(frozen=True)
class Images:
    """Container images the steps run in, each a reference (pinned by digest on a cluster)."""

    pipeline: str  # the component image: Python with this project installed
    trainer: str  # the TFJob worker image: TensorFlow GPU with the trainer installed


def build(images: Images, config: Config) -> dsl.graph_component.GraphComponent:
    """Return the pipeline with every step bound to its image.

    `config` is the resolved trainer config, resolved once by whoever defines the run (the CLI
    or the compiler); it becomes the `config` parameter's default, a JSON object that travels
    as it is to tokenize, train and the trainer workers, so no pod opens a YAML file.
    """
    tokenize_op = tokenize_component.make(images.pipeline)
    train_op = train_component.make(images.pipeline)
    evaluate_op = evaluate_component.make(images.pipeline)
    push_op = push_component.make(images.pipeline)

    @dsl.pipeline(name=PIPELINE_NAME, description="Tokenize, train, evaluate and push a GPT.")
    def gptpipe(
        corpus: str,
        serving_dir: str,
        config: dict = config_to_dict(config),  # noqa: B008 -- KFP reads the default here
        eval_fraction: float = _DEFAULTS.eval_fraction,
        tokenizer: str = "",  # a SentencePiece model to reuse; "" trains one on the corpus
        max_nats_per_char: float = _DEFAULTS.max_nats_per_char,
        tolerance: float = _DEFAULTS.tolerance,
        launcher: str = _DEFAULTS.launcher,
        workers: int = _DEFAULTS.workers,
        gpus_per_worker: int = _DEFAULTS.gpus_per_worker,
        backoff_limit: int = _DEFAULTS.backoff_limit,
        deadline_seconds: int = _DEFAULTS.deadline_seconds,
        node_selector: dict = {},  # noqa: B006 -- TFJob worker nodeSelector
        tolerations: list = [],  # noqa: B006 -- TFJob worker tolerations
        metadata: str = _DEFAULTS.metadata,
    ):
        run = {
            "metadata": metadata,
            "pipeline_name": PIPELINE_NAME,
            "image": images.pipeline,
        }
        # Only train is cached, on what determines its output (data version, config, images).
        # Tokenize always runs: KFP would key it on the corpus URI, not its bytes, and it is
        # cheap when the data is unchanged (content-addressed reuse). Evaluate and push read and
        # change the serving folder. docs/lineage.md.
        tokenized = tokenize_op(
            corpus=corpus,
            config=config,
            eval_fraction=eval_fraction,
            tokenizer=tokenizer,
            work_root=dsl.PIPELINE_ROOT_PLACEHOLDER,
            **run,
        ).set_display_name("tokenize")
        tokenized.set_caching_options(enable_caching=False)
        trained = train_op(
            examples_uri=tokenized.outputs["examples_uri"],
            config=config,
            launcher=launcher,
            workers=workers,
            gpus_per_worker=gpus_per_worker,
            backoff_limit=backoff_limit,
            deadline_seconds=deadline_seconds,
            node_selector=node_selector,
            tolerations=tolerations,
            trainer_image=images.trainer,
            work_root=dsl.PIPELINE_ROOT_PLACEHOLDER,
            dataset_version=tokenized.outputs["dataset_version"],
            **run,
        ).set_display_name("train")
        trained.set_caching_options(enable_caching=True)
        evaluated = evaluate_op(
            examples=tokenized.outputs["examples"],
            model=trained.outputs["model"],
            serving_dir=serving_dir,
            max_nats_per_char=max_nats_per_char,
            tolerance=tolerance,
            **run,
        ).set_display_name("evaluate")
        evaluated.set_caching_options(enable_caching=False)
        pushed = push_op(
            model=trained.outputs["model"],
            blessing=evaluated.outputs["blessing"],
            serving_dir=serving_dir,
            **run,
        ).set_display_name("push")
        pushed.set_caching_options(enable_caching=False)
        for task in (tokenized, trained, evaluated, pushed):
            # The run id reaches each step as an environment variable from its pod's label, so
            # it never enters a KFP cache key (KFP ignores env there) and is always resolved.
            kubernetes.use_field_path_as_env(task, provenance.RUN_ID_ENV, provenance.RUN_ID_LABEL)

    return gptpipe
