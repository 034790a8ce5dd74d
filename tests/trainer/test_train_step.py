"""Gradient accumulation in the train step (trainer/train_step.py): k micro-batches of b train as
one batch of k x b, in one process and across real MultiWorkerMirrored worker processes, with
one all-reduce per optimizer step and loss scaling under mixed_float16; and a rehearsal of
scale: 4 workers accumulating follow the loss curve of 1 worker on the same global batch."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tf_keras as keras

from components.jobs.local import LocalLauncher
from components.jobs.spec import JobSpec
from components.train.executor import trainer_command
from contracts.artifacts import SERVING_DIR, TRAIN_HISTORY, TRAIN_METRICS
from tests.processes import free_ports
from tests.tiny import SEQ_LEN, TINY_OVERRIDES, VOCAB_SIZE
from trainer.config import resolve_config
from trainer.model import build_gpt
from trainer.task import train
from trainer.train_step import InstrumentedGPT, instrumented

REPO = Path(__file__).resolve().parents[2]
MICRO = 2  # sequences per micro-batch
CFG = resolve_config("tiny", TINY_OVERRIDES)  # the tiny model; dropout 0


def _batch(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random (inputs, targets) of `rows` sequences, (rows, T) int32 each."""
    ids = np.random.default_rng(seed).integers(0, VOCAB_SIZE, (rows, SEQ_LEN + 1), np.int32)
    return ids[:, :-1], ids[:, 1:]


@pytest.fixture(scope="module")
def initial_weights() -> list[np.ndarray]:
    keras.utils.set_random_seed(CFG.train.seed)
    return build_gpt(CFG.model).get_weights()


def _trainee(
    weights: list[np.ndarray],
    accumulation: int,
    optimizer: keras.optimizers.Optimizer,
    recompute: bool = False,
) -> InstrumentedGPT:
    gpt = build_gpt(CFG.model, recompute=recompute)
    trainee = instrumented(gpt, timed=True, accumulation=accumulation)
    trainee.set_weights(weights)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    trainee.compile(optimizer=optimizer, loss=loss)
    return trainee


def _sgd_step(
    weights: list[np.ndarray], accumulation: int, optimizer: Any = None, recompute: bool = False
) -> tuple[list[np.ndarray], float, InstrumentedGPT]:
    """One step of SGD at learning rate 1 on `_batch(4 * MICRO)`: the weights' change is
    minus the gradient. Returns the gradients, the logged loss and the trainee."""
    optimizer = optimizer or keras.optimizers.SGD(1.0)
    trainee = _trainee(weights, accumulation, optimizer, recompute)
    logs = trainee.train_on_batch(*_batch(4 * MICRO), return_dict=True)
    grads = [w0 - w1 for w0, w1 in zip(weights, trainee.get_weights(), strict=True)]
    return grads, float(logs["loss"]), trainee


@pytest.mark.slow
def test_four_micro_batches_give_the_gradients_and_loss_of_one_batch_of_four(initial_weights):
    whole, whole_loss, one = _sgd_step(initial_weights, accumulation=1)
    summed, summed_loss, four = _sgd_step(initial_weights, accumulation=4)
    assert summed_loss == pytest.approx(whole_loss, rel=1e-6)  # the whole batch's mean loss
    for g1, g4 in zip(whole, summed, strict=True):
        np.testing.assert_allclose(g4, g1, rtol=1e-4, atol=1e-7)
    # The mean over the micro-batches, not their sum: the norm before clipping is the same.
    norms = [t.step_stats.read()["grad_norm"] for t in (one, four)]
    assert norms[1] == pytest.approx(norms[0], rel=1e-5) and norms[0] > 0
    assert four.optimizer.iterations.numpy() == 1  # one optimizer step for four micro-batches


@pytest.mark.slow
def test_recomputed_blocks_inside_the_accumulation_loop_give_the_same_gradients(
    initial_weights,
):
    whole, whole_loss, _ = _sgd_step(initial_weights, accumulation=1)
    summed, summed_loss, _ = _sgd_step(initial_weights, accumulation=4, recompute=True)
    assert summed_loss == pytest.approx(whole_loss, rel=1e-6)
    for g1, g4 in zip(whole, summed, strict=True):
        np.testing.assert_allclose(g4, g1, rtol=1e-4, atol=1e-7)


