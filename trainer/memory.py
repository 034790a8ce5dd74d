"""Bytes one replica holds to train trainer/model.py's GPT: state, weight copies, activations.

Pure functions of the model config, the micro-batch, the Keras policy, the recompute mode, the
gradient accumulation and whether AdamW decays the weights (no TensorFlow), for `gptpipe plan`
and the train step's check before it starts workers (trainer/capacity.py). Every replica holds
the whole model (MirroredStrategy and MultiWorkerMirroredStrategy replicate it; nothing is
sharded), so more GPUs lower none of this.

State, for N parameters (`parameter_count`):
- weights: 4N. tf-keras keeps every variable float32 under a mixed policy too (the policy's
  variable dtype; `AutoCastVariable` casts it to the compute dtype when a layer reads it);
- gradients: 4N, one float32 gradient per variable (the cast's gradient is cast back);
- optimizer state: 8N, AdamW's m and v in the variables' float32 (trainer/optimization.py);
- the update's buffer: 4N while the optimizer runs, when every gradient exists and
  `clip_by_global_norm` (and, across replicas, the all-reduce) writes a new copy of each;
- weight copies: every matmul's gradient (dx = dy Wᵀ) keeps the weight as the forward pass read
  it until the backward pass reaches it (`matmul_weights`: the kernels and the tied embedding).
  Under a mixed policy that is its compute-dtype cast, a bytes each, and nothing more (the
  decay may copy a weight the cast has not read yet, but the old buffer goes with the cast). In
  float32 a read is the variable's own buffer, with two exceptions that each cost a float32
  copy (`float32_weight_copies`; measured: the allocations below, alive through the backward):
  the tied embedding, whose float32 `tf.gather` reads it sparsely (ResourceGather), which puts
  the variable in copy-on-read mode, so that the logits matmul's read is a copy
  (`gpt/wte/MatMul/ReadVariableOp`); and, with weight decay, every kernel: AdamW's decoupled
  decay (`variable.assign_sub(variable * wd * lr)`) needs no gradient, so it runs as soon as
  the forward pass has read the variable, on any device, finds the buffer shared with the
  read the backward pass holds, and copies on write (`AdamW/AssignSubVariableOp`);
- gradient sums: with gradient accumulation (RunPlan.accumulation > 1) the float32 sums of the
  micro-batches' gradients, 4N, beside each micro-batch's own (trainer/train_step.py).

Activations per micro-batch of B sequences of T tokens (n = B T), width C, MLP width F, H heads,
in bytes, `a` the compute dtype's size (4 in float32, 2 under mixed). Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models" (section 4.1), give the form:
per layer, a term in n C and a term in B H T² (the attention scores), for Megatron's kernels;
the coefficients here are what trainer/model.py's ops keep for their gradients in TensorFlow
(each op's registered gradient names the forward tensors it reads, and a graph keeps a tensor
until its last reader runs). Per block (`block_bytes`):
- each LayerNormalization (tf-keras; not the fused kernel, since model.layer_norm_epsilon is
  below its 1.001e-5 floor): its input in float32 (under a mixed policy a float32 copy) for
  the moments' gradient, and `inv` = gamma / sqrt(var + eps), an (n, C) float32 tensor
  (tf.nn.batch_normalization), 8 n C; its output, in the compute dtype, which the next matmul
  keeps, n C a. Two per block;
- attention: the transposed (3, B, H, T, hd) q, k, v buffer, 3 n C a (tf.unstack shares it and
  the score and A·V matmuls keep k and v); the scaled q, n C a; the softmax output, B H T² a,
  kept by the softmax's gradient and the A·V matmul; the (n, C) heads' output the projection
  keeps, n C a. Rotary positions add the halves of q and k that `rotate` multiplies and the
  rotated k, 3 n C a;
- the MLP: GELU's input and its output (the second matmul's input), 2 n F a; without the
  XLA-fused GELU (train.jit_compile=off) the erf form keeps 4 n F a;
- dropout > 0: a one-byte mask per dropped element (attention probabilities, both residual
  branches) and the dropped probabilities the A·V matmul keeps, B H T² (1 + a) + 2 n C.
After the blocks (`head_bytes`): the final LayerNormalization (8 n C + n C a), and the float32
logits (B, T, V), 4 n V: the softmax cross-entropy's gradient, which the loss op computes
beside the loss, takes over their buffer (TensorFlow's SparseSoftmaxCrossEntropyWithLogits
forwards its input to that output), and so does the gradient the backward pass scales it into;
under a mixed policy the compute-dtype logits live beside them while they are cast, n V a.
The peak comes at the start of the backward pass, before any block's activations are freed:
beside all of the above, the output projection's gradient dx (n C a) and the final
LayerNormalization's backward pass, which holds three (n, C) float32 gradients at once (of
`offset - mean * inv`, `x * inv` and `inv = gamma * rsqrt(var + eps)` in
tf.nn.batch_normalization), 12 n C + n C a in all (measured: `gradient_tape/gpt/ln_f/...`).
On top of what is kept, the backward pass of the last block holds two (B, H, T, T) (or
(n, F)) gradients at once (`transient_bytes`), while the head's are freed; the peak is the
larger of the two.

With train.recompute=blocks each block keeps only its input, n C a, and one block at a time is
rebuilt in the backward pass: L n C a + the head + one block + the transient.

Gradients are counted whole through the backward pass, an upper bound: at its start, where the
activations peak, only the head's exist; they accumulate as the blocks' activations are freed.

The measurement: bench/memory_bench.py (and tests/trainer/test_memory_measured.py) compares
this with the peak bytes in use of TensorFlow's allocator in the CPU train step
(docs/training.md, "Memory per GPU").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from trainer.config import ModelConfig
from trainer.flops import matmul_params

FLOAT32 = 4  # bytes of a float32: variables, their gradients, AdamW's slots, the logits
# The share of a GPU's memory a plan leaves free for what the model does not account for: the
# CUDA context and cuBLAS/cuDNN workspaces (about a GiB), XLA's and the BFC allocator's
# fragmentation. The estimate must fit in the rest.
HEADROOM = 0.10


def parameter_count(m: ModelConfig) -> int:
    """Trainable parameters: the matmul ones (trainer/flops.py) and the position table."""
    positions = m.seq_len * m.d_model if m.position == "learned" else 0
    return matmul_params(m) + positions


def compute_bytes(policy: str) -> int:
    """Bytes of one activation element under Keras policy `policy`."""
    return 2 if policy.startswith("mixed_") else FLOAT32


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one replica needs, by what holds them."""

    weights: int  # float32 variables
    gradients: int  # their float32 gradients
    optimizer_state: int  # AdamW's m and v
    update_buffer: int  # the clipped (or all-reduced) copy of the gradients while updating
    weight_copies: int  # matmul weights as read, kept by the backward (module docstring)
    gradient_sums: int  # float32 sums of the micro-batches' gradients (accumulation > 1)
    activations: int  # peak activations of one micro-batch, every block's kept
    activations_recomputed: int  # the same with train.recompute=blocks
    recompute: bool  # whether the run recomputes (which of the two it needs)

    @property
    def state(self) -> int:
        """Weights, gradients and optimizer state: what any micro-batch needs."""
        return self.weights + self.gradients + self.optimizer_state

    @property
    def used_activations(self) -> int:
        """The activations of the run's recompute mode."""
        return self.activations_recomputed if self.recompute else self.activations

    @property
    def total(self) -> int:
        """The peak: state plus the larger of the forward/backward pass and the update."""
        return self.total_with(self.recompute)

    def total_with(self, recompute: bool) -> int:
        """The peak under the other recompute mode."""
        act = self.activations_recomputed if recompute else self.activations
        return self.state + max(self.weight_copies + self.gradient_sums + act, self.update_buffer)

    def to_dict(self) -> dict[str, int | bool]:
        """The terms and the peak, in bytes, for JSON."""
        return {**asdict(self), "state": self.state, "total": self.total}


