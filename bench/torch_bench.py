"""Training speed against PyTorch: the trainer's tokens/s over a nanoGPT-shaped PyTorch GPT's.

The trainer side is the real trainer, as in bench/peer_bench.py: `python -m trainer.task`
through the local launcher (bench/trainer_run.py), one worker, 2 intra-op and 2 inter-op
threads, float32, tokens/s from its train_metrics.json. The peer is bench/peer_torch.py in its
own venv (bench/torch_env.py: torch 2.13.0, CPU build), nanoGPT's architecture at the same
resolved config (4 layers, 8 heads, d_model 512, seq_len 256, batch 8, vocabulary 2048), with
the same threads, AdamW settings, schedule and steps, on the same Examples' windows, timed by
the same rule. Two peer figures: PyTorch eager, the target's reference (>= 1.0x), and
`torch.compile` (Inductor, which writes C++ and builds it with the host's compiler: where that
fails, the figure says so). The sides alternate, trainer, torch, torch, trainer
(bench/alternate.py), each torch turn running eager then compiled in fresh processes, and each
side's best run counts.

Beside the model ratio, a kernel ratio: the best GFLOP/s of a bare 2048 x 2048 float32 matmul
in TensorFlow (bench/mfu_bench.py's reference, in a fresh process) over PyTorch's, same
threads, alternating too: how much of the model ratio is the matmul library's.

    python -m bench torch   # its figures in bench's table: about 5 minutes on 2 quiet cores
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import alternate, mfu_bench, torch_env, trainer_run, workloads
from bench.results import Figure, Target

TIER = "quick"
TARGET = Target(">=", 1.0)
PEER_TIMEOUT_S = 900
RUNS = 2  # per side; 4 in the full tier
SHAPE = "4L d512 T256 B8 V2048"


def windows_file(examples_dir: Path, seq_len: int) -> Path:
    """The train split's windows of the Examples in `examples_dir` as one raw int32 file of
    (windows, seq_len + 1), for the torch venv, which has no TensorFlow; written once."""
    out = examples_dir / f"train-windows-{seq_len + 1}.int32"
    if out.exists():
        return out
    import numpy as np
    import tensorflow as tf

    from trainer import data

    manifest = data.read_manifest(str(examples_dir))
    files = data.split_files(str(examples_dir), manifest, "train")
    features = {"input_ids": tf.io.FixedLenFeature([seq_len + 1], tf.int64)}
    records = tf.data.TFRecordDataset(files, compression_type="GZIP").batch(4096)
    parts = [tf.io.parse_example(r, features)["input_ids"].numpy() for r in records]
    np.concatenate(parts).astype(np.int32).tofile(out)
    return out


def _torch(overrides: tuple[str, ...], steps: int, compiled: bool) -> dict[str, Any]:
    from trainer import run_plan
    from trainer.config import config_to_dict

    cfg = trainer_run.config("tiny", overrides)
    folder = trainer_run.examples(cfg.model.vocab_size, cfg.model.seq_len)
    args = ["speed", "--windows", str(windows_file(folder, cfg.model.seq_len))]
    args += ["--steps", str(steps), "--config-json", json.dumps(config_to_dict(cfg))]
    args += ["--peak-lr", str(run_plan.plan_run(cfg, 1).peak_learning_rate)]
    args += ["--compile"] if compiled else []
    try:
        return torch_env.run(args, PEER_TIMEOUT_S, threads=workloads.THREADS)
    except RuntimeError as err:
        if not compiled:
            raise
        return {"error": str(err).splitlines()[-1][-300:]}


def _trainer(overrides: tuple[str, ...], attempt: int) -> dict[str, Any]:
    # attempts of their own: a fresh run in this alternation, not peer_bench's cached one
    run = trainer_run.run_trainer("tiny", overrides, attempt=100 + attempt)
    if run.get("precision_policy") != "float32":
        raise RuntimeError(f"the trainer trained in {run.get('precision_policy')}, not float32")
    return run


def check_params(peer_params: int, m: Any) -> None:
    """Refuse a peer whose parameters are not the trainer's model's (trainer/flops.py counts
    them: every matmul parameter and the position table)."""
    from trainer import flops

    ours = flops.matmul_params(m) + m.seq_len * m.d_model
    if peer_params != ours:
        raise RuntimeError(f"the torch peer has {peer_params:,} parameters, the trainer {ours:,}")


def model_figures(steps: int, runs: int) -> list[Figure]:
    """The trainer over PyTorch eager and over torch.compile, float32, alternating."""
    from trainer.config import config_to_dict

    overrides = workloads.peer_overrides(512, steps, "float32")
    trainer, peer = alternate.abba(
        lambda attempt: _trainer(overrides, attempt),
        lambda _attempt: {
            "eager": _torch(overrides, steps, compiled=False),
            "compiled": _torch(overrides, steps, compiled=True),
        },
        runs,
    )
    ours = max(float(t["tokens_per_second"]) for t in trainer)
    check_params(peer[0]["eager"]["params"], trainer_run.config("tiny", overrides).model)
    inputs = {
        "config": config_to_dict(trainer_run.config("tiny", overrides)),
        "steps": steps,
        "threads": workloads.THREADS,
        "runs_per_side": runs,
        "peer": {"pins": list(torch_env.PINS), "versions": peer[0]["eager"].get("versions")},
    }
    found = []
    for mode, label, target in (("eager", "eager", TARGET), ("compiled", "torch.compile", None)):
        results = [p[mode] for p in peer]
        ok = [r for r in results if "tokens_per_second" in r]
        theirs = max((float(r["tokens_per_second"]) for r in ok), default=None)
        details = {
            "trainer_tokens_per_s": [t["tokens_per_second"] for t in trainer],
            "peer_tokens_per_s": [r.get("tokens_per_second") for r in results],
            "peer_first_step_s": [r.get("first_step_s") for r in results],
            "trainer_final_loss": trainer[0]["final_loss"],
            "peer_final_loss": ok[0]["final_loss"] if ok else None,
            "peer_params": ok[0]["params"] if ok else None,
        }
        errors = [r["error"] for r in results if "error" in r]
        found.append(
            Figure(
                name=f"training speed vs PyTorch {label}, {SHAPE}, both float32",
                value=ours / theirs if theirs else None,
                target=target,
                inputs=inputs,
                details={**details, "errors": errors},
                note=f"{label} failed: {errors[0]}" if errors and not ok else "",
            )
        )
    return found


def matmul_figure(runs: int, n: int = mfu_bench.MATMUL_N) -> Figure:
    """TensorFlow's n x n float32 matmul GFLOP/s over PyTorch's, fresh processes, alternating."""
    threads = workloads.THREADS
    tf_rates, torch_rates = alternate.abba(
        lambda _attempt: mfu_bench.matmul_reference(n=n, threads=threads),
        lambda _attempt: torch_env.run(["matmul", "--n", str(n)], 300, threads)["flops_per_second"],
        runs,
    )
    return Figure(
        name=f"matmul {n}x{n} float32 GFLOP/s, TensorFlow / PyTorch",
        value=max(tf_rates) / max(torch_rates),
        inputs={"n": n, "threads": threads, "runs_per_side": runs},
        details={
            "tensorflow_gflops": [r / 1e9 for r in tf_rates],
            "torch_gflops": [r / 1e9 for r in torch_rates],
        },
    )


def figures(full: bool) -> list[Figure]:
    steps = workloads.steps(workloads.PEER_STEPS[512], full)
    runs = 2 * RUNS if full else RUNS
    return [*model_figures(steps, runs), matmul_figure(runs)]


if __name__ == "__main__":
    from bench.results import markdown_table

    print(markdown_table(figures(full=False)))
