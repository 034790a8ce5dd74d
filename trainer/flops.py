"""Model FLOPs per token and accelerator peaks: what model FLOPs utilisation (MFU) is made of.

Pure functions of the config and the device name (no TensorFlow), after nanoGPT's
`estimate_mfu` and the count in issue 13: 6 FLOPs per parameter per token for the forward and
backward matmuls (the tied embedding counted once, as the output projection; the position table
is a lookup and is not counted), plus 6 * n_layer * seq_len * d_model for causal attention.
"""

from __future__ import annotations

from trainer.config import ModelConfig

# Dense bfloat16 (float16 where the chip has no bfloat16) tensor-core peaks, FLOP/s per chip,
# from the vendors' data sheets; matched in order against the device name, so the more specific
# names come first. An unknown device has no MFU.
PEAK_FLOPS = (
    ("H100 PCIe", 756e12),
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
    """Training FLOPs (forward and backward) per token at full context."""
    return 6.0 * matmul_params(m) + 6.0 * m.n_layer * m.seq_len * m.d_model


def peak_flops(device_name: str) -> float | None:
    """The chip's dense peak in FLOP/s, or None for a CPU or an unknown accelerator."""
    for name, peak in PEAK_FLOPS:
        if name.lower() in device_name.lower():
            return peak
    return None
