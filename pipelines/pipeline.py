"""The gptpipe DAG: tokenize -> train -> evaluate -> push. Only the DAG; runners live elsewhere."""

from dataclasses import dataclass

from kfp import dsl, kubernetes

from components import provenance
from components.evaluate import component as evaluate_component
from components.jobs import kube
from components.push import component as push_component
from components.tokenize import component as tokenize_component
from components.train import component as train_component
from components.train import release as release_component
from contracts.params import EvalPolicy, TokenizeParams, TrainJob
from pipelines.config import STEP_RESOURCES, RunConfig
from trainer.config import Config, config_to_dict

PIPELINE_NAME = "gptpipe"
EXIT_TASK = "release"  # the exit handler's task: KFP names it after release_component.release
# KFP retries of the train step (KFP 2.14+; 2.5 ignores a retry policy inside the exit handler's
# group): an OOM-killed launcher, whose retry re-attaches to the TFJob. Argo retries a Failed
# pod only, not one lost with its node (an Error), and only within backoffMaxDuration (the
# SDK's cap, 1 h) of the first attempt's start, which is also the retried pod's deadline
# (argo-workflows operator.go processNodeRetries): a retry saves a training that ends within
# that hour; a longer one fails at the hour, as it would have failed without the retry.
TRAIN_RETRIES = 2
_DEFAULTS = RunConfig()


@dataclass(frozen=True)
class Images:
    """Container images the steps run in, each a reference (pinned by digest on a cluster)."""

    pipeline: str  # the component image: Python with this project installed
    trainer: str  # the TFJob worker image: TensorFlow GPU with the trainer installed


@dataclass(frozen=True)
class Target:
    """What the DAG fixes at compile time about where it runs; everything else is a parameter."""

    images: Images  # the images every step and the TFJob workers run
    # KFP's defaultPipelineRoot for this pipeline, and the artifact_root parameter's default:
    # gs:// on a cluster (the compiler refuses anything else); "" for kfp.local, which is given
    # its own root and passes artifact_root explicitly.
    pipeline_root: str = ""
    image_pull_secrets: tuple[str, ...] = ()  # Secrets the step pods pull their image with
    # Wrap the steps in a dsl.ExitHandler that deletes the run's TFJobs however the run ends.
    # kfp.local (2.13) cannot run an exit handler (kfp/local/dag_orchestrator.py refuses it),
    # and a local run's workers are the train step's own child processes.
    release_on_exit: bool = True


def build(target: Target, config: Config) -> dsl.graph_component.GraphComponent:
    """Return the pipeline with every step bound to its image and its cluster settings.

    `config` is the resolved trainer config, resolved once by whoever defines the run (the CLI
    or the compiler); it becomes the `config` parameter's default, a JSON object that travels
    as it is to tokenize, train and the trainer workers, so no pod opens a YAML file.
    """
    images = target.images
    tokenize_op = tokenize_component.make(images.pipeline)
    train_op = train_component.make(images.pipeline)
    evaluate_op = evaluate_component.make(images.pipeline)
    push_op = push_component.make(images.pipeline)
    release_op = release_component.make(images.pipeline)

    def on_cluster(task: dsl.PipelineTask, step: str) -> dsl.PipelineTask:
        """What every step's pod gets: its resources, pull secrets and the run id."""
        resources = STEP_RESOURCES[step]
        task.set_cpu_request(resources.cpu_request).set_cpu_limit(resources.cpu_limit)
        task.set_memory_request(resources.memory_request)
        task.set_memory_limit(resources.memory_limit)
        if target.image_pull_secrets:
            kubernetes.set_image_pull_secrets(task, list(target.image_pull_secrets))
        # The run id reaches each step as an environment variable from its pod's label, so
        # it never enters a KFP cache key (KFP ignores env there) and is always resolved.
        kubernetes.use_field_path_as_env(task, provenance.RUN_ID_ENV, provenance.RUN_ID_LABEL)
        kubernetes.use_field_path_as_env(task, kube.POD_NAMESPACE_ENV, kube.POD_NAMESPACE_FIELD)
        return task.set_display_name(step)

    @dsl.pipeline(
        name=PIPELINE_NAME,
        description="Tokenize, train, evaluate and push a GPT.",
        pipeline_root=target.pipeline_root or None,
    )
    def gptpipe(
        corpus: str,
        serving_dir: str,
        artifact_root: str = target.pipeline_root,  # datasets/ and work/ live here (gs://)
        config: dict = config_to_dict(config),  # noqa: B008 -- KFP reads the default here
        tokenize: dict = TokenizeParams().to_dict(),  # noqa: B008 -- contracts.params
        train_job: dict = TrainJob().to_dict(),  # noqa: B008 -- contracts.params
        eval_policy: dict = EvalPolicy().to_dict(),  # noqa: B008 -- contracts.params
        metadata: str = _DEFAULTS.metadata,
    ):
        run = {"metadata": metadata, "pipeline_name": PIPELINE_NAME, "image": images.pipeline}

        def steps() -> None:
            # Only train is cached, on what determines its output (data version, config,
            # job, images). Tokenize always runs: KFP would key it on the corpus URI, not its
            # bytes, and it is cheap when the data is unchanged (content-addressed reuse).
            # Evaluate and push read and change the serving folder. docs/lineage.md.
            tokenized = tokenize_op(
                corpus=corpus,
                config=config,
                tokenize=tokenize,
                artifact_root=artifact_root,
                **run,
            )
            on_cluster(tokenized, "tokenize").set_caching_options(enable_caching=False)
            trained = train_op(
                examples_uri=tokenized.outputs["examples_uri"],
                dataset_version=tokenized.outputs["dataset_version"],
                config=config,
                train_job=train_job,
                trainer_image=images.trainer,
                artifact_root=artifact_root,
                **run,
            )
            on_cluster(trained, "train").set_caching_options(enable_caching=True)
            # A retried train step re-attaches to its TFJob (a deterministic name) or resumes
            # from the work folder's backup (TRAIN_RETRIES says when KFP retries at all); the
            # TFJob's own restarts are under train_job.backoff_limit.
            trained.set_retry(num_retries=TRAIN_RETRIES, backoff_duration="60s")
            evaluated = evaluate_op(
                examples_uri=tokenized.outputs["examples_uri"],
                dataset_version=tokenized.outputs["dataset_version"],
                model=trained.outputs["model"],
                serving_dir=serving_dir,
                eval_policy=eval_policy,
                **run,
            )
            on_cluster(evaluated, "evaluate").set_caching_options(enable_caching=False)
            pushed = push_op(
                model=trained.outputs["model"],
                blessing=evaluated.outputs["blessing"],
                serving_dir=serving_dir,
                **run,
            )
            on_cluster(pushed, "push").set_caching_options(enable_caching=False)

        if target.release_on_exit:
            release = release_op(train_job=train_job, metadata=metadata)
            on_cluster(release, "release")
            release.set_caching_options(enable_caching=False)
            with dsl.ExitHandler(release):
                steps()
        else:
            steps()

    return gptpipe
