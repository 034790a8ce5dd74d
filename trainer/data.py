"""Input pipeline: the Examples artifact (manifest + GZIP TFRecord shards) -> (inputs, targets).

Each tf.train.Example holds one window `input_ids` of seq_len + 1 tokens; inputs are its first
seq_len tokens and targets the last seq_len (the next token at every position).

Before training, every worker reads the shards it will train and evaluate on once, to the end
of their GZIP streams (`verify_shards`): TensorFlow reports a damaged shard as a DataLossError
mid-training without naming the file, and reads a shard cut at its GZIP trailer, or cut to
nothing, without any error, so training would quietly run on less data.
"""

from __future__ import annotations

import json
import logging
import posixpath
import zlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import tensorflow as tf

from contracts.artifacts import EXAMPLES_MANIFEST
from contracts.errors import UserError
from trainer import config as config_lib
from trainer.config import Config

log = logging.getLogger("trainer")

_VERIFY_CHUNK = 1 << 20  # bytes read at a time while checking a shard's GZIP stream
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # zlib's gzip mode: header, deflate data, CRC-32 and length


class CorruptShardError(UserError):
    """A listed TFRecord shard is not the whole GZIP stream tokenize wrote."""


def read_manifest(examples_dir: str) -> dict[str, Any]:
    """Load the Examples folder's manifest (local or gs://)."""
    path = posixpath.join(examples_dir, EXAMPLES_MANIFEST)
    if not tf.io.gfile.exists(path):
        raise UserError(
            f"examples: {path} not found; pass --examples a folder written by the tokenize step"
        )
    with tf.io.gfile.GFile(path, "r") as f:
        manifest: dict[str, Any] = json.load(f)
    for key in ("seq_len", "vocab_size", "splits"):
        if key not in manifest:
            raise UserError(f"examples: {path} has no {key!r}; re-run the tokenize step")
    return manifest


def check_manifest(manifest: dict[str, Any], cfg: Config) -> None:
    """The Examples were cut for this model: same window length and vocabulary size."""
    for field in ("seq_len", "vocab_size"):
        have, want = manifest[field], getattr(cfg.model, field)
        if have != want:
            raise UserError(
                f"examples: manifest {field}={have} but model.{field}={want}; re-run tokenize with "
                f"the same config or set model.{field}={have} in the run's config"
            )


def split_files(examples_dir: str, manifest: dict[str, Any], split: str) -> list[str]:
    """Absolute paths of the shards of `split` ("train" or "eval") listed in the manifest."""
    splits = manifest["splits"]
    if split not in splits or not splits[split].get("shards"):
        raise UserError(
            f"examples: manifest lists no shards for split {split!r}; re-run the tokenize step"
        )
    files = [posixpath.join(examples_dir, rel) for rel in splits[split]["shards"]]
    missing = [f for f in files if not tf.io.gfile.exists(f)]
    if missing:
        raise UserError(f"examples: shard {missing[0]} is missing; re-run the tokenize step")
    return files


def _list_files(files: str | Sequence[str]) -> list[str]:
    if isinstance(files, str):
        matched = sorted(tf.io.gfile.glob(files))
        if not matched:
            raise UserError(f"examples: no files match {files!r}")
        return matched
    return list(files)


def verify_shards(examples_dir: str, files: Sequence[str]) -> None:
    """Read each shard to the end of its GZIP stream; raise CorruptShardError naming the first
    that is damaged (its CRC-32 or length check fails) or truncated (its stream does not end).

    It reads the compressed bytes once (zlib, in C: about 0.1 GB/s on one CPU core) and catches
    what TensorFlow reports mid-training without a file name (a DataLossError), or not at all.
    """
    for path in files:
        problem = _gzip_problem(path)
        if problem:
            raise CorruptShardError(
                f"corrupt TFRecord shard {path}: {problem}; the Examples are damaged: delete the "
                f"folder {examples_dir} and run again, so that tokenize writes them anew"
            )


def _gzip_problem(path: str) -> str:
    """Why `path` is not whole GZIP data (complete members only), or "" when it is."""
    inflate = zlib.decompressobj(_GZIP_WBITS)
    offset = 0  # compressed bytes checked so far
    pending = False  # a member has begun and not yet ended
    with tf.io.gfile.GFile(path, "rb") as f:
        while chunk := f.read(_VERIFY_CHUNK):
            size = len(chunk)
            try:
                while chunk:
                    inflate.decompress(chunk)  # checks each member's CRC-32 and length
                    pending = not inflate.eof
                    if pending:
                        break
                    chunk = inflate.unused_data  # another member follows
                    inflate = zlib.decompressobj(_GZIP_WBITS)
            except zlib.error as err:
                return f"{err} (in its bytes {offset}-{offset + size})"
            offset += size
    if offset == 0:
        return "the file is empty; a shard holds at least one window"
    if pending:
        return f"truncated: the file ends inside its GZIP stream, after {offset} bytes"
    return ""


