"""Quality per minute: nats/char on held-out text after the same wall time, trainer over peer.

Full tier only (about 25 minutes): `python -m bench --full`, or alone, at any budget:

    python -m bench.quality_bench --budget-s 600

Data: the bundled corpus through the tokenize step with eval_fraction 0.1, so both sides train
on its first 90% and are scored on the last 10% (nanoGPT's split; raw/eval.jsonl in Examples).

- The trainer: the `quality` preset (the `tiny` preset, with a note, while there is none), the
  real trainer (`python -m trainer.task`, 1 worker, 2 threads), for at most BUDGET_S of wall
  time from its launch: a calibration run measures its steps/s and start-up first, and
  train_steps is the preset's or the most that fit SAFETY of the budget, whichever is fewer
  (the peer's, by the same rule).
  Checkpoints are copied as they appear (the trainer keeps only the last 3); each point of the
  curve is one, exported with trainer/export.py and scored through the SavedModel's `score`
  signature, the last one the exported Model itself, with components/evaluate's `score_text`
  (nats/char = summed nats over UTF-8 characters).
- The peer: KerasHub GPT2 (bench/peer_gpt2.py) at 4 layers, 4 heads, d_model 256, d_ff 1024,
  seq_len 128, with the `quality` preset's training settings (optimizer, batch size, warmup,
  dropout: the same recipe, so only the models differ: GPT-2's learned position table against
  the preset's rotary positions, and the implementations), on the same corpus tokenized
  by the same tokenize step with the same SentencePiece BPE trainer at vocabulary 2048 (so
  tokenizer quality is the same for both). It trains for the same budget from its process
  start, its schedule's length set after 20 steps, and again from all its steps at the end of
  warmup, to the recipe's train_steps or what fits SAFETY of the time left, whichever is
  fewer, and is scored, at even fractions of the budget,
  on the same text chunks (the evaluate step's own chunking) exactly as `score` scores them.
- The floor: a character bigram with add-ALPHA smoothing, fitted on the same 90%.

Each side trains as it comes: the trainer in the policy its `auto` picks here (mixed_bfloat16
on a CPU that multiplies bfloat16 natively), the peer in Keras' default, float32; the figure's
name says which. (bench/peer_bench.py compares speed at equal precision.)

Figure: the trainer's final nats/char over the peer's; target <= 0.88.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

from bench import peer_env, trainer_run, workloads
from bench.results import Figure, Target

TIER = "full"
TARGET = Target("<=", 0.88)
BUDGET_S = 600.0
POINTS = 4  # evaluation points on the curve, evenly spaced in steps (trainer) or time (peer)
CALIBRATION_STEPS = 30
SAFETY = 0.9  # share of the budget left after start-up that planned steps may fill
ALPHA = 0.1  # add-alpha smoothing of the bigram floor
PEER_SHAPE = (
    "model.vocab_size=2048",
    "model.seq_len=128",
    "model.n_layer=4",
    "model.n_head=4",
    "model.d_model=256",
    "model.d_ff=1024",
    # GPT2Backbone has a learned position table only (keras_hub's gpt2_backbone.py); the
    # `quality` preset's rotary positions are the trainer's own model's, not the recipe's
    "model.position=learned",
)


def bigram_nats_per_char(train: str, held_out: str, alpha: float = ALPHA) -> float:
    """Mean -log p(c_i | c_{i-1}) over `held_out` of a character bigram fitted on `train`,
    add-alpha smoothed over the characters of both texts; the first character follows the last
    of `train`."""
    alphabet = set(train) | set(held_out)
    pairs = Counter(zip(train, train[1:], strict=False))
    contexts = Counter(train[:-1])
    size = len(alphabet)
    total, previous = 0.0, train[-1] if train else "\n"
    for char in held_out:
        p = (pairs[(previous, char)] + alpha) / (contexts[previous] + alpha * size)
        total -= math.log(p)
        previous = char
    return total / max(len(held_out), 1)


def preset() -> tuple[str, str]:
    """("quality", "") when trainer/config.py has that preset, else ("tiny", why)."""
    from trainer.config import ConfigError, resolve_config

    try:
        resolve_config("quality")
        return "quality", ""
    except ConfigError:
        print("quality_bench: the `quality` preset is missing; using `tiny`", file=sys.stderr)
        return "tiny", "no `quality` preset yet: `tiny` used"


class Host(NamedTuple):
    """How each side runs to stand for a kind of CPU."""

    label: str  # in the figures' names
    trainer_overrides: tuple[str, ...]  # config overrides of the trainer
    trainer_env: dict[str, str]  # its workers' environment, over the train step's WORKER_ENV
    peer_env: dict[str, str]  # the peer's environment


# native: this CPU as it is, each side as `auto` and TensorFlow's defaults have it. avx2: an
# AVX2-only x86 host, emulated on this one: no native bfloat16 (the trainer in float32, what its
# `auto` picks there), oneDNN held to AVX2 (ONEDNN_MAX_CPU_ISA), and the peer, a user's plain
# TensorFlow, on Eigen, as TensorFlow 2.19 leaves it without AVX-512 VNNI/BF16 or AMX
# (docs/training.md, "CPU: oneDNN"); the trainer keeps its workers' TF_ENABLE_ONEDNN_OPTS=1.
# TensorFlow's wheel compiles Eigen for AVX, not AVX2 or AVX-512, so Eigen runs here as there.
HOSTS = {
    "native": Host("", (), {}, {}),
    "avx2": Host(
        " (as on an AVX2 host)",
        ("train.precision=float32",),
        {"ONEDNN_MAX_CPU_ISA": "AVX2"},
        {"TF_ENABLE_ONEDNN_OPTS": "0", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    ),
}


# The benchmark plans the trainer's steps itself, by the rule it plans the peer's, so the
# preset's own time budget (train.max_minutes) is off here.
NO_BUDGET = "train.max_minutes=0"


def planned_steps(preset_steps: int, steps_per_s: float, startup_s: float, budget_s: float) -> int:
    """Training steps for the budget: the recipe's, or fewer if those would not fit SAFETY of
    it after start-up (the peer's schedule is planned by the same rule: bench/peer_gpt2.py);
    at least POINTS, and a multiple of POINTS so checkpoints fall on the curve's points. Not
    more than the recipe's: filling a fast machine's budget over-trains (1,440 steps of the
    learned-table `quality` of 2026-12-02 scored 1.557 nats/char where its 900 scored 1.524)."""
    fit = int(max(0.0, budget_s - startup_s) * SAFETY * steps_per_s)
    steps = max(POINTS, min(preset_steps, fit))
    return steps - steps % POINTS


def train_split(examples: Path, corpus_file: Path = trainer_run.CORPUS) -> tuple[str, str]:
    """(train text, eval text) of the tokenize step's split of `corpus_file` into `examples`."""
    from contracts.artifacts import EVAL_TEXT
    from contracts.eval_text import read_pieces

    with (examples / EVAL_TEXT).open("rb") as f:  # the corpus file is one document
        held_out = "".join(piece.text for piece in read_pieces(f, str(examples / EVAL_TEXT)))
    corpus = corpus_file.read_text(encoding="utf-8")
    if not corpus.endswith(held_out):
        raise RuntimeError("the eval split is not the corpus's tail; quality_bench assumes it is")
    return corpus[: len(corpus) - len(held_out)], held_out


class CheckpointCopier(threading.Thread):
    """Copies each `ckpt-N` that appears in a folder elsewhere, with the time it was seen."""

    def __init__(self, source: Path, target: Path) -> None:
        super().__init__(daemon=True)
        self.source, self.target = source, target
        self.seen: dict[int, float] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.poll()
            self.done.wait(0.5)
        self.poll()

    def poll(self) -> None:
        for index in sorted(self.source.glob("ckpt-*.index")):
            step = int(index.name.split("-")[1].split(".")[0])
            if step in self.seen:
                continue
            seen = time.time()
            try:
                for part in self.source.glob(f"ckpt-{step}.*"):
                    shutil.copy2(part, self.target / part.name)
            except FileNotFoundError:
                continue  # removed while copying (max_to_keep): nothing to score there
            self.seen[step] = seen


def _score_checkpoint(cfg, prefix: Path, tokenizer: Path, held_out: str, out: Path) -> dict:
    import tensorflow as tf

    from components.evaluate.scoring import score_text, signature_scorer
    from trainer import export, model

    gpt = model.build_gpt(cfg.model)
    tf.train.Checkpoint(model=gpt).restore(str(prefix)).expect_partial()
    export.export_model(gpt, cfg, str(tokenizer), str(out))
    scores = score_text(signature_scorer(tf.saved_model.load(str(out))), held_out)
    return {"nats_per_char": scores.nats_per_char, "nats_per_token": scores.nats_per_token}


def _watched_run(
    cfg, examples: Path, env: dict[str, str] | None = None
) -> tuple[Path, Path, dict[int, float]]:
    """Run the trainer (1 worker, 2 threads), copying each checkpoint as it appears; returns
    (job folder, copies folder, {step: seconds from the launch to its checkpoint})."""
    from contracts.artifacts import CHECKPOINT_DIR

    job = trainer_run.new_job_dir("quality")
    points = job.parent / f"{job.name}-points"
    points.mkdir()
    copier = CheckpointCopier(job / "work" / CHECKPOINT_DIR, points)
    started = time.time()
    copier.start()
    try:
        trainer_run.launch(cfg, examples, job, 1, workloads.THREADS, env)
    finally:
        copier.done.set()
        copier.join()
    return job, points, {step: seen - started for step, seen in copier.seen.items()}


def _plan(name: str, budget_s: float, host: Host) -> tuple[int, dict[str, float]]:
    """Steps for the budget, from a calibration run: its steady steps/s and its start-up (the
    time to its last checkpoint less the time its steps took)."""
    overrides = (*workloads.steady_state(CALIBRATION_STEPS), NO_BUDGET, *host.trainer_overrides)
    cfg = trainer_run.config(name, overrides)
    examples = trainer_run.examples(cfg.model.vocab_size, cfg.model.seq_len)
    job, _points, seen = _watched_run(cfg, examples, host.trainer_env)
    tokens_per_s = float(trainer_run.read_metrics(job / "model")["tokens_per_second"])
    steps_per_s = tokens_per_s / (cfg.train.batch_size * cfg.model.seq_len)
    startup = seen[CALIBRATION_STEPS] - CALIBRATION_STEPS / steps_per_s
    steps = planned_steps(
        trainer_run.config(name, ()).train.train_steps, steps_per_s, startup, budget_s
    )
    return steps, {"tokens_per_s": tokens_per_s, "startup_s": startup}


def train_trainer(name: str, budget_s: float, held_out: str, host: Host) -> dict[str, Any]:
    """The trainer's curve: [{minutes, step, nats_per_char}], and what it ran with."""
    from trainer.config import config_to_dict

    steps, calibration = _plan(name, budget_s, host)
    base = trainer_run.config(name, ())
    overrides = (
        NO_BUDGET,
        *host.trainer_overrides,
        f"train.train_steps={steps}",
        checkpoint_at_points(steps),
        f"train.warmup_steps={min(base.train.warmup_steps, steps // 5)}",
    )
    cfg = trainer_run.config(name, overrides)
    examples = trainer_run.examples(cfg.model.vocab_size, cfg.model.seq_len)
    job, curve = scored_run(cfg, examples, held_out, host.trainer_env)
    return {
        "curve": curve,
        "config": config_to_dict(cfg),
        "calibration": calibration,
        "planned_steps": steps,
        "precision_policy": trainer_run.read_metrics(job / "model")["precision_policy"],
    }


def checkpoint_at_points(steps: int) -> str:
    """The override that puts a checkpoint at each of the curve's POINTS of `steps` (a
    multiple of POINTS: planned_steps makes it one, quality_tune refuses others)."""
    return f"train.checkpoint_every={steps // POINTS}"


def scored_run(
    cfg, examples: Path, held_out: str, env: dict[str, str] | None = None
) -> tuple[Path, list[dict[str, float]]]:
    """Train `cfg` on `examples` and score each of its checkpoints on `held_out`: (job folder,
    [{minutes, step, nats_per_char, nats_per_token}]); the last point is the exported Model."""
    import tensorflow as tf

    from components.evaluate.scoring import score_text, signature_scorer
    from contracts.artifacts import SERVING_DIR, TOKENIZER_FILE

    job, points, seen = _watched_run(cfg, examples, env)
    curve = []
    for step, seconds in sorted(seen.items()):
        if step == cfg.train.train_steps:  # the last point: the exported Model itself
            model = tf.saved_model.load(str(job / "model" / SERVING_DIR))
            s = score_text(signature_scorer(model), held_out)
            scores = {"nats_per_char": s.nats_per_char, "nats_per_token": s.nats_per_token}
        else:
            prefix, out = points / f"ckpt-{step}", points / f"export-{step}"
            scores = _score_checkpoint(cfg, prefix, examples / TOKENIZER_FILE, held_out, out)
        curve.append({"minutes": seconds / 60, "step": step, **scores})
    return job, curve


def peer_config() -> Any:
    """The peer's Config: the trainer's preset (its batch, warmup, dropout, optimizer) at the
    peer's shape, so that the two sides differ in their models and implementations only: the
    same recipe, the preset's position encoding (rotary) the one architectural difference."""
    return trainer_run.config(preset()[0], PEER_SHAPE)


def train_peer(budget_s: float, chunks_file: Path, host: Host) -> dict[str, Any]:
    """The peer's curve from bench/peer_gpt2.py, and what it ran with."""
    from contracts.artifacts import TOKENIZER_FILE
    from trainer.config import config_to_dict

    cfg = peer_config()
    examples = trainer_run.examples(cfg.model.vocab_size, cfg.model.seq_len)
    args = [
        "quality",
        "--examples",
        str(examples),
        "--config-json",
        json.dumps(config_to_dict(cfg)),
        "--budget-s",
        str(budget_s),
        "--points",
        str(POINTS),
        "--chunks",
        str(chunks_file),
        "--tokenizer",
        str(examples / TOKENIZER_FILE),
        "--safety",
        str(SAFETY),
    ]
    result = peer_env.run_peer(
        args, budget_s + 900, threads=workloads.THREADS, extra_env=host.peer_env
    )
    return {**result, "config": config_to_dict(cfg)}


def measure(budget_s: float, host_name: str = "native") -> list[Figure]:
    """Train both sides for `budget_s` as on `host_name` (HOSTS), score their curves, fit the
    floor; the figures."""
    host = HOSTS[host_name]
    from components.evaluate.scoring import CHUNK_CHARS, chunk_text

    name, note = preset()
    base = trainer_run.config(name, ())
    examples = trainer_run.examples(base.model.vocab_size, base.model.seq_len)
    train_text, held_out = train_split(examples)
    chunks_file = trainer_run.scratch() / "eval-chunks.json"
    chunks_file.write_text(json.dumps(chunk_text(held_out, CHUNK_CHARS)), encoding="utf-8")
    ours = train_trainer(name, budget_s, held_out, host)
    theirs = train_peer(budget_s, chunks_file, host)
    floor = bigram_nats_per_char(train_text, held_out)
    ours_final = ours["curve"][-1]["nats_per_char"]
    theirs_final = theirs["curve"][-1]["nats_per_char"]
    inputs = {
        "host": host_name,
        "budget_s": budget_s,
        "threads": workloads.THREADS,
        "eval_chars": len(held_out),
        "trainer_preset": name,
        "trainer_precision_policy": ours["precision_policy"],
        "peer_precision_policy": "float32",
        "trainer_config": ours["config"],
        "peer_config": theirs["config"],
        "peer": {"pins": list(peer_env.PINS), "versions": theirs.get("versions")},
    }
    curves = {"trainer": ours["curve"], "peer": theirs["curve"]}
    overran = ours["curve"][-1]["minutes"] * 60 - budget_s
    budget_note = f"trainer overran its budget by {overran:.0f} s" if overran > 0 else ""
    note = "; ".join(n for n in (note, budget_note) if n)
    per_char = "nats/char"
    return [
        Figure(
            name=f"quality per minute{host.label}: nats/char trainer "
            f"({ours['precision_policy']}) / peer (float32) after {budget_s / 60:.0f} min",
            value=ours_final / theirs_final,
            target=TARGET,
            inputs=inputs,
            details={
                "curves": curves,
                "bigram_nats_per_char": floor,
                "planned_steps": ours["planned_steps"],
            },
            note=note,
        ),
        Figure(name=f"trainer ({name}){host.label} nats/char", value=ours_final, unit=per_char),
        Figure(
            name=f"peer (KerasHub GPT2 4L d256 T128 V2048){host.label} nats/char",
            value=theirs_final,
            unit=per_char,
        ),
        Figure(name="floor: character bigram nats/char", value=floor, unit=per_char),
    ]


def figures(full: bool) -> list[Figure]:
    return [*measure(BUDGET_S), *measure(BUDGET_S, "avx2")[:3]]


def main(argv: list[str]) -> None:
    from bench.results import markdown_table

    p = argparse.ArgumentParser(prog="python -m bench.quality_bench")
    p.add_argument("--budget-s", type=float, default=BUDGET_S, help="wall seconds per side")
    p.add_argument("--host", choices=sorted(HOSTS), default="native", help="as on which CPU")
    args = p.parse_args(argv)
    found = measure(args.budget_s, args.host)
    print(markdown_table(found))
    print(json.dumps(found[0].details["curves"], indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