def test_accumulation_must_be_positive():
    with pytest.raises(ValueError, match="accumulation must be at least 1, got 0"):
        instrumented(build_gpt(CFG.model), timed=False, accumulation=0)


@contextmanager
def _mixed_float16() -> Iterator[None]:
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.mark.slow
def test_mixed_float16_accumulates_scaled_gradients_like_float32(initial_weights):
    expected, expected_loss, _ = _sgd_step(initial_weights, accumulation=1)
    with _mixed_float16():
        scaled = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(1.0))
        grads, loss, trainee = _sgd_step(initial_weights, 2, scaled)
    # float16 activations: about 3 significant digits in each micro-batch's backward pass.
    assert loss == pytest.approx(expected_loss, rel=1e-2)
    for got, want in zip(grads, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=0.05, atol=2e-3 * np.abs(want).max())
    assert float(trainee.optimizer.loss_scale) == 2.0**15  # finite: kept, not lowered


@pytest.mark.slow
def test_a_step_whose_micro_batch_gradients_overflow_is_skipped(initial_weights):
    with _mixed_float16():
        # A scale float16's largest finite value (65504) cannot hold: the backward pass of
        # each micro-batch overflows to inf, as a real overflow does.
        scale = 2.0**40
        overflowing = keras.mixed_precision.LossScaleOptimizer(
            keras.optimizers.SGD(1.0), initial_scale=scale
        )
        grads, _, trainee = _sgd_step(initial_weights, 2, overflowing)
    assert all(not g.any() for g in grads)  # the weights did not move
    assert float(trainee.optimizer.loss_scale) == scale / 2  # the scale came down
    assert trainee.optimizer.iterations.numpy() == 1  # and the step counts, as Keras counts it


# ---- across real MultiWorkerMirrored worker processes ---------------------------------------

STEPS = 3
# One program for the reference (one process, no TF_CONFIG) and for each of 2 workers: trains
# STEPS steps with the trainer's own model and optimizer (task.compiled_model) from the given
# weights on the given sequences, the i-th input pipeline taking the i-th slice of each global
# batch; then traces train steps of accumulation 1 and 4 (without running them) and counts the
# collective ops in their graphs, and those inside their loops.
WORKER = """
import collections, dataclasses, json, os, sys
import numpy as np
import tensorflow as tf
import tf_keras as keras
from trainer import cluster
from trainer.config import resolve_config
from trainer.run_plan import plan_run
from trainer.task import compiled_model

args = json.loads(sys.argv[1])
tf_config = os.environ.get("TF_CONFIG")
strategy = cluster.choose_strategy(tf_config)
index = cluster.task_index(tf_config)
cfg = resolve_config("tiny", args["overrides"])
plan = plan_run(cfg, strategy.num_replicas_in_sync)
ids = np.load(args["ids"])  # (steps, global batch, T + 1)


def trainee_of(accumulation):
    chosen = dataclasses.replace(plan, accumulation=accumulation)
    return compiled_model(strategy, cfg, chosen, "float32", jit=False).trainee


def train_input():
    def pipeline(ctx):
        rows = plan.micro_batch * plan.accumulation
        mine = ids[:, ctx.input_pipeline_id * rows : (ctx.input_pipeline_id + 1) * rows]
        return tf.data.Dataset.from_tensor_slices(mine).map(lambda w: (w[:, :-1], w[:, 1:]))
    return strategy.distribute_datasets_from_function(pipeline)


def collectives(accumulation):
    trainee = trainee_of(accumulation)
    batch = tf.zeros([plan.micro_batch * accumulation, ids.shape[2] - 1], tf.int32)
    data = tf.data.Dataset.from_tensors((batch, batch)).repeat()
    data = strategy.distribute_datasets_from_function(lambda ctx: data)
    graph = trainee.make_train_function().get_concrete_function(iter(data)).graph.as_graph_def()
    library = {f.signature.name: f.node_def for f in graph.library.function}

    def ops(nodes, seen):
        found = [n.op for n in nodes]
        for n in nodes:
            called = [n.op] + [a.func.name for a in n.attr.values() if a.HasField("func")]
            for name in called:
                if name in library and name not in seen:
                    seen.add(name)
                    found += ops(library[name], seen)
        return found

    def count(found):
        return sum("Collective" in op or op.startswith("Nccl") for op in found)

    everything = ops(graph.node, set())
    bodies = [n.attr["body"].func.name for f in [graph.node, *library.values()] for n in f
              if n.op in ("While", "StatelessWhile")]
    in_loops = [op for body in bodies for op in ops(library[body], set())]
    return {"all": count(everything), "in_loops": count(in_loops), "loops": len(bodies)}


trainee = trainee_of(plan.accumulation)
if args["weights"]:
    with np.load(args["weights"]) as saved:
        trainee.set_weights([saved[f"arr_{i}"] for i in range(len(saved.files))])
else:
    np.savez(os.path.join(args["out"], "initial.npz"), *trainee.get_weights())
losses, norms = [], []


class Record(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        losses.append(float(logs["loss"]))
        norms.append(trainee.step_stats.read()["grad_norm"])


trainee.fit(train_input(), epochs=1, steps_per_epoch=len(ids), verbose=0, callbacks=[Record()])
np.savez(os.path.join(args["out"], f"weights-{index}.npz"), *trainee.get_weights())
found = {"losses": losses, "norms": norms, "accumulation": plan.accumulation}
if tf_config:
    found["collectives"] = {k: collectives(k) for k in (1, 4)}
with open(os.path.join(args["out"], f"worker-{index}.json"), "w") as f:
    json.dump(found, f)
"""


