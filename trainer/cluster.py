"""This worker's place in the training cluster, read from TF_CONFIG, and the strategy it implies.

`tf_config` is always the TF_CONFIG JSON passed down by the entry point (which reads the
environment once); None means a single worker.
"""

from __future__ import annotations

import json
from typing import Any

import tensorflow as tf


def _spec(tf_config: str | None) -> dict[str, Any]:
    return json.loads(tf_config) if tf_config else {}


def cluster_size(tf_config: str | None) -> int:
    """Workers in the cluster (chief included); 0 without TF_CONFIG."""
    cluster = _spec(tf_config).get("cluster", {})
    return sum(len(cluster.get(kind, [])) for kind in ("chief", "worker"))


def task_index(tf_config: str | None) -> int:
    """This worker's TF_CONFIG task index (0 without TF_CONFIG)."""
    return int(_spec(tf_config).get("task", {}).get("index", 0))


def is_chief(tf_config: str | None) -> bool:
    """The chief is task `chief`, or `worker` 0 when the cluster has no chief."""
    if not tf_config:
        return True
    spec = _spec(tf_config)
    task = spec.get("task", {})
    kind, index = task.get("type", "worker"), int(task.get("index", 0))
    has_chief = bool(spec.get("cluster", {}).get("chief"))
    return kind == "chief" or (kind == "worker" and index == 0 and not has_chief)


def choose_strategy(tf_config: str | None = None) -> tf.distribute.Strategy:
    """MultiWorkerMirrored when TF_CONFIG names >1 task, Mirrored for >1 local GPU, else default.

    Call this before anything else touches TensorFlow: collective ops must be configured first.
    """
    if cluster_size(tf_config) > 1:
        return tf.distribute.MultiWorkerMirroredStrategy()
    if len(tf.config.list_physical_devices("GPU")) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()
