"""The named presets: the section overrides each one sets on top of the config's defaults.

`tiny` and `quality` are for one machine and are described in steps. The `gpt2-*` presets are
GPT-2's shapes (Radford et al. 2019, Table 2: layers and width; 1024-token context) trained the
way GPT-3's paper trained the nearest size (Brown et al. 2020, Table 2.1 and Appendix B), and are
described in tokens, so that one preset trains the same model on 8 GPUs as on 100
(trainer/run_plan.py derives the micro-batches, accumulation and steps from the replicas):

- the peak learning rate and the batch in tokens of the nearest GPT-3 size, with the peak
  capped there whatever the batch (train.lr_scaling=capped);
- warmup over GPT-3's first 375 M tokens, cosine decay to 10% of the peak, AdamW with
  beta_2 0.95, weight decay 0.1 and gradient clipping at 1.0 (Appendix B);
- 20 training tokens per parameter, Chinchilla's compute-optimal ratio (Hoffmann et al. 2022),
  rounded;
- `batch_size`, the largest micro-batch per replica, sized by `gptpipe plan` to fit an 80 GB GPU
  in bfloat16 (docs/training.md has the memory rule); `gptpipe plan --gpu` gives it for others.

GPT-3 trained with 2048-token windows: its batches in tokens are kept, so at GPT-2's 1024 the
batches hold twice as many sequences.
"""

from __future__ import annotations

from typing import Any

PRESET_NAMES = ("tiny", "quality", "gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl")

_HALF_MILLION = 2**19  # GPT-3's "0.5M" tokens per batch: 512 sequences of 1024
_MILLION = 2**20  # its "1M": 1024 sequences of 1024

# name: (n_layer, d_model, n_head, params for the token budget, GPT-3's size it trains as:
# peak learning rate, batch tokens; largest micro-batch on an 80 GB GPU)
_GPT2 = {
    # GPT-2 small (124 M) as GPT-3 Small (125 M): 6.0e-4, 0.5 M tokens
    "gpt2-small": (12, 768, 12, 2.5e9, 6.0e-4, _HALF_MILLION, 32),
    # GPT-2 medium (355 M) as GPT-3 Medium (350 M): 3.0e-4, 0.5 M tokens
    "gpt2-medium": (24, 1024, 16, 7e9, 3.0e-4, _HALF_MILLION, 16),
    # GPT-2 large (774 M) as GPT-3 Large (760 M): 2.5e-4, 0.5 M tokens
    "gpt2-large": (36, 1280, 20, 15e9, 2.5e-4, _HALF_MILLION, 8),
    # GPT-2 XL (1.56 B) as GPT-3 XL (1.3 B): 2.0e-4, 1 M tokens
    "gpt2-xl": (48, 1600, 25, 30e9, 2.0e-4, _MILLION, 4),
}
GPT3_WARMUP_TOKENS = 375_000_000


def preset(name: str) -> dict[str, dict[str, Any]] | None:
    """The {section: {field: value}} overrides that define preset `name`; None if unknown."""
    if name == "tiny":
        return {}  # the defaults: a model for tests and the demo, trained in about a minute
    if name == "quality":
        # The best model about 10 minutes of 2 CPU cores make of a corpus the size of the bundled
        # one (1 MB): BPE 2048 and 128-token windows (~400 characters each); 4 x 256 layers,
        # the most that train for several epochs in that time; dropout 0.15 against the overfit
        # of several epochs; rotary positions. 900 steps at most, and 10 minutes of training
        # on any host: a slower one (float32 where bfloat16 is not native) plans fewer steps
        # and still decays to the end (trainer/budget.py). docs/benchmarks.md has how each
        # choice measured, and bench/quality_bench.py measures the preset against the peer.
        return {
            "model": {
                "vocab_size": 2048,
                "seq_len": 128,
                "n_layer": 4,
                "n_head": 4,
                "d_model": 256,
                "d_ff": 1024,
                "dropout": 0.15,
                "position": "rotary",
            },
            "train": {
                "batch_size": 32,
                "train_steps": 900,
                "max_minutes": 10.0,
                "warmup_steps": 100,
                "checkpoint_every": 225,
                "log_every": 50,
            },
        }
    if name in _GPT2:
        return _gpt2(*_GPT2[name])
    return None


def _gpt2(
    layers: int, width: int, heads: int, tokens: float, lr: float, batch: int, micro: int
) -> dict[str, dict[str, Any]]:
    seq_len = 1024
    return {
        "model": {
            "vocab_size": 32000,
            "seq_len": seq_len,
            "n_layer": layers,
            "n_head": heads,
            "d_model": width,
            "d_ff": 4 * width,
            "dropout": 0.0,
        },
        "train": {
            "batch_size": micro,
            "global_batch_tokens": batch,
            "train_steps": 0,
            "train_tokens": int(tokens),
            "warmup_steps": 0,
            "warmup_tokens": GPT3_WARMUP_TOKENS,
            "learning_rate": lr,
            "reference_batch_size": batch // seq_len,
            "lr_scaling": "capped",
            "beta_2": 0.95,
            "checkpoint_every": 1000,
            "log_every": 100,
            "eval_batches": 50,
            "shuffle_buffer": 10_000,
        },
    }