def estimate(
    m: ModelConfig,
    micro_batch: int,
    policy: str = "float32",
    recompute: bool = False,
    xla_gelu: bool = True,
    accumulation: int = 1,
    weight_decay: bool = True,
) -> MemoryEstimate:
    """What one replica holds training `m` on micro-batches of `micro_batch` full windows
    under Keras policy `policy`, summing the gradients of `accumulation` of them per step
    (RunPlan.accumulation), with or without AdamW's `weight_decay` (the module's docstring has
    each term and its source)."""
    n = parameter_count(m)
    a = compute_bytes(policy)
    block = block_bytes(m, micro_batch, a, xla_gelu)
    head = head_bytes(m, micro_batch, a)
    transient = transient_bytes(m, micro_batch, a)
    inputs = m.n_layer * micro_batch * m.seq_len * m.d_model * a
    copies = matmul_weights(m) * a if a != FLOAT32 else float32_weight_copies(m, weight_decay)
    return MemoryEstimate(
        weights=FLOAT32 * n,
        gradients=FLOAT32 * n,
        optimizer_state=2 * FLOAT32 * n,
        update_buffer=FLOAT32 * n,
        weight_copies=copies,
        gradient_sums=FLOAT32 * n if accumulation > 1 else 0,
        activations=m.n_layer * block + max(head, transient),
        activations_recomputed=inputs + max(head, block + transient),
        recompute=recompute,
    )


