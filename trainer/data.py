"""Input pipeline: the Examples artifact (manifest + GZIP TFRecord shards) -> (inputs, targets).

Each tf.train.Example holds one window `input_ids` of seq_len + 1 tokens; inputs are its first
seq_len tokens and targets the last seq_len (the next token at every position).

Before training, every worker checks the shards it will train and evaluate on
(trainer/shard_check.py), and a restarted worker only those that changed since.

Training reads the windows in `TrainOrder`: epoch by epoch, in blocks of shards whose sizes the
manifest gives, so a run resumed after K steps computes where its input stands.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from contracts.artifacts import EXAMPLES_MANIFEST
from contracts.errors import UserError
from contracts.examples import ExamplesManifest, parse_manifest
from trainer.config import Config
from trainer.run_plan import RunPlan
from trainer.shard_check import verify_shards

log = logging.getLogger("trainer")
# Philox: the same draws on every device and TensorFlow build (auto_select may differ).
_RNG = "philox"

# Shards read together and shuffled together (TrainOrder); a resumed run re-reads at most one.
BLOCK_FILES = 4


def read_manifest(examples_dir: str) -> ExamplesManifest:
    """Load the Examples folder's manifest (local or gs://); one refusal of a manifest this
    trainer cannot read (contracts.examples.parse_manifest)."""
    path = posixpath.join(examples_dir, EXAMPLES_MANIFEST)
    if not tf.io.gfile.exists(path):
        raise UserError(
            f"examples: {path} not found; pass --examples a folder written by the tokenize step"
        )
    with tf.io.gfile.GFile(path, "r") as f:
        return parse_manifest(f.read(), path)


def check_manifest(manifest: ExamplesManifest, cfg: Config) -> None:
    """The Examples were cut for this model: same window length and vocabulary size."""
    for field in ("seq_len", "vocab_size"):
        have, want = getattr(manifest, field), getattr(cfg.model, field)
        if have != want:
            raise UserError(
                f"examples: manifest {field}={have} but model.{field}={want}; re-run tokenize with "
                f"the same config or set model.{field}={have} in the run's config"
            )


def split_files(examples_dir: str, manifest: ExamplesManifest, split: str) -> list[str]:
    """Absolute paths of the shards of `split` ("train" or "eval") listed in the manifest."""
    stats = manifest.splits.get(split)
    if stats is None or not stats.shards:
        raise UserError(
            f"examples: manifest lists no shards for split {split!r}; re-run the tokenize step"
        )
    files = [posixpath.join(examples_dir, rel) for rel in stats.shards]
    missing = _missing(files)
    if missing:
        raise UserError(f"examples: shard {missing[0]} is missing; re-run the tokenize step")
    return files


def _missing(files: Sequence[str]) -> list[str]:
    """Those of `files` that do not exist, found with one listing of each folder rather than
    a request per file (a gs:// split of a thousand shards took a thousand metadata reads at
    every worker's start)."""
    listed: dict[str, set[str]] = {}
    for folder in dict.fromkeys(posixpath.dirname(f) for f in files):
        try:
            listed[folder] = set(tf.io.gfile.listdir(folder))
        except tf.errors.NotFoundError:
            listed[folder] = set()
    return [f for f in files if posixpath.basename(f) not in listed[posixpath.dirname(f)]]


def _list_files(files: str | Sequence[str]) -> list[str]:
    if isinstance(files, str):
        matched = sorted(tf.io.gfile.glob(files))
        if not matched:
            raise UserError(f"examples: no files match {files!r}")
        return matched
    return list(files)


def pipeline_files(
    files: Sequence[str], input_context: tf.distribute.InputContext | None
) -> list[str]:
    """The shards one input pipeline reads: every n-th file when there are at least as many
    files as the n pipelines, else all of them (and keeps every n-th example: make_dataset of
    the stream, TrainOrder of each shard)."""
    if input_context is not None and _shard_by_file(len(files), input_context):
        return list(files[input_context.input_pipeline_id :: input_context.num_input_pipelines])
    return list(files)


def _shard_by_file(n_files: int, input_context: tf.distribute.InputContext | None) -> bool:
    n_pipes = input_context.num_input_pipelines if input_context else 1
    return n_pipes > 1 and n_files >= n_pipes


def make_dataset(
    files: str | Sequence[str],
    seq_len: int,
    batch_size: int,
    input_context: tf.distribute.InputContext | None = None,
) -> tf.data.Dataset:
    """Batches of (inputs (B, T), targets (B, T)) int32 from GZIP TFRecord shards, in order.

    `files` is a glob pattern or a list of paths. With an `input_context` of several input
    pipelines, each worker reads its own files when there are at least as many files as
    workers, else every worker reads all files and keeps every n-th example.
    `batch_size` is the batch this dataset yields (per replica under a distribution strategy).
    The training input is `train_dataset`.
    """
    files = _list_files(files)
    n_pipes = input_context.num_input_pipelines if input_context else 1
    pipe_id = input_context.input_pipeline_id if input_context else 0
    shard_by_file = _shard_by_file(len(files), input_context)
    files = pipeline_files(files, input_context)
    ds = tf.data.Dataset.from_tensor_slices(files).interleave(
        lambda f: tf.data.TFRecordDataset(f, compression_type="GZIP"),
        cycle_length=min(len(files), BLOCK_FILES),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    if n_pipes > 1 and not shard_by_file:
        ds = ds.shard(n_pipes, pipe_id)
    return _batches(ds, seq_len, batch_size)


def _batches(records: tf.data.Dataset, seq_len: int, batch_size: int) -> tf.data.Dataset:
    """Serialized Examples -> parsed batches, prefetched."""
    ds = records.batch(batch_size, drop_remainder=True)
    ds = ds.map(lambda r: _parse_batch(r, seq_len), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


def _parse_batch(records: tf.Tensor, seq_len: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Serialized Examples (B,) -> inputs (B, T), targets (B, T)."""
    features = {"input_ids": tf.io.FixedLenFeature([seq_len + 1], tf.int64)}
    ids = tf.cast(tf.io.parse_example(records, features)["input_ids"], tf.int32)  # (B, T+1)
    return ids[:, :-1], ids[:, 1:]


class Shards(NamedTuple):
    """One split's TFRecord shards and the windows each holds."""

    files: list[str]  # absolute paths, in the manifest's order
    windows: list[int]  # windows in each file


def split_shards(examples_dir: str, manifest: ExamplesManifest, split: str) -> Shards:
    """The shards of `split` and their window counts, as the manifest lists them (tokenize's
    parts fill every shard of a unit with `parameters.shard_windows` windows but the unit's
    last); a manifest without the list (made by hand) has every shard full but the last."""
    files = split_files(examples_dir, manifest, split)
    per_shard = manifest.parameters.shard_windows
    total = manifest.splits[split].windows
    counts = list(manifest.splits[split].shard_windows)
    if counts:
        if len(counts) != len(files) or sum(counts) != total or min(counts) < 1:
            raise UserError(
                f"examples: the manifest's {split!r} split lists {len(files)} shards and "
                f"{len(counts)} window counts summing to {sum(counts)}, not {total}; "
                "re-run the tokenize step"
            )
        return Shards(files, counts)
    if per_shard < 1 or len(files) != -(-total // per_shard):
        raise UserError(
            f"examples: the manifest's {split!r} split lists {len(files)} shards, which "
            f"{total!r} windows at parameters.shard_windows={per_shard!r} do not fill; "
            "re-run the tokenize step"
        )
    return Shards(files, [min(per_shard, total - i * per_shard) for i in range(len(files))])


class TrainOrder:
    """The order one input pipeline trains on its windows, fixed by the seed alone, and where
    a run resumed after S windows picks it up without reading the S windows again.

    Data epoch e (one pass over the pipeline's shards; not Keras' epochs, which are
    checkpoint_every steps): the shards in a permutation drawn from (seed, e), cut into blocks
    of BLOCK_FILES shards. A block's windows are interleaved from its shards, then cut into
    chunks of `shuffle_buffer` windows, each permuted by a stateless draw from (seed, e, block,
    chunk). So every data epoch trains on each window once, and the stream is a sequence of
    blocks whose sizes are known from the manifest: `locate` finds the block a given window
    falls in by arithmetic, and a resumed run reads at most that one block up to its place.
    (A shuffle buffer running through an epoch, as the order before this one had, can only be
    caught up by replaying the epoch; and tf.data's shuffle takes its seed with TensorFlow's
    global seed, so stateless draws keep the order a function of `seed` alone.)
    """

    def __init__(self, shards: Shards, seed: int, shuffle_buffer: int, keep: tuple[int, int]):
        self.files = list(shards.files)
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer
        self.keep = keep  # (n, i): keep every n-th window of each shard from the i-th
        self.windows = np.array(_kept(shards.windows, *keep), np.int64)
        self.per_epoch = int(self.windows.sum())
        if self.per_epoch == 0:
            raise ValueError("TrainOrder over no window (pipeline_shards refuses that first)")

    def permutation(self, epoch: tf.Tensor | int) -> tf.Tensor:
        """The shards' order in data epoch `epoch` (int32 indices into `files`)."""
        return _permutation(len(self.files), self._key(epoch))

    def locate(self, skip: int) -> tuple[int, int, int]:
        """(data epoch, block, windows into the block) of the stream's window number `skip`.
        Eager: it reads the epoch's permutation back (the dataset function runs eagerly)."""
        epoch, left = divmod(skip, self.per_epoch)
        ordered = self.windows[self.permutation(epoch).numpy()]
        for block, start in enumerate(range(0, len(ordered), BLOCK_FILES)):
            size = int(ordered[start : start + BLOCK_FILES].sum())
            if left < size:
                return epoch, block, left
            left -= size
        raise AssertionError("unreachable: `left` is under the epoch's windows")

    def records(self, skip: int = 0) -> tf.data.Dataset:
        """The serialized windows from the stream's window number `skip` on, without end."""
        epoch, block, within = self.locate(skip)
        blocks_per_epoch = -(-len(self.files) // BLOCK_FILES)
        blocks = tf.data.Dataset.counter(start=epoch).flat_map(
            lambda e: tf.data.Dataset.range(blocks_per_epoch).map(lambda k: (e, k))
        )
        # One block after the other. A parallel interleave of cycle 1, which would open the
        # next block early, halved the input's rate here (bench/input_bench.py: 91x, not 189x).
        records = blocks.skip(block).flat_map(self._block)
        # Known to be endless, so MultiWorkerMirrored does not check every step, with an
        # all-reduce, whether some worker ran out (input_lib.py: partial batches).
        endless = tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY)
        return records.skip(within).apply(endless)

    def _key(self, epoch: tf.Tensor | int, *more: tf.Tensor) -> tf.Tensor:
        # Pipelines that share the shards (keeping every n-th window of each) draw their own
        # orders, so a step's n workers do not all train on one stretch of the text.
        key = tf.constant([self.seed, self.keep[1]], tf.int64)
        for value in (epoch, *more):
            key = tf.random.experimental.stateless_fold_in(key, tf.cast(value, tf.int64), alg=_RNG)
        return key

    def _block(self, epoch: tf.Tensor, block: tf.Tensor) -> tf.data.Dataset:
        start = tf.cast(block, tf.int32) * BLOCK_FILES
        chosen = self.permutation(epoch)[start : start + BLOCK_FILES]
        n, i = self.keep
        records = tf.data.Dataset.from_tensor_slices(tf.gather(self.files, chosen)).interleave(
            lambda f: tf.data.TFRecordDataset(f, compression_type="GZIP").shard(n, i),
            cycle_length=BLOCK_FILES,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        chunks = tf.data.Dataset.zip(records.batch(self.shuffle_buffer), tf.data.Dataset.counter())
        permuted = chunks.map(
            lambda chunk, j: tf.gather(
                chunk, _permutation(tf.shape(chunk)[0], self._key(epoch, block + 1, j))
            )
        )
        return permuted.prefetch(1).unbatch()  # the next chunk is read while this one is used


def _permutation(n: int | tf.Tensor, key: tf.Tensor) -> tf.Tensor:
    """A permutation of range(n) drawn from the stateless key (int32)."""
    return tf.random.experimental.stateless_shuffle(tf.range(n), key, alg=_RNG)


def _kept(windows: Sequence[int], n: int, i: int) -> list[int]:
    """Windows of each shard that the pipeline keeping every n-th from the i-th reads."""
    return [len(range(i, w, n)) for w in windows]


# Every replica contributes an equal share of each global batch, so a pipeline holding fewer
# windows than another cycles through them faster: its windows weigh more in training. Whole
# shards per pipeline are taken only when the pipelines' windows are this even (tokenize fills
# every shard but the last, so a large split is; a small one, say 4096 + 404 windows over two
# workers, would have the second worker's 404 drawn 10 times as often).
BALANCE = 0.9  # the fewest windows of any pipeline over the most


def pipeline_shards(
    shards: Shards, ctx: tf.distribute.InputContext | None
) -> tuple[Shards, tuple[int, int]]:
    """The shards one training input pipeline reads, and which of their windows it keeps:
    every n-th shard when there are at least as many as the n pipelines and that splits the
    windows evenly (BALANCE), keeping all their windows; else every shard, keeping every n-th
    window of each, which splits them within one window.

    Raises UserError when some pipeline would get no window, on every worker alike."""
    n = ctx.num_input_pipelines if ctx else 1
    per_pipeline = [sum(shards.windows[i::n]) for i in range(n)]
    even = min(per_pipeline) >= BALANCE * max(per_pipeline)
    if _shard_by_file(len(shards.files), ctx) and even:
        i = ctx.input_pipeline_id if ctx else 0
        return Shards(shards.files[i::n], shards.windows[i::n]), (1, 0)
    empty = [i for i in range(n) if sum(_kept(shards.windows, n, i)) == 0]
    if empty:
        raise UserError(
            f"examples: the train split's {sum(shards.windows)} windows leave input pipeline "
            f"{empty[0]} of {n} none; train on fewer workers or a larger corpus"
        )
    return shards, (n, ctx.input_pipeline_id if ctx else 0)


def train_dataset(
    shards: Shards,
    cfg: Config,
    ctx: tf.distribute.InputContext | None = None,
    skip_steps: int = 0,
    step_batch: int = 0,
) -> tf.data.Dataset:
    """The training input as `fit` consumes it, in TrainOrder with the config's seed, without
    end; from the batch that step `skip_steps` + 1 takes (a step takes one batch for each
    replica this pipeline feeds). `step_batch`: sequences per replica per optimizer step, all
    its micro-batches (RunPlan); 0: train.batch_size."""
    t = cfg.train
    batch = step_batch or t.batch_size
    mine, keep = pipeline_shards(shards, ctx)
    order = TrainOrder(mine, t.seed, t.shuffle_buffer, keep)
    replicas = ctx.num_replicas_in_sync // ctx.num_input_pipelines if ctx else 1
    records = order.records(skip_steps * replicas * batch)
    return _batches(records, cfg.model.seq_len, batch)


class DistributedData(NamedTuple):
    """The datasets `fit` reads under a strategy; `eval` is None when validation is off."""

    train: tf.distribute.DistributedDataset  # in TrainOrder without end, per-replica batches
    eval: tf.distribute.DistributedDataset | None  # the same eval_steps batches every time
    eval_steps: int  # validation batches per run; 0 when the eval split is under one batch


def distributed_datasets(
    strategy: tf.distribute.Strategy,
    examples_dir: str,
    manifest: ExamplesManifest,
    cfg: Config,
    plan: RunPlan,
    skip_steps: int = 0,
    checked_dir: str | None = None,
) -> DistributedData:
    """The train and eval splits, each worker reading its part; eval is off under one batch.

    A training batch holds a replica's whole optimizer step, `plan.accumulation` micro-batches
    (the train step splits it); validation runs on micro-batches.

    Each worker first checks the shards it reads (`verify_shards`): a damaged one stops it with
    a CorruptShardError naming the file, before any step. With `checked_dir` (in the job's work
    folder), each input pipeline records the shards it found whole there, and a restart reads
    only those that changed since. A run resumed at step N passes
    `skip_steps=N`: each worker's training input starts where its replicas' N steps left it,
    so the resumed run sees the data an uninterrupted one would (the seed fixes the order),
    having read at most one block of shards to get there (TrainOrder).
    """
    t = cfg.train
    train_shards = split_shards(examples_dir, manifest, "train")

    def train_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        mine, _ = pipeline_shards(train_shards, ctx)
        record = _checked_record(checked_dir, "train", ctx)
        verify_shards(examples_dir, mine.files, record, windows=mine.windows)
        step_batch = plan.micro_batch * plan.accumulation
        return train_dataset(train_shards, cfg, ctx, skip_steps, step_batch)

    train_ds = strategy.distribute_datasets_from_function(train_fn)
    global_batch = plan.micro_batch * strategy.num_replicas_in_sync  # of validation
    eval_split = manifest.splits.get("eval")
    eval_windows = eval_split.windows if eval_split else 0
    eval_steps = min(t.eval_batches, eval_windows // global_batch)
    if eval_steps == 0:
        log.warning(
            "eval split: %d windows, under one batch of %d; no validation",
            eval_windows,
            global_batch,
        )
        return DistributedData(train_ds, None, 0)
    eval_files = split_files(examples_dir, manifest, "eval")

    def eval_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        # The same eval_steps batches every validation; one input pipeline feeds its replicas.
        files = pipeline_files(eval_files, ctx)
        verify_shards(examples_dir, files, _checked_record(checked_dir, "eval", ctx))
        return make_dataset(eval_files, cfg.model.seq_len, plan.micro_batch, ctx).take(
            eval_steps * ctx.num_replicas_in_sync // ctx.num_input_pipelines
        )

    return DistributedData(
        train_ds, strategy.distribute_datasets_from_function(eval_fn), eval_steps
    )


def _checked_record(
    checked_dir: str | None, split: str, ctx: tf.distribute.InputContext
) -> str | None:
    """The record of one input pipeline's checked shards (verify_shards), or None."""
    if checked_dir is None:
        return None
    name = f"{split}-{ctx.input_pipeline_id}-of-{ctx.num_input_pipelines}.json"
    return posixpath.join(checked_dir, name)