def pipeline_files(
    files: Sequence[str], input_context: tf.distribute.InputContext | None
) -> list[str]:
    """The shards one input pipeline reads: every n-th file when there are at least as many
    files as the n pipelines, else all of them (and make_dataset keeps every n-th example)."""
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
    shuffle: bool = False,
    seed: int = 0,
    shuffle_buffer: int = 1024,
    repeat: bool = False,
    input_context: tf.distribute.InputContext | None = None,
) -> tf.data.Dataset:
    """Batches of (inputs (B, T), targets (B, T)) int32 from GZIP TFRecord shards.

    `files` is a glob pattern or a list of paths. With an `input_context` of several input
    pipelines, each worker reads its own files when there are at least as many files as
    workers, else every worker reads all files and keeps every n-th example.
    `batch_size` is the batch this dataset yields (per replica under a distribution strategy).
    """
    files = _list_files(files)
    n_pipes = input_context.num_input_pipelines if input_context else 1
    pipe_id = input_context.input_pipeline_id if input_context else 0
    shard_by_file = _shard_by_file(len(files), input_context)
    files = pipeline_files(files, input_context)
    ds = tf.data.Dataset.from_tensor_slices(files)
    if shuffle:
        ds = ds.shuffle(len(files), seed=seed)
    ds = ds.interleave(
        lambda f: tf.data.TFRecordDataset(f, compression_type="GZIP"),
        cycle_length=min(len(files), 4),
        num_parallel_calls=tf.data.AUTOTUNE,
        # In order even when shuffled: the seed alone fixes the order, so a run can be repeated
        # (tests/test_loss_curve.py); the input still outruns training hundreds of times over.
        deterministic=True,
    )
    if n_pipes > 1 and not shard_by_file:
        ds = ds.shard(n_pipes, pipe_id)
    if shuffle:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    ds = ds.batch(batch_size, drop_remainder=True)
    ds = ds.map(lambda r: _parse_batch(r, seq_len), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


def _parse_batch(records: tf.Tensor, seq_len: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Serialized Examples (B,) -> inputs (B, T), targets (B, T)."""
    features = {"input_ids": tf.io.FixedLenFeature([seq_len + 1], tf.int64)}
    ids = tf.cast(tf.io.parse_example(records, features)["input_ids"], tf.int32)  # (B, T+1)
    return ids[:, :-1], ids[:, 1:]


class DistributedData(NamedTuple):
    """The datasets `fit` reads under a strategy; `eval` is None when validation is off."""

    train: tf.distribute.DistributedDataset  # repeated and shuffled, per-replica batches
    eval: tf.distribute.DistributedDataset | None  # the same eval_steps batches every time
    eval_steps: int  # validation batches per run; 0 when the eval split is under one batch


def distributed_datasets(
    strategy: tf.distribute.Strategy,
    examples_dir: str,
    manifest: dict[str, Any],
    cfg: Config,
    skip_steps: int = 0,
) -> DistributedData:
    """The train and eval splits, each worker reading its part; eval is off under one batch.

    Each worker first checks the shards it reads (`verify_shards`): a damaged one stops it with
    a CorruptShardError naming the file, before any step. A run resumed at step N passes
    `skip_steps=N`: each worker's training input skips the batches its replicas took in those N
    steps, so the resumed run sees the data an uninterrupted one would (the seed fixes the order).
    """
    t = cfg.train
    train_files = split_files(examples_dir, manifest, "train")

    def train_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        verify_shards(examples_dir, pipeline_files(train_files, ctx))
        # A step takes one batch per local replica from this worker's pipeline.
        per_step = ctx.num_replicas_in_sync // ctx.num_input_pipelines
        return train_dataset(train_files, cfg, ctx).skip(skip_steps * per_step)

    train_ds = strategy.distribute_datasets_from_function(train_fn)
    global_batch = config_lib.global_batch_size(t.batch_size, strategy.num_replicas_in_sync)
    eval_windows = manifest["splits"].get("eval", {}).get("windows", 0)
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
        verify_shards(examples_dir, pipeline_files(eval_files, ctx))
        return make_dataset(eval_files, cfg.model.seq_len, t.batch_size, input_context=ctx).take(
            eval_steps * ctx.num_replicas_in_sync // ctx.num_input_pipelines
        )

    return DistributedData(
        train_ds, strategy.distribute_datasets_from_function(eval_fn), eval_steps
    )


def train_dataset(
    train_files: Sequence[str], cfg: Config, ctx: tf.distribute.InputContext | None = None
) -> tf.data.Dataset:
    """The training input as `fit` consumes it: shuffled with the config's seed, repeated."""
    t = cfg.train
    return make_dataset(
        train_files,
        cfg.model.seq_len,
        t.batch_size,
        shuffle=True,
        seed=t.seed,
        shuffle_buffer=t.shuffle_buffer,
        repeat=True,
        input_context=ctx,
    )