def _run_workers(out: Path, workers: int, args: dict) -> None:
    """Run WORKER as `workers` processes (MultiWorkerMirrored when more than one) to the end."""
    out.mkdir()
    hosts = [f"localhost:{p}" for p in free_ports(workers)]
    procs = []
    for index in range(workers):
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        if workers > 1:
            task = {"type": "worker", "index": index}
            env["TF_CONFIG"] = json.dumps({"cluster": {"worker": hosts}, "task": task})
        command = [sys.executable, "-c", WORKER, json.dumps({**args, "out": str(out)})]
        procs.append(
            subprocess.Popen(
                command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
        )
    outputs = [p.communicate(timeout=300)[0].decode() for p in procs]  # a guard against hangs
    assert [p.returncode for p in procs] == [0] * workers, "\n".join(o[-3000:] for o in outputs)


class Runs:
    """The reference (1 process, batch 4b, no accumulation) and 2 workers (micro-batch b,
    accumulation 2): the same global batch of the same sequences, from the same weights."""

    def __init__(self, root: Path) -> None:
        ids = root / "ids.npy"
        inputs, targets = _batch(STEPS * 4 * MICRO)
        windows = np.concatenate([inputs, targets[:, -1:]], axis=1)  # (rows, T + 1)
        np.save(ids, windows.reshape(STEPS, 4 * MICRO, SEQ_LEN + 1))
        tokens = f"train.global_batch_tokens={4 * MICRO * SEQ_LEN}"
        ref = {"ids": str(ids), "weights": None, "overrides": [*TINY_OVERRIDES, tokens]}
        ref["overrides"].append(f"train.batch_size={4 * MICRO}")
        _run_workers(root / "reference", 1, ref)
        pair = {**ref, "weights": str(root / "reference" / "initial.npz")}
        pair["overrides"] = [*TINY_OVERRIDES, tokens, f"train.batch_size={MICRO}"]
        _run_workers(root / "workers", 2, pair)
        self.root = root

    def found(self, run: str, index: int = 0) -> dict:
        return json.loads((self.root / run / f"worker-{index}.json").read_text())

    def weights(self, run: str, index: int = 0) -> list[np.ndarray]:
        with np.load(self.root / run / f"weights-{index}.npz") as saved:
            return [saved[f"arr_{i}"] for i in range(len(saved.files))]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("accumulation"))


