"""Export a trained GPT: the Model artifact, whose SavedModel has the tokenizer in its graph.

Signatures (the contract in docs/design.md):
  generate(prompt string[B], max_new_tokens int32[], temperature float32[], stop_at_eos bool[])
    -> {"completion"}
  generate_seeded(prompt, max_new_tokens, temperature, seed int64[], stop_at_eos) -> the same
  score(text string[B]) -> {"nats", "tokens", "chars", "nats_per_token", "nats_per_char"}
  serving_default = generate
The Model artifact holds the SavedModel, the resolved config and the train metrics
(contracts.artifacts: SERVING_DIR, MODEL_CONFIG, TRAIN_METRICS), written to a temp sibling and
renamed into place, then marked complete (MODEL_COMPLETE). The SavedModel also carries the
training curve (TRAIN_HISTORY, under assets.extra/, which TF Serving ignores), so that a served
model brings it to the next run's evaluation as its baseline.

What is atomic where. On local disk, renaming a folder is atomic: the Model appears whole at
its path or not at all. On GCS there are no folders, only objects named with slashes, and
TensorFlow's file system renames a folder one object at a time: a copy (`rewriteTo`) and a
delete per object (tsl/platform/cloud/gcs_file_system.cc, `RenameFile`). A reader listing the
Model meanwhile sees part of it, and a writer that dies midway leaves part of it under each
name. What GCS makes atomic is one object: it appears whole when its upload finishes, or not at
all, and every read and listing after that sees it. So the Model is published by one object
written last: MODEL_COMPLETE, once the rest is in place, and it is the first thing removed when
a Model is replaced. Every reader requires it and refuses a Model without it
(components/model_artifact.py); none needs to wait for it, since each starts after the worker
that wrote the Model has exited. TensorFlow also leaves an empty `<folder>/` object for each
folder it creates, the temp sibling's among them (moved with it); the train step removes them.
"""

from __future__ import annotations

import functools
import json
import posixpath
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import sentencepiece as spm
import tensorflow as tf
import tensorflow_text as tf_text
import tf_keras as keras

from contracts.artifacts import (
    MODEL_COMPLETE,
    MODEL_CONFIG,
    SERVING_DIR,
    TRAIN_HISTORY,
    TRAIN_METRICS,
    WORKER_MODEL_SCRATCH_PREFIX,
)
from contracts.training import TrainMetrics, metrics_json
from trainer import config as config_lib
from trainer import decode, model
from trainer.config import Config
from trainer.history import TrainHistory

SCORE_CHUNK = 8  # windows per forward pass in score(), bounding its memory


