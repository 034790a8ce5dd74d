"""The peer: KerasHub's GPT2 (Keras 3, TensorFlow backend), trained as the trainer trains.

Runs only inside the peer venv (bench/peer_env.py), as a script: it imports nothing of this
project, which is built on tf-keras. It reads the same Examples the trainer reads (the tokenize
step's GZIP TFRecords) and the same resolved config JSON (`trainer.config.config_to_dict`):

- the model is `GPT2Backbone` (random init from a config, never `from_preset`) under
  `GPT2CausalLM`, whose logits go through the tied token embedding, at the config's shape;
- the optimizer is AdamW with the trainer's warmup + cosine schedule, peak learning rate scaled
  to the batch, weight decay (not on biases, LayerNorm or embeddings' norms), betas and global
  clipping, so both sides do the same arithmetic per step (in other kernels: the trainer
  updates each variable in one fused kernel, trainer.optimization.FusedAdamW; Keras 3's AdamW
  runs op by op);
- the input pipeline does trainer/data.py's work with tf.data's stock ops: the same GZIP
  shards interleaved 4 at a time, a shuffle buffer of the config's size, repeat, batch, then
  parse (the trainer's order, TrainOrder, is the same work arranged so a resume can find its
  place; neither side waits for its input: bench/input_bench.py measures the trainer's).

    python bench/peer_gpt2.py speed --examples DIR --config-json JSON --steps N
    python bench/peer_gpt2.py quality --examples DIR --config-json JSON --budget-s S \
        --chunks FILE.json --tokenizer FILE.model --points 4

Each prints one JSON line. `speed` times steps as the trainer's TrainMonitor does: wall time
from the first step's loss read back to the host (the first step traces the graph) to the last
step's, with no host read in between. `quality` trains until the budget
(seconds since this process started) is spent, snapshots the weights at `points` evenly spaced
times, and scores each snapshot on the given text chunks in nats/char, exactly as the trainer's
SavedModel `score` signature does (windows of seq_len + 1 tokens at stride seq_len).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

STARTED = time.time()  # before TensorFlow is imported: the quality budget counts the import too
CALIBRATION = 20  # quality: steps timed before the schedule's length is set


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=("speed", "quality"))
    p.add_argument("--examples", required=True, help="the tokenize step's Examples folder")
    p.add_argument("--config-json", required=True, help="trainer.config.config_to_dict JSON")
    p.add_argument("--steps", type=int, default=20, help="speed: steps to train")
    p.add_argument("--threads", type=int, default=0, help="TF intra- and inter-op threads")
    p.add_argument("--dropout", type=float, default=None, help="override the config's dropout")
    p.add_argument("--policy", default="float32", help="Keras dtype policy, e.g. mixed_bfloat16")
    p.add_argument("--budget-s", type=float, default=600.0, help="quality: wall budget")
    p.add_argument("--planned-steps", type=int, default=0, help="quality: schedule length")
    p.add_argument("--safety", type=float, default=0.9, help="quality: share of time to plan")
    p.add_argument("--points", type=int, default=4, help="quality: snapshots to score")
    p.add_argument("--chunks", help="quality: JSON list of text chunks to score")
    p.add_argument("--tokenizer", help="quality: the SentencePiece model of the Examples")
    return p.parse_args()


def build(cfg: dict, total_steps: int, dropout: float | None):
    """(GPT2CausalLM at the config's shape, compiled with the trainer's optimizer settings,
    its learning-rate schedule)."""
    m, t = cfg["model"], cfg["train"]
    if m.get("position", "learned") != "learned":  # what GPT2Backbone has (gpt2_backbone.py)
        position = m["position"]
        raise SystemExit(f"peer_gpt2: GPT2 has learned positions, not model.position={position}")
    import keras
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=m["vocab_size"],
        num_layers=m["n_layer"],
        num_heads=m["n_head"],
        hidden_dim=m["d_model"],
        intermediate_dim=m["d_ff"],
        dropout=m["dropout"] if dropout is None else dropout,
        max_sequence_length=m["seq_len"],
    )
    model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    peak = t["learning_rate"] * t["batch_size"] / t["reference_batch_size"]
    schedule = warmup_cosine(peak, t["warmup_steps"], total_steps, t["min_lr_ratio"])
    optimizer = keras.optimizers.AdamW(
        learning_rate=schedule,
        weight_decay=t["weight_decay"],
        beta_1=t["beta_1"],
        beta_2=t["beta_2"],
        global_clipnorm=t["grad_clip_norm"] or None,
    )
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=[],
        jit_compile=False,  # as the trainer on CPU (config.use_jit_compile)
    )
    return model, schedule


def warmup_cosine(peak_lr: float, warmup_steps: int, total_steps: int, min_lr_ratio: float):
    """trainer/optimization.py's WarmupCosine schedule, in Keras 3 ops; its length is a
    variable (`total`), so that a run can set it once it knows how many steps fit its budget."""
    import keras
    from keras import ops

    class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
        def __init__(self):
            self.total = keras.Variable(float(total_steps), trainable=False, name="total_steps")

        def __call__(self, step):
            step = ops.cast(step, "float32")
            warmup = peak_lr * (step + 1.0) / max(warmup_steps, 1)
            decay_steps = ops.maximum(1.0, self.total - warmup_steps)
            progress = ops.clip((step - warmup_steps) / decay_steps, 0.0, 1.0)
            cosine = 0.5 * (1.0 + ops.cos(math.pi * progress))
            decayed = peak_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine)
            return ops.where(step < warmup_steps, warmup, decayed)

        def get_config(self):
            return {
                "peak_lr": peak_lr,
                "warmup_steps": warmup_steps,
                "total_steps": float(self.total.numpy()),
                "min_lr_ratio": min_lr_ratio,
            }

    return WarmupCosine()


def dataset(examples: str, cfg: dict):
    """The training input (the same work as trainer/data.py's), yielding GPT2CausalLM's
    (features, targets)."""
    import tensorflow as tf

    with open(os.path.join(examples, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    files = [os.path.join(examples, s) for s in manifest["splits"]["train"]["shards"]]
    m, t = cfg["model"], cfg["train"]
    seq_len = m["seq_len"]
    ds = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files), seed=t["seed"])
    ds = ds.interleave(
        lambda f: tf.data.TFRecordDataset(f, compression_type="GZIP"),
        cycle_length=min(len(files), 4),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False,
    )
    ds = ds.shuffle(t["shuffle_buffer"], seed=t["seed"], reshuffle_each_iteration=True).repeat()
    ds = ds.batch(t["batch_size"], drop_remainder=True)

    def parse(records):
        features = {"input_ids": tf.io.FixedLenFeature([seq_len + 1], tf.int64)}
        ids = tf.cast(tf.io.parse_example(records, features)["input_ids"], tf.int32)
        x = {"token_ids": ids[:, :-1], "padding_mask": tf.ones_like(ids[:, :-1], tf.bool)}
        return x, ids[:, 1:]

    return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def _timer(steps: int):
    import keras

    class StepTimer(keras.callbacks.Callback):
        """TrainMonitor's clock: wall time from the first step's loss on the host to the last
        step's, with no host read in between (the steps run as fit runs them)."""

        def __init__(self):
            super().__init__()
            self.first_end = 0.0
            self.last_end = 0.0
            self.loss = float("nan")

        def on_train_batch_end(self, batch, logs=None):
            if batch in (0, steps - 1):
                self.loss = float(logs["loss"])
                now = time.perf_counter()
                if batch == 0:
                    self.first_end = now
                else:
                    self.last_end = now

    return StepTimer()


def speed(args: argparse.Namespace, cfg: dict) -> dict:
    model, _schedule = build(cfg, args.steps, args.dropout)
    timer = _timer(args.steps)
    model.fit(
        dataset(args.examples, cfg),
        steps_per_epoch=args.steps,
        epochs=1,
        callbacks=[timer],
        verbose=0,
    )
    tokens_per_step = cfg["train"]["batch_size"] * cfg["model"]["seq_len"]
    timed = args.steps - 1
    return {
        "tokens_per_second": tokens_per_step * timed / max(timer.last_end - timer.first_end, 1e-9),
        "timed_steps": timed,
        "params": model.count_params(),
        "final_loss": timer.loss,
    }


def quality(args: argparse.Namespace, cfg: dict) -> dict:
    """Train for the budget, planning the schedule's length from the steps' speed (`--safety`
    of the time left), at most the recipe's train_steps, as quality_bench plans the trainer's;
    score snapshots taken at `points` even fractions of the budget (or at the end, when
    training ends sooner).

    The plan is made at step CALIBRATION and made again at the end of warmup (`replan_steps`),
    from all the steps so far: every step until then took a warmup rate, which does not read
    the length, so no step already taken changes (when warmup_steps >= CALIBRATION, as the
    recipes have it), and one slow moment among the first 20 steps no longer sets the length
    (on 2026-12-03 it cut the schedule to 824 of 900 steps, and the run stopped at 7.3 of 10
    minutes). Training stops at the plan only once the last plan is made; until then the
    budget ends it."""
    import keras

    model, schedule = build(cfg, args.planned_steps or 10**6, args.dropout)
    at = [args.budget_s * (i + 1) / args.points for i in range(args.points)]
    snapshots: list[tuple[float, int, list]] = []
    plan = {"steps": args.planned_steps, "first_end": 0.0}
    replans = replan_steps(int(cfg["train"]["warmup_steps"]))

    class Budget(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            float(logs["loss"])  # the step is done before the clock is read
            now = time.time()
            step = int(self.model.optimizer.iterations.numpy())
            if step == 1:
                plan["first_end"] = now
            if not args.planned_steps and step in replans:
                plan["steps"] = planned(
                    step,
                    seconds=now - plan["first_end"],
                    left_s=args.budget_s - (now - STARTED),
                    safety=args.safety,
                    cap=int(cfg["train"]["train_steps"]),  # the recipe's, as the trainer's
                )
                schedule.total.assign(float(plan["steps"]))
            final = bool(args.planned_steps) or step >= replans[-1]
            done = bool(plan["steps"]) and final and step >= plan["steps"]
            elapsed = now - STARTED
            while len(snapshots) < len(at) and (elapsed >= at[len(snapshots)] or done):
                snapshots.append((elapsed, step, self.model.get_weights()))
            if len(snapshots) == len(at):
                self.model.stop_training = True

    model.fit(
        dataset(args.examples, cfg),
        steps_per_epoch=10**6,
        epochs=1,
        callbacks=[Budget()],
        verbose=0,
    )
    with open(args.chunks, encoding="utf-8") as f:
        chunks = json.load(f)
    curve = []
    for elapsed, step, weights in snapshots:
        model.set_weights(weights)
        scores = score(model, chunks, args.tokenizer, cfg["model"]["seq_len"])
        curve.append({"minutes": elapsed / 60.0, "step": step, **scores})
    return {"curve": curve, "params": model.count_params(), "planned_steps": plan["steps"]}


def replan_steps(warmup_steps: int) -> tuple[int, ...]:
    """The steps after which `quality` plans its schedule's length: CALIBRATION, so that a
    short budget has a plan early, and the end of warmup: the steps up to it take warmup rates,
    which do not read the length (warmup_cosine), so a plan made there changes none of them."""
    return tuple(sorted({CALIBRATION, max(CALIBRATION, warmup_steps)}))


def planned(step: int, seconds: float, left_s: float, safety: float, cap: int) -> int:
    """The schedule's length after `step` steps: those, plus what fits `safety` of the
    `left_s` seconds left at the rate of steps 2..`step` (`seconds` since step 1 ended: step 1
    traces the graph), at most `cap`."""
    rate = (step - 1) / seconds
    return min(cap, step + max(0, int(left_s * safety * rate)))


def score(model, chunks: list[str], tokenizer: str, seq_len: int, batch: int = 8) -> dict:
    """nats/char of `chunks` as trainer/export.py's `score`: each chunk's tokens in windows of
    seq_len + 1 at stride seq_len, every target after the chunk's first token counted once."""
    import numpy as np
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=tokenizer)
    windows, masks = [], []
    nats, tokens, chars = 0.0, 0, 0
    for text in chunks:
        ids = sp.encode(text)
        tokens += max(len(ids) - 1, 0)
        chars += len(text)
        for w, m in _windows(ids, seq_len):
            windows.append(w)
            masks.append(m)
    windows_a, masks_a = np.array(windows, np.int32), np.array(masks, np.float32)
    for i in range(0, len(windows_a), batch):
        w, m = windows_a[i : i + batch], masks_a[i : i + batch]
        x = {"token_ids": w[:, :-1], "padding_mask": np.ones_like(w[:, :-1], bool)}
        logits = np.asarray(model(x, training=False), np.float64)  # (B, T, V)
        logits -= logits.max(axis=-1, keepdims=True)
        logz = np.log(np.exp(logits).sum(axis=-1))  # (B, T)
        target = np.take_along_axis(logits, w[:, 1:, None], axis=-1)[..., 0]
        nats += float(((logz - target) * m[:, 1:]).sum())
    return {"nats_per_char": nats / max(chars, 1), "nats_per_token": nats / max(tokens, 1)}


def _windows(ids: list[int], seq_len: int):
    """(window, mask) pairs of seq_len + 1 tokens at stride seq_len, padded with 0 (masked)."""
    length = max(len(ids), seq_len + 1)
    count = max(1, math.ceil((length - 1) / seq_len))
    padded = ids + [0] * (count * seq_len + 1 - len(ids))
    valid = [1] * len(ids) + [0] * (len(padded) - len(ids))
    for i in range(count):
        start = i * seq_len
        yield padded[start : start + seq_len + 1], valid[start : start + seq_len + 1]


def main() -> None:
    args = parse_args()
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    import keras

    keras.utils.set_random_seed(json.loads(args.config_json)["train"]["seed"])
    keras.config.set_dtype_policy(args.policy)
    cfg = json.loads(args.config_json)
    result = speed(args, cfg) if args.mode == "speed" else quality(args, cfg)
    versions = {"keras": keras.__version__, "tensorflow": tf.__version__}
    try:
        import keras_hub

        versions["keras_hub"] = keras_hub.__version__
    except ImportError:
        pass
    print(json.dumps({**result, "versions": versions}))


if __name__ == "__main__":
    main()
