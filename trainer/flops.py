"""Model FLOPs of the trainer's GPT and accelerator peaks: what model FLOPs utilisation (MFU)
is made of, for the trainer's telemetry and the benchmarks alike.

Pure functions of the config and the device name (no TensorFlow), after nanoGPT's
`estimate_mfu`: 6 FLOPs per parameter per token for the forward and
backward matmuls (the tied embedding counted once, as the output projection; the position table
is a lookup and is not counted, as nanoGPT's non-embedding count leaves it out), plus
6 * n_layer * seq_len * d_model for causal attention (PaLM's appendix B: the scores and the
weighted sum, 2 matmuls of T x d per token forward, half of them under the mask).
`step_matmuls` lists the matmuls one step really runs, which is what bounds MFU from above.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

from trainer.config import ModelConfig

# Dense bfloat16 (float16 where the chip has no bfloat16) tensor-core peaks, FLOP/s per chip,
# without sparsity, from the vendors' data sheets; matched in order against the words of the
# device name, so the more specific names come first and "NVIDIA L40" is not taken for an L4.
PEAK_FLOPS = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),  # 1,671 TFLOP/s with sparsity (the NVL data sheets), as the H200 NVL
    ("H200 NVL", 835e12),
    ("GH200", 989e12),  # the Grace Hopper superchip's H100
    ("H200", 989e12),
    ("H100", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("V100", 125e12),
    ("T4", 65e12),
)


def matmul_params(m: ModelConfig) -> int:
    """Parameters that take part in a matmul per token: all but the position table."""
    c, f = m.d_model, m.d_ff
    block = (
        2 * c  # ln_1
        + c * 3 * c
        + 3 * c  # qkv
        + c * c
        + c  # proj
        + 2 * c  # ln_2
        + c * f
        + f  # fc
        + f * c
        + c  # fc_proj
    )
    return m.vocab_size * c + m.n_layer * block + 2 * c  # tied wte, blocks, ln_f


def flops_per_token(m: ModelConfig) -> float:
    """Training FLOPs (forward and backward) per token at full context: 6 N + 6 L T d."""
    return 6.0 * matmul_params(m) + 6.0 * m.n_layer * m.seq_len * m.d_model


def mfu(tokens_per_second: float, per_token: float, peak_flops_per_second: float) -> float:
    """Model FLOPs utilisation: the model's FLOP/s over a peak (or a measured reference)."""
    return tokens_per_second * per_token / peak_flops_per_second


def square_matmul_flops(n: int) -> int:
    """FLOPs of one n x n by n x n matmul: n^2 outputs of n multiply-adds."""
    return 2 * n**3


def peak_flops(device_name: str) -> float | None:
    """The chip's dense peak in FLOP/s, or None for a CPU or an unknown accelerator."""
    words = re.split(r"[^A-Z0-9]+", device_name.upper())
    for name, peak in PEAK_FLOPS:
        want = name.upper().split()
        if any(words[i : i + len(want)] == want for i in range(len(words))):
            return peak
    return None


class Matmul(NamedTuple):
    """One matmul as `tf.matmul` takes it: the operands' shapes as stored, and which of them it
    transposes (leading dimensions are batch dimensions, broadcast as tf.matmul does)."""

    a: tuple[int, ...]
    b: tuple[int, ...]
    transpose_a: bool = False
    transpose_b: bool = False

    def output(self) -> tuple[tuple[int, ...], int]:
        """(the product's shape, the length of the contracted dimension)."""
        rows = self.a[-1] if self.transpose_a else self.a[-2]
        inner = self.a[-2] if self.transpose_a else self.a[-1]
        cols = self.b[-2] if self.transpose_b else self.b[-1]
        batch = self.a[:-2] if len(self.a) >= len(self.b) else self.b[:-2]
        return (*batch, rows, cols), inner

    @property
    def flops(self) -> int:
        shape, inner = self.output()
        return 2 * math.prod(shape) * inner


def _dense(rows: int, d_in: int, d_out: int) -> list[Matmul]:
    """y = x W, and its backward pass: dx = dy Wᵀ, dW = xᵀ dy (TensorFlow's MatMul gradient)."""
    return [
        Matmul((rows, d_in), (d_in, d_out)),
        Matmul((rows, d_out), (d_in, d_out), transpose_b=True),
        Matmul((rows, d_in), (rows, d_out), transpose_a=True),
    ]


def step_matmuls(m: ModelConfig, batch_size: int) -> list[Matmul]:
    """The matmuls one training step of trainer/model.py's GPT runs on `batch_size` full
    windows, forward and backward, with the shapes it runs them at. Attention's run over the
    whole T x T scores (the mask is added after), which is twice the count of flops_per_token's
    causal term; the head is the tied embedding's (B*T, C) x (V, C)ᵀ."""
    b, t, c, h = batch_size, m.seq_len, m.d_model, m.n_head
    rows, hd = b * t, m.d_model // m.n_head
    heads, scores = (b, h, t, hd), (b, h, t, t)
    attention = [
        Matmul(heads, heads, transpose_b=True),  # S = Q Kᵀ
        Matmul(scores, heads),  # Y = P V
        Matmul(heads, heads, transpose_b=True),  # dP = dY Vᵀ
        Matmul(scores, heads, transpose_a=True),  # dV = Pᵀ dY
        Matmul(scores, heads),  # dQ = dS K
        Matmul(scores, heads, transpose_a=True),  # dK = dSᵀ Q
    ]
    block = (
        _dense(rows, c, 3 * c)
        + attention
        + _dense(rows, c, c)
        + _dense(rows, c, m.d_ff)
        + _dense(rows, m.d_ff, c)
    )
    head = [
        Matmul((rows, c), (m.vocab_size, c), transpose_b=True),  # logits
        Matmul((rows, m.vocab_size), (m.vocab_size, c)),  # d hidden
        Matmul((rows, m.vocab_size), (rows, c), transpose_a=True),  # d embedding
    ]
    return block * m.n_layer + head
