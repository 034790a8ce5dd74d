"""Model FLOPs of the trainer's GPT, counted from its shape: pure functions, tested.

Per token, training costs 6 FLOPs per parameter (2 forward, 4 backward) that multiplies an
activation, plus attention's scores and weighted sum, which have no parameters: 2 matmuls of
T x d per token forward, so 12 * L * T * d FLOPs fwd+bwd without a mask, and half of that with
the causal mask (PaLM's appendix B; nanoGPT's `estimate_mfu` counts the unmasked 12 L T d).
N counts every parameter once, the tied token embedding included: it is the output
projection's weight, a (d x V) matmul per token (its input-side gather costs no FLOPs, so
counting it once is right).
"""

from __future__ import annotations

import re

# Dense bf16 peak of each accelerator, in TFLOP/s, without sparsity (vendor data sheets:
# H100 SXM and H200 989.4, A100 312, L4 121), keyed by a word of the device name, so that
# "NVIDIA L40S" is not taken for an L4.
BF16_PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L4": 121.0}


def block_params(d_model: int, d_ff: int) -> int:
    """Parameters of one trainer Block: 2 LayerNorms, qkv and proj, the 2-layer MLP (biases)."""
    layer_norms = 2 * 2 * d_model
    attention = (d_model * 3 * d_model + 3 * d_model) + (d_model * d_model + d_model)
    mlp = (d_model * d_ff + d_ff) + (d_ff * d_model + d_model)
    return layer_norms + attention + mlp


def param_count(vocab_size: int, seq_len: int, n_layer: int, d_model: int, d_ff: int) -> int:
    """N of trainer/model.py's GPT: tied token embedding, position table, blocks, final LN."""
    embeddings = vocab_size * d_model + seq_len * d_model
    return embeddings + n_layer * block_params(d_model, d_ff) + 2 * d_model


def attention_flops_per_token(n_layer: int, seq_len: int, d_model: int) -> int:
    """Causal attention's parameter-free FLOPs per token, forward and backward: 6 L T d."""
    return 6 * n_layer * seq_len * d_model


def flops_per_token(params: int, n_layer: int, seq_len: int, d_model: int) -> int:
    """Training FLOPs per token: 6 N + 6 L T d."""
    return 6 * params + attention_flops_per_token(n_layer, seq_len, d_model)


def matmul_flops(n: int) -> int:
    """FLOPs of one n x n by n x n matmul: n^2 outputs of n multiply-adds."""
    return 2 * n**3


def mfu(tokens_per_second: float, per_token: int, peak_flops_per_second: float) -> float:
    """Model FLOPs utilisation: the model's FLOP/s over a peak (or a measured reference)."""
    return tokens_per_second * per_token / peak_flops_per_second


def bf16_peak_tflops(device_name: str) -> float | None:
    """Dense bf16 peak of the accelerator named `device_name`; None when it is not known."""
    for word in re.split(r"[^A-Z0-9]+", device_name.upper()):
        if word in BF16_PEAK_TFLOPS:
            return BF16_PEAK_TFLOPS[word]
    return None