class GPTServing(tf.Module):
    """The model plus its SentencePiece tokenizer, with tf.function serving signatures."""

    def __init__(self, model: keras.Model, seq_len: int, tokenizer_model_path: str) -> None:
        super().__init__(name="gpt_serving")
        self.model = model
        self.seq_len = seq_len
        self.tokenizer_asset = tf.saved_model.Asset(tokenizer_model_path)
        with tf.io.gfile.GFile(tokenizer_model_path, "rb") as f:
            proto = f.read()
        self.tokenizer = tf_text.SentencepieceTokenizer(model=proto)
        # Tokenize ends every document with it; -1 (a tokenizer without one) never stops.
        self.eos_id = spm.SentencePieceProcessor(model_proto=proto).eos_id()
        self.decoder = decode.Decoder(model, seq_len)

    @tf.function(
        input_signature=[
            tf.TensorSpec([None], tf.string, name="prompt"),
            tf.TensorSpec([], tf.int32, name="max_new_tokens"),
            tf.TensorSpec([], tf.float32, name="temperature"),
            tf.TensorSpec([], tf.bool, name="stop_at_eos"),
        ]
    )
    def generate(
        self,
        prompt: tf.Tensor,
        max_new_tokens: tf.Tensor,
        temperature: tf.Tensor,
        stop_at_eos: tf.Tensor,
    ) -> dict[str, tf.Tensor]:
        """Continue each prompt by max_new_tokens tokens; returns the continuation only.

        With `stop_at_eos`, a row ends at the first EOS it samples (the document's end), which
        the continuation leaves out; without, it continues through EOS into a new document.
        Sampling draws from the SavedModel's own random state: a freshly loaded model starts
        it where the export left it. `generate_seeded` samples from a seed instead.
        """
        return self._generate(prompt, max_new_tokens, temperature, None, stop_at_eos)

    @tf.function(
        input_signature=[
            tf.TensorSpec([None], tf.string, name="prompt"),
            tf.TensorSpec([], tf.int32, name="max_new_tokens"),
            tf.TensorSpec([], tf.float32, name="temperature"),
            tf.TensorSpec([], tf.int64, name="seed"),
            tf.TensorSpec([], tf.bool, name="stop_at_eos"),
        ]
    )
    def generate_seeded(
        self,
        prompt: tf.Tensor,
        max_new_tokens: tf.Tensor,
        temperature: tf.Tensor,
        seed: tf.Tensor,
        stop_at_eos: tf.Tensor,
    ) -> dict[str, tf.Tensor]:
        """`generate` with stateless sampling: the same seed gives the same continuation."""
        return self._generate(prompt, max_new_tokens, temperature, seed, stop_at_eos)

    def _generate(
        self,
        prompt: tf.Tensor,
        max_new_tokens: tf.Tensor,
        temperature: tf.Tensor,
        seed: tf.Tensor | None,
        stop_at_eos: tf.Tensor,
        cached: bool = True,
    ) -> dict[str, tf.Tensor]:
        """The batch decoded together with a key/value cache (trainer/decode.py), or without
        one (`cached` False). A negative max_new_tokens is refused (an InvalidArgument error,
        which TF Serving answers with HTTP 400)."""
        # A server that checks no shapes (TF Serving) passes a row-form request's inputs as
        # [rows]: refused here, naming the input, rather than deep in the loop.
        max_new_tokens, temperature, stop_at_eos = (
            _one_value(name, value)
            for name, value in (
                ("max_new_tokens", max_new_tokens),
                ("temperature", temperature),
                ("stop_at_eos", stop_at_eos),
            )
        )
        seed = None if seed is None else _one_value("seed", seed)
        checks = [
            tf.debugging.assert_non_negative(
                max_new_tokens, message="max_new_tokens must be 0 or more"
            )
        ]
        with tf.control_dependencies(checks):
            ids = tf.cast(self.tokenizer.tokenize(prompt), tf.int32)  # ragged (B, None)
        newline = tf.cast(self.tokenizer.tokenize("\n"), tf.int32)  # seeds an empty prompt
        sampling = decode.Sampling(max_new_tokens, temperature, seed, stop_at_eos)
        if cached:
            prompts, lengths = decode.prompt_ids(ids, newline)
            new_ids = decode.generate_ids(self.decoder, prompts, lengths, sampling, self.eos_id)
        else:
            new_ids = decode.generate_uncached(
                self.model, self.seq_len, ids, newline, sampling, self.eos_id
            )
        return {"completion": self.tokenizer.detokenize(new_ids)}

    # `generate` as it was before the cache (decode.generate_uncached): not exported, kept as
    # the reference for tests and the benchmark; `_generate`'s inputs.
    generate_uncached = functools.partialmethod(_generate, cached=False)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def score(self, text: tf.Tensor) -> dict[str, tf.Tensor]:
        """Summed next-token loss (nats) of each string, over windows of seq_len + 1.

        Each string is scored as (part of) one document: text never tokenizes to EOS (a
        SentencePiece control symbol: "</s>" is its characters), so no string spans the end of
        one document and the start of the next as the model trained on them, and none is
        charged for the EOS that ends it. Evaluate scores each document's strings apart.
        """
        ids = tf.cast(self.tokenizer.tokenize(text), tf.int32)  # ragged (B, None)
        windows, mask = self._windows(ids)  # (B, W, T+1) each
        b, w = tf.shape(windows)[0], tf.shape(windows)[1]
        flat = tf.reshape(windows, (-1, self.seq_len + 1))  # (N, T+1)
        flat_mask = tf.reshape(mask, (-1, self.seq_len + 1))
        nats = tf.reshape(self._window_nats(flat, flat_mask), (b, w))  # (B, W)
        nats = tf.reduce_sum(nats, axis=1)  # (B,)
        tokens = tf.maximum(tf.cast(ids.row_lengths(), tf.int32) - 1, 0)  # (B,)
        chars = tf.strings.length(text, unit="UTF8_CHAR")  # (B,)
        return {
            "nats": nats,
            "tokens": tokens,
            "chars": chars,
            "nats_per_token": nats / tf.cast(tf.maximum(tokens, 1), tf.float32),
            "nats_per_char": nats / tf.cast(tf.maximum(chars, 1), tf.float32),
        }

    def _windows(self, ids: tf.RaggedTensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Ragged ids (B, None) -> windows and validity mask (B, W, T+1), stride seq_len."""
        t = self.seq_len
        length = tf.maximum(tf.cast(ids.bounding_shape()[1], tf.int32), t + 1)
        dense = ids.to_tensor(default_value=0)  # (B, L0)
        valid = tf.sequence_mask(ids.row_lengths(), dtype=tf.int32)  # (B, L0)
        pad = [[0, 0], [0, length - tf.shape(dense)[1]]]
        dense, valid = tf.pad(dense, pad), tf.pad(valid, pad)  # (B, L)
        windows = tf.signal.frame(dense, t + 1, t, pad_end=True, axis=1)  # (B, W, T+1)
        mask = tf.signal.frame(valid, t + 1, t, pad_end=True, axis=1)
        return windows, mask

    def _window_nats(self, windows: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
        """Summed masked next-token loss of each window: (N, T+1) -> (N,), in chunks."""
        n = tf.shape(windows)[0]
        padded_n = (n + SCORE_CHUNK - 1) // SCORE_CHUNK * SCORE_CHUNK
        windows = tf.pad(windows, [[0, padded_n - n], [0, 0]])
        mask = tf.pad(mask, [[0, padded_n - n], [0, 0]])
        chunks = tf.reshape(windows, (-1, SCORE_CHUNK, self.seq_len + 1))  # (N/C, C, T+1)
        mchunks = tf.reshape(mask, (-1, SCORE_CHUNK, self.seq_len + 1))

        def chunk_nats(args: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
            win, m = args  # (C, T+1) each
            logits = tf.cast(self.model(win[:, :-1], training=False), tf.float32)  # (C, T, V)
            loss = tf.nn.sparse_softmax_cross_entropy_with_logits(win[:, 1:], logits)  # (C, T)
            return tf.reduce_sum(loss * tf.cast(m[:, 1:], tf.float32), axis=1)  # (C,)

        nats = tf.map_fn(
            chunk_nats,
            (chunks, mchunks),
            fn_output_signature=tf.TensorSpec([SCORE_CHUNK], tf.float32),
        )
        return tf.reshape(nats, (-1,))[:n]  # (N,)


def _one_value(name: str, value: tf.Tensor) -> tf.Tensor:
    """`value`, checked when run to be a scalar (EnsureShape: a static check would pass, the
    signature says [], and grappler drops a reshape to []); the error names the input."""
    with tf.name_scope(f"{name}_must_be_a_scalar"):
        return tf.ensure_shape(value, [])


class ExportFailed(Exception):
    """Writing the Model failed after training; the backup is kept, so a restart only exports."""


def export_model(
    keras_model: keras.Model,
    cfg: Config,
    tokenizer_model_path: str,
    export_dir: str,
    history: TrainHistory | None = None,
    extras: Mapping[str, str] | None = None,
) -> str:
    """Write the serving SavedModel to export_dir through a temp sibling and a rename (atomic on
    local disk only: module docstring), with what `save_serving` adds."""
    export_dir = export_dir.rstrip("/")
    tmp = _temp_sibling(export_dir)
    try:
        save_serving(keras_model, cfg, tokenizer_model_path, tmp, history, extras)
        _move_into_place(tmp, export_dir)
    finally:
        _remove_if_present(tmp)  # only left when the save failed
    return export_dir


def save_serving(
    keras_model: keras.Model,
    cfg: Config,
    tokenizer_model_path: str,
    saved_model_dir: str,
    history: TrainHistory | None = None,
    extras: Mapping[str, str] | None = None,
) -> None:
    """Save the serving SavedModel into `saved_model_dir` in place, with the training curve at
    TRAIN_HISTORY when there is one, and each file of `extras` (a path inside the SavedModel:
    the file to copy there; under assets.extra/, which TF Serving ignores)."""
    module = GPTServing(keras_model, cfg.model.seq_len, tokenizer_model_path)
    generate = module.generate.get_concrete_function()
    signatures = {
        "serving_default": generate,
        "generate": generate,
        "generate_seeded": module.generate_seeded.get_concrete_function(),
        "score": module.score.get_concrete_function(),
    }
    tf.saved_model.save(module, saved_model_dir, signatures=signatures)
    if history is not None:
        _write_history(history, saved_model_dir)
    for inside, source in (extras or {}).items():
        tf.io.gfile.makedirs(posixpath.dirname(posixpath.join(saved_model_dir, inside)))
        tf.io.gfile.copy(source, posixpath.join(saved_model_dir, inside))


def _write_history(history: TrainHistory, saved_model_dir: str) -> None:
    path = posixpath.join(saved_model_dir, TRAIN_HISTORY)
    tf.io.gfile.makedirs(posixpath.dirname(path))
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(history.to_json())


@dataclass(frozen=True)
class ModelParts:
    """What a Model artifact is made of: the trained network and what travels with it."""

    gpt: keras.Model  # the trained network (any precision policy: serving_model re-casts it)
    cfg: Config  # its resolved configuration, written as MODEL_CONFIG
    tokenizer_path: str  # the SentencePiece model the SavedModel embeds
    metrics: TrainMetrics  # written as TRAIN_METRICS
    history: TrainHistory | None = None  # the training curve (TRAIN_HISTORY), when there is one
    # files the SavedModel carries besides: a path inside it -> the file to copy there
    extras: Mapping[str, str] = field(default_factory=dict)


def write_model_artifact(parts: ModelParts, model_dir: str, work_dir: str, is_chief: bool) -> None:
    """Every worker exports the trained network (saving may need collectives); the chief writes
    the Model artifact to `model_dir`, the others into scratch space in `work_dir` they remove.

    Raises ExportFailed on a storage error (a TensorFlow OpError), which a restart can retry.
    """
    try:
        serving = replace(parts, gpt=serving_model(parts.gpt, parts.cfg))
        _write_for_role(serving, model_dir, work_dir, is_chief)
    except tf.errors.OpError as err:
        raise ExportFailed(str(err)) from err


def serving_model(gpt: keras.Model, cfg: Config) -> keras.Model:
    """The model to serve: `gpt`'s weights in a fresh float32 model of the same config.

    A SavedModel keeps the compute dtype it was traced with; float16 or bfloat16 matmuls are
    slow on CPU servers (and evaluate pods), and their noise would enter the blessing margin.
    Fresh even in float32: saving a Keras model traces its layers' training branch too, and the
    trained model's is the XLA-compiled GELU (model.xla_gelu), which a server must not need.
    """
    keras.mixed_precision.set_global_policy("float32")
    serving = model.build_gpt(cfg.model)
    serving.set_weights(gpt.get_weights())
    return serving


def _write_for_role(parts: ModelParts, model_dir: str, work_dir: str, is_chief: bool) -> None:
    """The chief writes `model_dir`; the others write scratch space in `work_dir` and remove it."""
    scratch = posixpath.join(work_dir, f"{WORKER_MODEL_SCRATCH_PREFIX}{uuid.uuid4().hex[:8]}")
    target = model_dir if is_chief else scratch
    try:
        write_model_dir(parts, target)
    finally:
        if not is_chief:
            _remove_if_present(target)


def write_model_dir(parts: ModelParts, model_dir: str) -> None:
    """Assemble the Model artifact in a temp sibling, move it into place, then mark it complete.

    MODEL_COMPLETE is removed first and written last (module docstring: on GCS the move is not
    atomic, and readers take a Model only with the marker). The SavedModel is saved straight
    into the temp sibling, already private: on GCS each rename copies every object once more.
    """
    model_dir = model_dir.rstrip("/")
    complete = posixpath.join(model_dir, MODEL_COMPLETE)
    if tf.io.gfile.exists(complete):
        tf.io.gfile.remove(complete)  # the Model being replaced is no longer complete
    tf.io.gfile.makedirs(posixpath.dirname(model_dir) or ".")
    tmp = _temp_sibling(model_dir)
    tf.io.gfile.makedirs(tmp)
    try:
        save_serving(
            parts.gpt,
            parts.cfg,
            parts.tokenizer_path,
            posixpath.join(tmp, SERVING_DIR),
            parts.history,
            parts.extras,
        )
        files = (
            (
                MODEL_CONFIG,
                json.dumps(config_lib.config_to_dict(parts.cfg), indent=2, sort_keys=True),
            ),
            (TRAIN_METRICS, metrics_json(parts.metrics)),
        )
        for fname, text in files:
            with tf.io.gfile.GFile(posixpath.join(tmp, fname), "w") as f:
                f.write(text)
        _move_into_place(tmp, model_dir)
    finally:
        _remove_if_present(tmp)  # a failed export leaves nothing a later step could read
    with tf.io.gfile.GFile(complete, "w") as f:
        f.write("")  # last: the Model is complete


def _temp_sibling(path: str) -> str:
    """A fresh hidden name beside `path` (`.<name>.tmp-<random>`), renamed to `path` when done."""
    parent, name = posixpath.split(path)
    return posixpath.join(parent, f".{name}.tmp-{uuid.uuid4().hex[:8]}")


def _move_into_place(tmp: str, path: str) -> None:
    """Replace whatever is at `path` with the complete folder `tmp`."""
    _remove_if_present(path)
    tf.io.gfile.rename(tmp, path)


def _remove_if_present(path: str) -> None:
    if tf.io.gfile.exists(path):
        tf.io.gfile.rmtree(path)
