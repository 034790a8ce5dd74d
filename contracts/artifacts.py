"""Artifact layouts: the folder and file names inside every artifact gptpipe writes or reads.

TFX's artifact contracts, followed without TFX (it cannot be installed beside ml-metadata 1.17.1):
Examples (`Split-<name>/` shards), Model (`Format-Serving/`), ModelBlessing (`BLESSED` or
`NOT_BLESSED`) and PushedModel (`PUSHED` or `NOT_PUSHED`), plus TF Serving's version folders.
Names are relative to the artifact's folder; callers join them with `storage.join` (local or
gs://) or `posixpath.join` (the trainer's tf.io.gfile). docs/design.md shows each layout whole.
"""

from __future__ import annotations

import json
from pathlib import Path

# ---- Examples (the tokenize step writes, train and evaluate read) --------------------------
SPLITS = ("train", "eval")  # the splits every Examples folder has
EXAMPLES_MANIFEST = "manifest.json"  # written last: its presence marks the folder complete
TOKENIZER_FILE = "tokenizer.model"  # the SentencePiece model the shards were encoded with
EVAL_TEXT = "raw/eval.jsonl"  # the eval split's documents (contracts/eval_text.py), for scoring
# A sketch of the train split's text (components/overlap.py): how much of an eval text a
# model trained on. The trainer copies it into the SavedModel (MODEL_TEXT_SKETCH).
TRAIN_TEXT_SKETCH = "train_text_sketch.bin"
DATASETS_DIR = "datasets"  # under the artifact root: one content-addressed folder per version
# In the tokenize task's own KFP output artifact: where the content-addressed Examples are. KFP's
# launcher refuses an output URI outside the run's folder, so the artifact stays there and points.
EXAMPLES_REF = "examples.json"


def split_dir(split: str) -> str:
    """The folder of one split's shards (TFX `Split-<name>`)."""
    return f"Split-{split}"


def shard_file(split: str, index: int, count: int) -> str:
    """The path of shard `index` of `count` of a split, relative to the Examples folder."""
    return f"{split_dir(split)}/data_tfrecord-{index:05d}-of-{count:05d}.gz"


# ---- Work folders (not artifacts: a step's resumable state, under the artifact root) --------
WORK_DIR = "work"  # under the artifact root: one folder per run and step
BACKUP_DIR = "backup"  # in train's work folder: BackupAndRestore state, kept until export
CHECKPOINT_DIR = "checkpoints"  # in train's work folder: periodic checkpoints
CHECKED_SHARDS_DIR = "checked-shards"  # in train's work folder: shards each input found whole
TENSORBOARD_DIR = "logs"  # in train's work folder: TensorBoard event files
WORKER_LOGS_DIR = "worker-logs"  # in train's work folder: each local worker's log
# in train's work folder: the steps train.max_minutes planned ({"steps": N, "final": bool})
TIME_BUDGET_PLAN = "time_budget.json"
# in train's work folder: the attempts started there, and the training restarts lost
RESTARTS_FILE = "restarts.json"
# Non-chief workers' scratch, each removed by its worker; the train step sweeps what a worker
# that died left (components/train/executor.run): `<work>/<prefix><random>` for the model a
# worker writes and throws away, `<work>/checkpoints/<prefix><random>` for its checkpoints.
WORKER_MODEL_SCRATCH_PREFIX = "scratch-model-"
WORKER_CHECKPOINT_SCRATCH_PREFIX = ".worker-tmp-"


def step_work_dir(run_id: str, step: str) -> str:
    """A step's work folder relative to the artifact root; a retried step finds its own again."""
    return f"{WORK_DIR}/{run_id}/{step}"


# ---- Model (train writes, evaluate and push read) -------------------------------------------
SERVING_DIR = "Format-Serving"  # the SavedModel inside the Model artifact (TFX Model layout)
MODEL_CONFIG = "config.json"  # the resolved Config (trainer.config.config_to_dict)
TRAIN_METRICS = "train_metrics.json"  # steps, final loss, divergence, throughput
# An empty file the export writes last, once the rest of the Model is in place (and removes
# first when it replaces a Model): its presence marks the Model complete, as EXAMPLES_MANIFEST
# marks an Examples folder. On GCS a folder moves object by object (trainer/export.py), so
# every reader requires it (components/model_artifact.py).
MODEL_COMPLETE = "COMPLETE"
# Inside the SavedModel (so a served version carries it for the next run's report): the curve
# of training, {"points": [{"step", "tokens", "loss", "learning_rate", "tokens_per_s", ...}],
# "eval_points": [{"step", "tokens", "val_loss"}], "wall_s", "device", ...}. TF Serving
# ignores assets.extra/.
TRAIN_HISTORY = "assets.extra/train_history.json"
MODEL_TEXT_SKETCH = f"assets.extra/{TRAIN_TEXT_SKETCH}"  # the sketch of the text it trained on

# ---- Serving folder (push writes, evaluate reads the baseline, rollback rewrites) ------------
SAVED_MODEL_FILE = (
    "saved_model.pb"  # a SavedModel's graph; TF Serving loads a version once it is there
)
RETIRED_FILE = ".retired.json"  # beside the versions: models a rollback took out of service
# The signatures every exported model has (trainer/export.py), which evaluate and the CLI call.
SIGNATURES = ("generate", "score")

# ---- ModelBlessing (evaluate writes, push reads) --------------------------------------------
BLESSED = "BLESSED"  # an empty file: the candidate may be pushed
NOT_BLESSED = "NOT_BLESSED"  # an empty file: it may not
BLESSING_FILE = "blessing.json"  # the reason and the numbers (contracts.blessing.ModelBlessing)

# ---- PushedModel (push writes) --------------------------------------------------------------
PUSHED = "PUSHED"  # an empty file: a version was published
NOT_PUSHED = "NOT_PUSHED"  # an empty file: nothing was published (not blessed, retired)
PUSH_FILE = "push.json"  # the PushResult: destination, version and reason


def write_pushed(folder: Path, pushed: bool, info: dict) -> None:
    """Write a PushedModel's files into `folder`; the caller publishes the folder atomically."""
    (folder / (PUSHED if pushed else NOT_PUSHED)).write_text("")
    (folder / PUSH_FILE).write_text(json.dumps(info, indent=2) + "\n")
