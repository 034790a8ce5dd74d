"""The training shapes the benchmarks share, as trainer config overrides on the `tiny` preset.

One definition per shape, so that the trainer runs `peer_bench`, `mfu_bench` and `input_bench`
need are the same configurations, trained once per `python -m bench` (trainer_run's cache).
"""

from __future__ import annotations

THREADS = 2  # the cores every single-process measurement gets (intra- and inter-op threads)


def steady_state(steps: int) -> tuple[str, ...]:
    """Overrides for a speed run of `steps`: one fit chunk (no checkpoint or validation mid-way,
    which TrainMonitor's clock skips but which would cost wall time), one eval batch."""
    return (
        f"train.train_steps={steps}",
        f"train.checkpoint_every={steps}",
        f"train.log_every={steps}",
        f"train.warmup_steps={min(10, steps)}",
        "train.eval_batches=1",
    )


def peer_shape(d_model: int = 512) -> tuple[str, ...]:
    """Issue 13's comparison shape: 4 layers, 8 heads, seq_len 256, batch 8, vocabulary 2048,
    MLP 4 x d_model (GPT-2's), at `d_model` (512 in the issue; the MFU curve varies it)."""
    return (
        "model.vocab_size=2048",
        "model.seq_len=256",
        "model.n_layer=4",
        "model.n_head=8",
        f"model.d_model={d_model}",
        f"model.d_ff={4 * d_model}",
        "model.dropout=0.0",
        "train.batch_size=8",
    )


def peer_overrides(d_model: int, steps: int, precision: str = "auto") -> tuple[str, ...]:
    """The `tiny` preset at peer_shape(d_model), for a speed run of `steps` in `precision`."""
    return peer_shape(d_model) + steady_state(steps) + (f"train.precision={precision}",)


def auto_policy() -> str:
    """The Keras policy the trainer's `train.precision=auto` picks on this host (one worker)."""
    from trainer.precision import host_policy

    return host_policy("auto")


def tiny_overrides(steps: int) -> tuple[str, ...]:
    """The `tiny` preset as it is, for a speed run of `steps`."""
    return steady_state(steps)


# Steps of each speed run: the first is not timed (tracing); the rest take 10-40 s on 2 loaded
# cores, start-up and export about 40 s more. The full tier trains twice as many.
PEER_STEPS = {128: 30, 256: 16, 512: 16}
TINY_STEPS = 120


def steps(base: int, full: bool) -> int:
    """Steps of a speed run in the quick or the full tier."""
    return base * 2 if full else base
