"""The lineage layer: the only code that talks to ML Metadata (MLMD).

Steps describe what they did with plain Python (`ArtifactRecord`, dicts of parameters) and read
lineage back as plain dicts; no MLMD proto leaves this package, so the store can be replaced
without touching a step. Steps and tools use this package's names
(`from components import lineage; lineage.step(...)`), never its submodules:

- `store`: addressing: `store_address` (the parameter, else the service KFP injects; called
  once at a component's edge), `store_config`, `is_service`, `open_store` (a SQLite path, an
  MLMD gRPC service as `host:port` or `grpc://host:port`, or over TLS as
  `grpcs://host:port[?ca=CA_FILE]`; its calls are retried, for a bounded time, while other
  writers hold the store's lock);
- `schema`: the vocabulary: TFX's artifact types (`ARTIFACT_TYPES`, each name a constant:
  `EXAMPLES_TYPE`, `MODEL_TYPE`, `MODEL_EVALUATION_TYPE`, `MODEL_BLESSING_TYPE`,
  `PUSHED_MODEL_TYPE`), the contexts
  (`PIPELINE_CONTEXT`, `RUN_CONTEXT`, `DATASET_CONTEXT`), `ArtifactRecord`, and how plain
  values and event paths are written in MLMD's protos;
- `record`: writing: `step` and its `StepRecorder`, `record_execution` (with the CACHED
  executions of the upstream steps KFP skipped), `environment_digest`;
- `query`: reading back as `ArtifactView` and `ExecutionView`: `find_artifact`, `producer_of`,
  `inputs_of`, `outputs_of`, `parameters_of`, `run_summary`, `failure_of`,
  `models_for_dataset`, `latest_pushed_model`, `latest_run_id`, `run_ids`.
- `runs`: past runs as one `RunRow` each (times, dataset version, nats/char, blessing, push),
  newest first: `list_runs`, for `gptpipe runs`.

Walking a pushed model back to its data (`gptpipe lineage`) is `pipelines.cli.lineage.trace`,
built on `query`.
"""

from components.lineage.query import (
    ArtifactView,
    ExecutionView,
    failure_of,
    find_artifact,
    inputs_of,
    latest_pushed_model,
    latest_run_id,
    models_for_dataset,
    outputs_of,
    parameters_of,
    producer_of,
    run_ids,
    run_summary,
)
from components.lineage.record import (
    StepRecorder,
    close_unfinished,
    environment_digest,
    record_execution,
    step,
)
from components.lineage.runs import RunRow, list_runs
from components.lineage.schema import (
    ARTIFACT_TYPES,
    DATASET_CONTEXT,
    EXAMPLES_TYPE,
    EXECUTION_TYPE_PREFIX,
    MODEL_BLESSING_TYPE,
    MODEL_EVALUATION_TYPE,
    MODEL_TYPE,
    PIPELINE_CONTEXT,
    PUSHED_MODEL_TYPE,
    RUN_CONTEXT,
    ArtifactRecord,
)
from components.lineage.store import is_service, open_store, store_address, store_config

__all__ = [
    "close_unfinished",
    "ARTIFACT_TYPES",
    "DATASET_CONTEXT",
    "EXAMPLES_TYPE",
    "EXECUTION_TYPE_PREFIX",
    "MODEL_BLESSING_TYPE",
    "MODEL_EVALUATION_TYPE",
    "MODEL_TYPE",
    "PUSHED_MODEL_TYPE",
    "PIPELINE_CONTEXT",
    "RUN_CONTEXT",
    "ArtifactRecord",
    "ArtifactView",
    "ExecutionView",
    "StepRecorder",
    "environment_digest",
    "failure_of",
    "find_artifact",
    "inputs_of",
    "is_service",
    "latest_pushed_model",
    "latest_run_id",
    "run_ids",
    "models_for_dataset",
    "open_store",
    "outputs_of",
    "parameters_of",
    "producer_of",
    "record_execution",
    "RunRow",
    "list_runs",
    "run_summary",
    "step",
    "store_address",
    "store_config",
]
