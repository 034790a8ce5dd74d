"""The largest tensors trainer/model.py builds, and the int32 bound TensorFlow keeps them under.

TensorFlow computes a tensor's shape in int32 (`tf.shape`'s dtype, whose products the model's
reshapes to (B*T, C) take) and many of its kernels count a tensor's elements in an `int` (the
GPU launch configurations). A tensor past that bound fails deep inside TensorFlow ("Invalid
value in tensor used for shape: -1094967296", at train.batch_size=50000000 on the tiny model),
after the data is tokenized and the workers started. Pure functions of the model config and the
micro-batch (no TensorFlow): `run_plan.plan_run` refuses such a run before any of that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainer.config import ConfigError, ModelConfig

MAX_ELEMENTS = 2**31 - 1  # int32's largest value: the most elements one tensor may hold


@dataclass(frozen=True)
class Tensor:
    """One of the model's tensors: its name, its shape in config fields and in numbers."""

    name: str  # what it is, as an error names it
    shape: str  # its shape in the config's words, "batch x seq_len x vocab_size"
    dims: tuple[int, ...]  # the same in numbers, the batch dimension left out
    fix: str  # the fields that shrink it, for an error's fix

    @property
    def elements(self) -> int:
        """Elements per sequence of the batch (per tensor for a weight)."""
        return math.prod(self.dims)


def weights(m: ModelConfig) -> list[Tensor]:
    """The largest weight matrices: the tied token embedding and a block's kernels."""
    c = m.d_model
    return [
        Tensor("token embedding", "vocab_size x d_model", (m.vocab_size, c), "model.vocab_size"),
        Tensor("MLP kernel", "d_model x d_ff", (c, m.d_ff), "model.d_ff"),
        Tensor("attention kernel", "d_model x 3 d_model", (c, 3 * c), "model.d_model"),
    ]


def activations(m: ModelConfig) -> list[Tensor]:
    """The largest tensors one sequence of a micro-batch adds (trainer/model.py's comments)."""
    t, c = m.seq_len, m.d_model
    return [
        Tensor("logits", "batch x seq_len x vocab_size", (t, m.vocab_size), "model.vocab_size"),
        Tensor("MLP activation", "batch x seq_len x d_ff", (t, m.d_ff), "model.d_ff"),
        Tensor(
            "attention scores",
            "batch x n_head x seq_len x seq_len",
            (m.n_head, t, t),
            "model.seq_len or model.n_head",
        ),
        Tensor("q, k, v", "batch x seq_len x 3 d_model", (t, 3 * c), "model.d_model"),
    ]


def largest_activation(m: ModelConfig) -> Tensor:
    """The tensor that grows most with each sequence of a micro-batch."""
    return max(activations(m), key=lambda tensor: tensor.elements)


def largest_micro_batch(m: ModelConfig) -> int:
    """The most sequences a micro-batch of `m` may hold with every tensor under MAX_ELEMENTS."""
    return MAX_ELEMENTS // largest_activation(m).elements


def check(
    m: ModelConfig, batch_size: int, micro_batch: int, accumulation: int, replicas: int
) -> None:
    """ConfigError (one line, with the numbers and the fix) when a tensor of `m` holds more
    than MAX_ELEMENTS elements, trained on `replicas` replicas in micro-batches of
    `micro_batch` sequences, `accumulation` of them a step (run_plan.RunPlan's); `batch_size`
    is train.batch_size as the user set it."""
    for weight in weights(m):
        if weight.elements > MAX_ELEMENTS:
            raise ConfigError(_past(weight, None, "", f"lower {weight.fix}"))
    tensor = largest_activation(m)
    limit = largest_micro_batch(m)
    if limit == 0:  # one sequence is too much
        fix = (
            f"lower {tensor.fix}"
            if "seq_len" in tensor.fix
            else f"lower model.seq_len or {tensor.fix}"
        )
        raise ConfigError(_past(tensor, 1, "one sequence: ", fix))
    if micro_batch > limit:
        at = f"train.batch_size={batch_size}, a micro-batch of {micro_batch:,} sequences: "
        fix = (
            f"use train.batch_size={limit} or less (train.global_batch_tokens keeps a larger "
            "global batch, each replica accumulating micro-batches)"
        )
        raise ConfigError(_past(tensor, micro_batch, at, fix))
    window = m.seq_len + 1  # a replica's step is one (B, T+1) batch of ids: trainer/data.py
    step = micro_batch * accumulation
    if step * window > MAX_ELEMENTS:
        most = MAX_ELEMENTS // window * m.seq_len * replicas
        raise ConfigError(
            f"config: each replica's input batch a step, {step:,} windows of seq_len+1 = "
            f"{window:,} token ids, holds {step * window:,} elements, past TensorFlow's int32 "
            f"limit of {MAX_ELEMENTS:,}; lower train.global_batch_tokens to {most} or less "
            "on these replicas, or use more replicas"
        )


def _past(tensor: Tensor, batch: int | None, at: str, fix: str) -> str:
    """The refusal of one tensor (of a batch of `batch` sequences; None: a weight): where, its
    shape in words and numbers, the bound, and the fix."""
    dims = tensor.dims if batch is None else (batch, *tensor.dims)
    elements = tensor.elements * (batch or 1)
    numbers = " x ".join(f"{d:,}" for d in dims)
    return (
        f"config: {at}the {tensor.name} tensor ({tensor.shape} = {numbers}) holds "
        f"{elements:,} elements, past TensorFlow's int32 limit of {MAX_ELEMENTS:,}; {fix}"
    )
