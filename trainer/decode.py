"""Generation: a batch of prompts continued together, with a key/value cache.

The exported `generate` (trainer/export.py) calls `generate_ids`. All rows of a batch advance
together, one position per loop step, as KerasHub's `CausalLM.generate` decodes: a row whose
prompt is longer than the shortest takes its own prompt token at a position rather than a
sampled one, and what each row adds is masked out of the buffer at the end. Positions below
the shortest prompt are prefilled in one forward pass.

For a gptpipe GPT (trainer/model.py) each step runs one position through the blocks with the
keys and values of the earlier positions kept per layer (the cache: (B, H, L, hd) each, L the
call's longest row, at most seq_len; its size is fixed for the loop, so the loop keeps its
shapes, and a short call reads a short cache). Once a row reaches seq_len tokens the context is
the last seq_len, whose positions shift at every step, so from there each step runs the model
over that window, as the uncached path always does; so does any other Keras model (B, T) ->
(B, T, V). The result is the uncached path's: greedy decoding takes the same tokens, and seeded
sampling draws each row's i-th token from the stream (seed, i), as `generate_uncached` does.

Only core TensorFlow ops: the graph stays loadable by TF Serving (components/servability.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tensorflow as tf
import tf_keras as keras

from trainer.model import Block, PositionEmbedding, TiedEmbedding


@dataclass(frozen=True)
class Sampling:
    """How `generate` samples: its inputs besides the prompts (scalar tensors)."""

    max_new_tokens: tf.Tensor  # int32: the most tokens to add to each prompt
    temperature: tf.Tensor  # float32: <= 0 is greedy
    seed: tf.Tensor | None  # int64: stateless sampling from it; None: the module's random state
    stop_at_eos: tf.Tensor  # bool: a row ends at the first EOS it samples


class Decoder:
    """Next-token logits of a model over a token buffer: cached for a gptpipe GPT, from the
    window of the last seq_len tokens for any model."""

    def __init__(self, model: keras.Model, seq_len: int) -> None:
        self.model = model
        self.seq_len = seq_len
        layers: dict[str, Any] = {layer.name: layer for layer in model.layers}
        self.blocks = [layer for layer in model.layers if isinstance(layer, Block)]
        self.wte: Any = layers.get("wte")
        self.wpe: Any = layers.get("wpe")
        self.ln_f: Any = layers.get("ln_f")
        self.cached = (
            isinstance(self.wte, TiedEmbedding)
            and bool(self.blocks)
            and self.ln_f is not None
            and (self.wpe is None or isinstance(self.wpe, PositionEmbedding))
        )

    def cache_shapes(self) -> list[tf.TensorShape]:
        """The cache's shapes: keys and values for every block, each (B, H, L, hd)."""
        if not self.cached:
            return []
        shapes = []
        for block in self.blocks:
            h = block.n_head
            shapes += [tf.TensorShape([None, h, None, block.d_model // h])] * 2
        return shapes

    def empty_cache(self, batch: tf.Tensor, length: tf.Tensor) -> list[tf.Tensor]:
        """Zeroed keys and values for every block (`cache_shapes`), `length` positions."""
        return [
            tf.zeros(tf.stack([batch, s[1], length, s[3]]), tf.float32) for s in self.cache_shapes()
        ]

    def window(self, tokens: tf.Tensor, end: tf.Tensor) -> tf.Tensor:
        """Logits (B, V) for position `end` from the seq_len tokens before it (fewer at the
        start), as the uncached path computes them."""
        context = tokens[:, tf.maximum(end - self.seq_len, 0) : end]  # (B, T<=seq_len)
        return tf.cast(self.model(context, training=False)[:, -1], tf.float32)

    def prefill(self, tokens: tf.Tensor, length: tf.Tensor) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """tokens (B, T<=length) at positions 0..T-1 -> logits (B, V) for position T, and the
        cache of `length` (<= seq_len) positions with their keys and values."""
        t = tf.shape(tokens)[1]
        x = self._embed(tokens, 0)  # (B, T, C)
        causal = tf.linalg.band_part(tf.ones((t, t), x.dtype), -1, 0)
        cache = []
        for block in self.blocks:
            q, k, v = block.attn.heads(block.ln_1(x))  # each (B, H, T, hd)
            x = x + block.attn.merge(block.attn.attend(q, k, v, causal))
            x = x + block.mlp(x)
            pad = [[0, 0], [0, 0], [0, length - t], [0, 0]]
            cache += [tf.pad(k, pad), tf.pad(v, pad)]  # (B, H, L, hd) each
        return self._logits(x[:, -1:]), cache

    def step(
        self, token: tf.Tensor, position: tf.Tensor, cache: list[tf.Tensor]
    ) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """token (B,) at `position` (< the cache's length) -> logits (B, V) for the next
        position, and the cache with its keys and values added."""
        x = self._embed(token[:, tf.newaxis], position)  # (B, 1, C)
        b = tf.shape(token)[0]
        heads = self.blocks[0].n_head  # every block's: the model's n_head
        bi, hi = tf.meshgrid(tf.range(b), tf.range(heads), indexing="ij")  # (B, H) each
        at = tf.stack([bi, hi, tf.fill(tf.shape(bi), position)], axis=-1)  # (B, H, 3)
        length = tf.shape(cache[0])[2]
        visible = tf.cast(tf.range(length) <= position, x.dtype)[tf.newaxis]  # (1, L)
        new_cache = []
        for i, block in enumerate(self.blocks):
            q, k, v = block.attn.heads(block.ln_1(x), start=position)  # each (B, H, 1, hd)
            # A scatter, not a one-hot sum over the cache: TensorFlow updates the buffer in
            # place when nothing else holds it (measured 1.2x at batch 8, bench/generate_bench).
            keys = tf.tensor_scatter_nd_update(cache[2 * i], at, k[:, :, 0])  # (B, H, L, hd)
            values = tf.tensor_scatter_nd_update(cache[2 * i + 1], at, v[:, :, 0])
            x = x + block.attn.merge(block.attn.attend(q, keys, values, visible))
            x = x + block.mlp(x)
            new_cache += [keys, values]
        return self._logits(x), new_cache

    def _embed(self, ids: tf.Tensor, start: Any) -> tf.Tensor:
        """ids (B, T) at positions start.. -> (B, T, C), as the model's first layers."""
        x = self.wte(ids)  # (B, T, C)
        if self.wpe is not None:
            positions = self.wpe.positions[start : start + tf.shape(ids)[1]]  # (T, C)
            x += tf.cast(positions, x.dtype)[tf.newaxis]
        return x

    def _logits(self, x: tf.Tensor) -> tf.Tensor:
        """The last blocks' output (B, 1, C) -> float32 logits (B, V)."""
        return tf.cast(self.wte(self.ln_f(x), reverse=True)[:, 0], tf.float32)


def generate_ids(
    decoder: Decoder, prompts: tf.Tensor, lengths: tf.Tensor, s: Sampling, eos_id: int
) -> tf.RaggedTensor:
    """Continue every prompt (prompts (B, P) int32, padded; lengths (B,) >= 1) by up to
    max_new_tokens ids each, fewer for a row that samples EOS when `s.stop_at_eos` (the EOS left
    out) -> the new ids, ragged (B, None)."""
    # An empty batch decodes to nothing: its bounds are 1 (not the int32 extremes), and the
    # loop, whose every row has finished, never runs.
    bounds = tf.concat([lengths, [1]], axis=0)
    first = tf.where(tf.size(lengths) > 0, tf.reduce_min(lengths), 1)
    longest = tf.reduce_max(bounds)
    ends = lengths + s.max_new_tokens  # (B,): a row's buffer ends here
    width = longest + s.max_new_tokens
    tokens = tf.pad(prompts, [[0, 0], [0, width - tf.shape(prompts)[1]]])  # (B, W)
    kept = tf.zeros_like(tokens, tf.bool)  # (B, W): the ids a row adds
    logits, cache = _start(decoder, tokens, first)
    ended = tf.zeros_like(lengths, tf.bool)  # (B,): sampled EOS, with stop_at_eos

    def body(p, tokens, kept, ended, logits, cache):  # type: ignore[no-untyped-def]
        generating = (p >= lengths) & (p < ends) & tf.logical_not(ended)  # (B,)
        chosen = _choose(logits, p - lengths, s)  # (B,)
        eos = tf.logical_and(s.stop_at_eos, tf.equal(chosen, eos_id))
        ended = tf.logical_or(ended, tf.logical_and(generating, eos))
        column = tf.equal(tf.range(width), p)[tf.newaxis]  # (1, W)
        token = tf.where(p < lengths, tokens[:, p], chosen)  # a prompt's own, else sampled
        tokens = tf.where(column, token[:, tf.newaxis], tokens)
        adds = tf.logical_and(generating, tf.logical_not(ended))
        kept = tf.logical_or(kept, tf.logical_and(column, adds[:, tf.newaxis]))
        logits, cache = _next(decoder, tokens, p, cache, logits, p + 1 < width)
        return p + 1, tokens, kept, ended, logits, cache

    def more(p, tokens, kept, ended, logits, cache):  # type: ignore[no-untyped-def]
        finished = tf.logical_or(ended, p >= ends)
        return tf.logical_and(p < width, tf.logical_not(tf.reduce_all(finished)))

    state = (first, tokens, kept, ended, logits, cache)
    matrix = tf.TensorShape([None, None])
    invariants = (
        tf.TensorShape([]),
        matrix,
        matrix,
        tf.TensorShape([None]),
        matrix,
        decoder.cache_shapes(),
    )
    _, tokens, kept, *_ = tf.while_loop(
        more, body, state, shape_invariants=invariants, parallel_iterations=1
    )
    return tf.ragged.boolean_mask(tokens, kept)


def _start(decoder: Decoder, tokens: tf.Tensor, first: tf.Tensor) -> tuple[tf.Tensor, Any]:
    """Logits for position `first` and the cache of the positions before it."""
    if not decoder.cached:
        return decoder.window(tokens, first), []
    batch = tf.shape(tokens)[0]
    length = tf.minimum(tf.shape(tokens)[1], decoder.seq_len)  # the positions ever cached
    return tf.cond(
        first <= decoder.seq_len,
        lambda: decoder.prefill(tokens[:, :first], length),
        lambda: (decoder.window(tokens, first), decoder.empty_cache(batch, length)),
    )


def _next(
    decoder: Decoder,
    tokens: tf.Tensor,
    p: tf.Tensor,
    cache: Any,
    logits: tf.Tensor,
    needed: tf.Tensor,
) -> tuple[tf.Tensor, Any]:
    """Logits for position p + 1, the id at p now in `tokens`; when not `needed` (the last
    position), the ones given, unchanged."""

    def windowed() -> tuple[tf.Tensor, Any]:
        return decoder.window(tokens, p + 1), cache

    def compute() -> tuple[tf.Tensor, Any]:
        if not decoder.cached:
            return windowed()
        return tf.cond(p < decoder.seq_len, lambda: decoder.step(tokens[:, p], p, cache), windowed)

    return tf.cond(needed, compute, lambda: (logits, cache))


def _choose(logits: tf.Tensor, index: tf.Tensor, s: Sampling) -> tf.Tensor:
    """The next id of each row (B,): greedy at temperature <= 0, else sampled; `index` (B,) is
    the row's count of ids added so far, its stream with a seed."""
    temperature = s.temperature

    def sample() -> tf.Tensor:
        scaled = logits / tf.maximum(temperature, 1e-6)  # (B, V)
        if s.seed is None:
            return tf.cast(tf.random.categorical(scaled, 1)[:, 0], tf.int32)

        def row(args: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
            row_logits, i = args
            pair = tf.stack([s.seed, tf.cast(i, tf.int64)])  # one stream per position
            return tf.random.stateless_categorical(row_logits[tf.newaxis], 1, pair)[0, 0]

        drawn = tf.map_fn(row, (scaled, index), fn_output_signature=tf.int64)
        return tf.cast(drawn, tf.int32)

    return tf.cond(
        temperature <= 0.0, lambda: tf.argmax(logits, axis=-1, output_type=tf.int32), sample
    )


def prompt_ids(ids: tf.RaggedTensor, newline: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Tokenized prompts, ragged (B, None) -> padded (B, P) and lengths (B,), an empty prompt
    replaced by the ids of a newline (1-D), which starts a line as a document would."""
    lengths = tf.cast(ids.row_lengths(), tf.int32)
    dense = ids.to_tensor(default_value=0)  # (B, P0)
    width = tf.maximum(tf.shape(dense)[1], tf.size(newline))
    dense = tf.pad(dense, [[0, 0], [0, width - tf.shape(dense)[1]]])  # (B, P)
    padded_newline = tf.pad(newline, [[0, width - tf.size(newline)]])  # (P,)
    empty = tf.equal(lengths, 0)
    dense = tf.where(empty[:, tf.newaxis], padded_newline[tf.newaxis], dense)
    return dense, tf.where(empty, tf.size(newline), lengths)


def generate_uncached(
    model: keras.Model,
    seq_len: int,
    ids: tf.RaggedTensor,
    newline: tf.Tensor,
    s: Sampling,
    eos_id: int,
) -> tf.RaggedTensor:
    """`generate_ids` as it was before the cache, kept as the reference its tests compare with:
    one row at a time, the model run over the whole context (the last seq_len ids) for every
    new id. ids: the prompts, ragged (B, None) int32 -> the new ids, ragged (B, None)."""

    def row(prompt: tf.Tensor) -> tf.Tensor:
        prompt = tf.cond(tf.size(prompt) > 0, lambda: prompt, lambda: newline)
        n_prompt = tf.size(prompt)

        def step(i, tokens, _):  # type: ignore[no-untyped-def]
            context = tokens[-seq_len:][tf.newaxis]  # (1, T<=seq_len)
            logits = tf.cast(model(context, training=False)[:, -1], tf.float32)  # (1, V)
            next_id = _choose(logits, i[tf.newaxis], s)[0]
            ended = tf.logical_and(s.stop_at_eos, tf.equal(next_id, eos_id))
            grown = tf.cond(
                ended, lambda: tokens, lambda: tf.concat([tokens, next_id[tf.newaxis]], axis=0)
            )
            return i + 1, grown, ended

        _, tokens, _ = tf.while_loop(
            lambda i, _, ended: tf.logical_and(i < s.max_new_tokens, tf.logical_not(ended)),
            step,
            (tf.constant(0), prompt, tf.constant(False)),
            shape_invariants=(tf.TensorShape([]), tf.TensorShape([None]), tf.TensorShape([])),
        )
        return tokens[n_prompt:]

    return tf.map_fn(
        row, ids, fn_output_signature=tf.RaggedTensorSpec(shape=[None], dtype=tf.int32)
    )