@pytest.mark.slow
def test_two_workers_accumulating_train_as_one_process_on_their_global_batch(runs):
    reference, workers = runs.found("reference"), runs.found("workers")
    assert (reference["accumulation"], workers["accumulation"]) == (1, 2)
    # Sums in another order: float32 rounding, which Adam's normalized steps carry on.
    assert workers["losses"] == pytest.approx(reference["losses"], rel=1e-5)
    assert workers["norms"] == pytest.approx(reference["norms"], rel=1e-4)
    initial = [np.load(runs.root / "reference" / "initial.npz")[f"arr_{i}"] for i in range(2)]
    trained = runs.weights("workers")
    assert not np.allclose(trained[0], initial[0])  # it trained
    for got, want in zip(trained, runs.weights("reference"), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    for mine, chiefs in zip(runs.weights("workers", 1), trained, strict=True):
        np.testing.assert_array_equal(mine, chiefs)  # mirrored: one update on every worker


@pytest.mark.slow
def test_a_step_all_reduces_once_whatever_its_micro_batches(runs):
    counts = runs.found("workers")["collectives"]
    one, four = counts["1"], counts["4"]
    assert one["all"] > 0  # the gradients' all-reduce, which MultiWorkerMirrored emits
    assert four["all"] == one["all"]  # not one per micro-batch
    assert (one["loops"], four["loops"]) == (0, 1)  # accumulation 1 keeps the loop-free step
    assert four["in_loops"] == 0  # nothing collective while the micro-batches run


# ---- the scale rehearsal: 4 workers through the local launcher ------------------------------

REHEARSAL = TINY_OVERRIDES + (
    "train.train_steps=30",
    "train.log_every=5",
    "train.checkpoint_every=30",
    "train.global_batch_tokens=256",  # 16 sequences of 16 tokens a step
)
# The 4 workers' input pipelines each read every 4th window in their own order: the same
# windows over the run, in another order, which moves the curve as another seed does. Seeds
# 1, 2 and 3 of the 1-worker run end at 3.63, 3.73 and 3.58 against the default's 3.69, within
# 3% of it at every logged step. A run whose micro-batches did not add up to the global batch
# (a loss logged x4, gradients of one micro-batch, a learning rate for another batch) or that
# stopped learning (5.77 at step 0) is far outside.
CURVE_TOLERANCE = 0.04


def _curve(model_dir: Path) -> dict[int, float]:
    history = json.loads((model_dir / SERVING_DIR / TRAIN_HISTORY).read_text())
    return {p["step"]: p["loss"] for p in history["points"]}


@pytest.mark.heavy
@pytest.mark.slow
def test_four_workers_accumulating_follow_one_workers_loss_curve(tmp_path, examples):
    one = resolve_config("tiny", (*REHEARSAL, "train.batch_size=16"))  # 1 x 16 x accumulation 1
    four = resolve_config("tiny", (*REHEARSAL, "train.batch_size=2"))  # 4 x 2 x accumulation 2
    train(str(examples), str(tmp_path / "one"), str(tmp_path / "one-work"), one)
    model, work = tmp_path / "four", tmp_path / "four-work"
    command = trainer_command(sys.executable, str(examples), str(model), str(work), four)
    spec = JobSpec(
        name="rehearsal",
        command=command,
        workers=4,
        backoff_limit=0,
        active_deadline_seconds=600,
        env={"TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    result = LocalLauncher(log_dir=tmp_path / "logs", out=io.StringIO()).run(spec)
    assert result.attempts == 1
    metrics = json.loads((model / TRAIN_METRICS).read_text())
    assert (metrics["workers"], metrics["replicas"], metrics["global_batch_size"]) == (4, 4, 16)
    expected, found = _curve(tmp_path / "one"), _curve(model)
    assert sorted(found) == sorted(expected) == [5, 10, 15, 20, 25, 30]
    assert found == pytest.approx(expected, rel=CURVE_TOLERANCE)