def matmul_weights(m: ModelConfig) -> int:
    """Parameters a matmul's gradient keeps as the forward pass read them: the tied embedding
    and the blocks' four kernels (not the biases, LayerNorms or position table)."""
    c, f = m.d_model, m.d_ff
    return m.vocab_size * c + m.n_layer * (4 * c * c + 2 * c * f)


def float32_weight_copies(m: ModelConfig, weight_decay: bool) -> int:
    """Bytes of the float32 weight copies the backward pass holds: the embedding's read, and
    with weight decay the kernels' pre-decay values (module docstring)."""
    embedding = m.vocab_size * m.d_model
    return FLOAT32 * (matmul_weights(m) if weight_decay else embedding)


def block_bytes(m: ModelConfig, b: int, a: int, xla_gelu: bool = True) -> int:
    """Bytes one transformer block keeps for its backward pass (module docstring)."""
    nc = b * m.seq_len * m.d_model
    nf = b * m.seq_len * m.d_ff
    scores = b * m.n_head * m.seq_len**2
    layer_norms = 2 * (2 * FLOAT32 * nc + nc * a)
    rotary = 3 * nc * a if m.position == "rotary" else 0
    attention = 3 * nc * a + nc * a + scores * a + nc * a + rotary
    mlp = (2 if xla_gelu else 4) * nf * a
    dropout = scores * (1 + a) + 2 * nc if m.dropout > 0 else 0
    return layer_norms + attention + mlp + dropout


def head_bytes(m: ModelConfig, b: int, a: int) -> int:
    """Bytes of the final LayerNorm, the logits and the loss's gradient, and the first
    gradients of the backward pass (module docstring)."""
    nc = b * m.seq_len * m.d_model
    nv = b * m.seq_len * m.vocab_size
    logits = FLOAT32 * nv + (nv * a if a != FLOAT32 else 0)
    backward = nc * a + 3 * FLOAT32 * nc
    return 2 * FLOAT32 * nc + nc * a + logits + backward


def transient_bytes(m: ModelConfig, b: int, a: int) -> int:
    """The gradients the last block's backward pass holds at once (module docstring)."""
    scores = b * m.n_head * m.seq_len**2
    return 2 * max(scores, b * m.seq_len * m.d_ff) * a
