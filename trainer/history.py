"""The training curve a run leaves behind: `train_history.json`, inside the exported SavedModel.

    {"points": [{"step", "tokens", "loss", "learning_rate", "tokens_per_s",
                 "grad_norm"?, "input_wait_frac"?, "mfu"?}],   every train.log_every steps
     "eval_points": [{"step", "tokens", "val_loss"}],         every validation
     "wall_s": float, "device": str, "mfu"?: float, "replicas": int, "global_batch_size": int}

`tokens` counts the global tokens trained up to `step`. Evaluate's report reads the file from the
candidate and the baseline (contracts.artifacts.TRAIN_HISTORY); TF Serving ignores assets.extra/.
The chief keeps a copy in the work folder, so that a restarted job continues the curve from its
backup instead of starting it again. Python's json writes a NaN loss as NaN, which it reads back.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf

from contracts.artifacts import TRAIN_HISTORY

WORK_FILE = posixpath.basename(TRAIN_HISTORY)  # the copy in the train work folder


@dataclass
class TrainHistory:
    """The curve so far; `to_json()` is the file's content."""

    device: str  # what trained: "CPU" or the accelerator's name, e.g. "NVIDIA H200"
    replicas: int  # replicas in sync (GPUs, or one per CPU worker)
    global_batch_size: int  # sequences per step across all replicas
    points: list[dict[str, Any]] = field(default_factory=list)  # every log_every steps
    eval_points: list[dict[str, Any]] = field(default_factory=list)  # every validation
    wall_s: float = 0.0  # seconds of training, over every attempt that trained
    mfu: float | None = None  # model FLOPs utilisation over the timed steps (GPU only)

    def resume_at(self, step: int) -> None:
        """Forget what was recorded after `step`: a restart resumes from the backup there."""
        self.points = [p for p in self.points if p["step"] <= step]
        self.eval_points = [p for p in self.eval_points if p["step"] <= step]

    def to_json(self) -> str:
        doc: dict[str, Any] = {
            "points": self.points,
            "eval_points": self.eval_points,
            "wall_s": round(self.wall_s, 3),
            "device": self.device,
            "replicas": self.replicas,
            "global_batch_size": self.global_batch_size,
        }
        if self.mfu is not None:
            doc["mfu"] = self.mfu
        return json.dumps(doc, indent=1)

    def save(self, work_dir: str) -> None:
        """Keep the curve in the work folder (the chief, at each validation and at the end)."""
        tf.io.gfile.makedirs(work_dir)
        with tf.io.gfile.GFile(posixpath.join(work_dir, WORK_FILE), "w") as f:
            f.write(self.to_json())

    def load(self, work_dir: str) -> None:
        """Continue the curve an earlier attempt kept in the work folder, if there is one."""
        path = posixpath.join(work_dir, WORK_FILE)
        if not tf.io.gfile.exists(path):
            return
        with tf.io.gfile.GFile(path, "r") as f:
            saved = json.load(f)
        self.points = list(saved.get("points", []))
        self.eval_points = list(saved.get("eval_points", []))
        self.wall_s = float(saved.get("wall_s", 0.0))
        self.mfu = saved.get("mfu")
