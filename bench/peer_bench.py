"""Training speed against the peer: the trainer's tokens/s over KerasHub GPT2's, same shape.

The trainer side is the real trainer: `python -m trainer.task` through the local launcher
(bench/trainer_run.py), one worker with 2 intra-op and 2 inter-op threads, on the tokenize
step's Examples of the bundled corpus; its tokens/s is `tokens_per_second` from the Model's
train_metrics.json. That is the program a user runs, with its input pipeline, callbacks and
per-step host syncs, which a model re-built here and timed bare would leave out. The clock is
the trainer's own (TrainMonitor): wall time between its logging steps after the first step
(tracing), pauses between fit's epochs left out; start-up, validation and export excluded.

The peer is `keras_hub.models.GPT2Backbone` under `GPT2CausalLM` (logits through the tied token
embedding), Keras 3 on the TensorFlow backend, in its own venv and process (bench/peer_env.py,
bench/peer_gpt2.py), built from the same resolved config (random init, no weights downloaded),
with the same threads, AdamW settings and schedule, on the same Examples, for the same steps,
timed by the same rule: wall time from the first step's loss on the host to the last one's.

Precision: both sides train in the same Keras policy, the one the trainer's `train.precision=auto`
picks on this host (float32, or mixed_bfloat16 on a CPU that multiplies bfloat16 natively:
AVX512-BF16 or AMX; trainer/precision.py), so the ratio compares implementations, not number
formats. Where that is mixed_bfloat16, issue 13's shape also runs with both in float32, and a
third figure shows what a user gets from each as it comes: the trainer's `auto` over the peer's
default (float32), from the same runs.

Two shapes: issue 13's (4 layers, 8 heads, d_model 512, seq_len 256, batch 8, vocabulary 2048;
target: ratio >= 1.15, at the `auto` policy) and the `tiny` preset's (reported). The sides
alternate, trainer, peer, peer, trainer (bench/alternate.py), twice each at issue 13's shape in
the quick tier (4 times in the full tier; the `tiny` shape half as often), and each side's best
run counts: the best is the run least slowed by whatever else the machine was doing.
"""

from __future__ import annotations

import json
from typing import Any

from bench import alternate, peer_env, trainer_run, workloads
from bench.results import Figure, Target

TIER = "quick"
TARGET = Target(">=", 1.15)
PEER_TIMEOUT_S = 900


def _peer(preset: str, overrides: tuple[str, ...], train_steps: int, policy: str) -> dict[str, Any]:
    from trainer.config import config_to_dict

    cfg = trainer_run.config(preset, overrides)
    folder = trainer_run.examples(cfg.model.vocab_size, cfg.model.seq_len)
    args = ["speed", "--examples", str(folder), "--steps", str(train_steps), "--policy", policy]
    args += ["--config-json", json.dumps(config_to_dict(cfg))]
    return peer_env.run_peer(args, PEER_TIMEOUT_S, threads=workloads.THREADS)


def _trainer(overrides: tuple[str, ...], attempt: int, policy: str) -> dict[str, Any]:
    """One trainer run, checked to have trained in `policy` (what the peer is given)."""
    run = trainer_run.run_trainer("tiny", overrides, attempt=attempt)
    if run.get("precision_policy") != policy:
        raise RuntimeError(f"the trainer trained in {run.get('precision_policy')}, not {policy}")
    return run


def compare(
    label: str,
    overrides: tuple[str, ...],
    steps: int,
    runs: int,
    target: Target | None,
    policy: str,
) -> Figure:
    """One shape in one policy: the trainer's and the peer's best tokens/s over `runs` each,
    and their ratio."""
    from trainer.config import config_to_dict

    trainer, peer = alternate.abba(
        lambda attempt: _trainer(overrides, attempt, policy),
        lambda _attempt: _peer("tiny", overrides, steps, policy),
        runs,
    )
    ours = max(float(t["tokens_per_second"]) for t in trainer)
    theirs = max(float(p["tokens_per_second"]) for p in peer)
    cfg = trainer_run.config("tiny", overrides)
    m = cfg.model
    return Figure(
        name=f"training speed vs KerasHub GPT2, {label}, both {policy}",
        value=ours / theirs,
        target=target,
        inputs={
            "config": config_to_dict(cfg),
            "shape": f"{m.n_layer}L {m.n_head}H d{m.d_model} T{m.seq_len} "
            f"B{cfg.train.batch_size} V{m.vocab_size}",
            "steps": steps,
            "timed_tokens": (steps - 1) * cfg.train.batch_size * m.seq_len,
            "threads": workloads.THREADS,
            "runs_per_side": runs,
            "precision_policy": policy,
            "peer": {"pins": list(peer_env.PINS), "versions": peer[0].get("versions")},
        },
        details={
            "trainer_tokens_per_s": [t["tokens_per_second"] for t in trainer],
            "peer_tokens_per_s": [p["tokens_per_second"] for p in peer],
            "peer_params": peer[0]["params"],
            "trainer_final_loss": trainer[0]["final_loss"],
            "peer_final_loss": peer[0]["final_loss"],
        },
    )


def figures(full: bool) -> list[Figure]:
    big = workloads.steps(workloads.PEER_STEPS[512], full)
    tiny = workloads.steps(workloads.TINY_STEPS, full)
    runs = 4 if full else 2
    policy = workloads.auto_policy()
    shape = "4L d512 T256 B8 V2048"
    # The policy by name, not `auto`: the same config as mfu_bench's runs, which reuse these.
    found = [compare(shape, workloads.peer_overrides(512, big, policy), big, runs, TARGET, policy)]
    if policy != "float32":
        f32 = workloads.peer_overrides(512, big, "float32")
        found.append(compare(shape, f32, big, runs, None, "float32"))
        found.append(as_they_come(shape, found[0], found[1], policy))
    tiny_overrides = workloads.tiny_overrides(tiny) + (f"train.precision={policy}",)
    found.append(compare("tiny preset", tiny_overrides, tiny, runs // 2, None, policy))
    return found


def as_they_come(shape: str, auto: Figure, f32: Figure, policy: str) -> Figure:
    """The trainer's `auto` (here `policy`) over the peer's default, float32: the same runs."""
    ours = max(auto.details["trainer_tokens_per_s"])
    theirs = max(f32.details["peer_tokens_per_s"])
    return Figure(
        name=f"training speed vs KerasHub GPT2, {shape}, trainer auto ({policy}) / peer default "
        "(float32)",
        value=ours / theirs,
        inputs={"from": [auto.name, f32.name]},
        details={"trainer_tokens_per_s": ours, "peer_tokens_per_s": theirs},
    )


if __name__ == "__main__":
    from bench.results import markdown_table

    print(markdown_table(figures(full=False)))
