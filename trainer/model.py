"""A decoder-only GPT in tf-keras, in one readable file (after nanoGPT's model.py).

ids (B, T) -> token + learned position embeddings -> n_layer pre-LayerNorm blocks (causal
self-attention, GELU MLP) -> final LayerNorm -> logits (B, T, V) through the tied token
embedding matrix. Logits are float32 even under a mixed-precision policy. With
`model.position=rotary` there is no position table: each block rotates its queries and keys by
position instead (RoPE, `rotate`).

Every Dense layer gets a 2-D input, (B*T, C): Keras runs a 3-D input through `tensordot`, whose
reshape falls between the MatMul and the BiasAdd, so grappler cannot fuse MatMul and BiasAdd
into one oneDNN kernel (`_FusedMatMul`) as it does for 2-D. The reshapes copy nothing; the
train step measured 2-3% faster, with the same loss to the last digit. The tied output
projection is a 2-D matmul too (`TiedEmbedding.call`).

Three choices below are for speed, measured by interleaved A/B of the train step at the 4-layer
d_model 512 benchmark shape (bench/peer_bench.py) on a 2-core CPU, with the loss unchanged to the
fourth decimal: GELU is written with `erf` (`gelu`), and attention's scores and softmax stay in
the compute dtype, their mask added (`CausalSelfAttention.call`): together +11-13% in
mixed_bfloat16, +5% in float32. Then in training GELU runs as one XLA-fused kernel each way
(`xla_gelu`): +4-6% in mixed_bfloat16, +2% in float32.
"""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf
import tf_keras as keras

from trainer import recompute
from trainer.config import ModelConfig


def _init(std: float) -> keras.initializers.Initializer:
    return keras.initializers.RandomNormal(stddev=std)


@keras.saving.register_keras_serializable(package="gptpipe")
def gelu(x: tf.Tensor) -> tf.Tensor:
    """Exact GELU, x * Phi(x), written as 0.5 * x * (1 + erf(x / sqrt(2))).

    The same function as `tf.nn.gelu(x, approximate=False)`, which writes it with `erfc`. On CPU,
    TensorFlow's `Erfc` kernel is not vectorised: 10-17x slower than `Erf` on the same tensor, and
    the backward pass runs it on every (B*T, d_ff) activation, 7% of the train step at the
    benchmark shape. Through `erf` it is not: the step gets 4% (float32) to 8% (bfloat16) faster.
    (In training neither form fuses into the MatMul: the backward pass needs the intermediate
    values.) Largest difference from the erfc form: 5e-7 in float32; in bfloat16 both
    forms are within the type's rounding (max 0.008 on [-6, 6], as is rounding the exact value).
    """
    return 0.5 * x * (1.0 + tf.math.erf(x * tf.cast(1.0 / math.sqrt(2.0), x.dtype)))


@tf.function(jit_compile=True)
def _xla_gelu_forward(x: tf.Tensor) -> tf.Tensor:
    return tf.cast(gelu(tf.cast(x, tf.float32)), x.dtype)


@tf.function(jit_compile=True)
def _xla_gelu_backward(x: tf.Tensor, dy: tf.Tensor) -> tf.Tensor:
    h = tf.cast(x, tf.float32)
    cdf = 0.5 * (1.0 + tf.math.erf(h * (1.0 / math.sqrt(2.0))))  # Phi(x)
    pdf = tf.exp(-0.5 * tf.square(h)) * (1.0 / math.sqrt(2.0 * math.pi))  # phi(x)
    return tf.cast(tf.cast(dy, tf.float32) * (cdf + h * pdf), x.dtype)  # d(x Phi(x))/dx


@tf.custom_gradient
def xla_gelu(x: tf.Tensor) -> tuple[tf.Tensor, Any]:
    """`gelu` for the train step: forward and backward each one XLA-fused loop, in float32.

    Unfused, GELU is 5 TensorFlow ops forward and about 12 backward, each a pass over the
    (B*T, d_ff) activations in memory; fused, each direction reads its inputs once and writes
    once, while the matmuls around it stay with oneDNN (XLA over the whole step is slower on
    CPU: config.use_jit_compile). The gradient, Phi(x) + x phi(x), is written out: autodiff
    through a compiled forward measured slower. It computes in float32 whatever the input
    (measured faster than in bfloat16) and rounds once, so under mixed_bfloat16 it is at least
    as exact as `gelu`. Train step at the 4-layer d_model 512 benchmark shape, 2 CPU cores:
    +4-6% in mixed_bfloat16, +2% in float32; at the `tiny` preset, +10%.
    """

    def grad(dy: tf.Tensor) -> tf.Tensor:
        return _xla_gelu_backward(x, dy)

    return _xla_gelu_forward(x), grad


class TiedEmbedding(keras.layers.Layer):
    """Token embedding whose matrix also projects hidden states back to vocabulary logits.

    `call(ids)` embeds (B, T) -> (B, T, C); `call(h, reverse=True)` gives logits (B, T, V).
    """

    def __init__(
        self, vocab_size: int, d_model: int, init_std: float = 0.02, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.init_std = init_std

    def build(self, input_shape: tf.TensorShape) -> None:
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocab_size, self.d_model),
            initializer=_init(self.init_std),
        )
        super().build(input_shape)

    def call(self, inputs: tf.Tensor, reverse: bool = False) -> tf.Tensor:
        if reverse:
            # As a 2-D matmul, (B*T, C) x (C, V), like the Dense layers (module docstring):
            # on (B, T, C) tf.matmul broadcasts the matrix into a BatchMatMulV2, whose forward
            # and backward took 127 ms against 101 ms at the benchmark shape (B*T 2048, C 512,
            # V 2048; 2-core AVX2 CPU): 1.3% of the train step, under what step timings on a
            # shared host resolve. The same products either way.
            w = tf.cast(self.embeddings, self.compute_dtype)
            b, t = tf.shape(inputs)[0], tf.shape(inputs)[1]
            logits = tf.matmul(tf.reshape(inputs, (-1, self.d_model)), w, transpose_b=True)
            return tf.reshape(logits, (b, t, self.vocab_size))  # (B, T, V)
        return tf.gather(tf.cast(self.embeddings, self.compute_dtype), inputs)  # (B, T, C)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "vocab_size": self.vocab_size,
            "d_model": self.d_model,
            "init_std": self.init_std,
        }


def _check_window(x: tf.Tensor, seq_len: int, limit: str) -> tf.Tensor:
    """x (B, T, ...), refused if T > seq_len: when traced if T is static, else when run (what
    comes of the returned tensor waits for the check, which a graph might otherwise run after
    an op that fails on the length first)."""
    t = x.shape[1]
    if t is not None and t > seq_len:
        raise ValueError(
            f"input window of {t} tokens is longer than {limit} (seq_len={seq_len}); "
            f"crop the input to the last {seq_len} tokens"
        )
    check = tf.debugging.assert_less_equal(
        tf.shape(x)[1], seq_len, message=f"input window is longer than {limit} (seq_len={seq_len})"
    )
    with tf.control_dependencies([check] if check is not None else []):  # None: eager, passed
        return tf.identity(x)


class ContextLimit(keras.layers.Layer):
    """Passes x through, refusing windows longer than seq_len: a rotary model has no table to
    refuse them, and past the trained length its positions are untrained."""

    def __init__(self, seq_len: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seq_len = seq_len

    def call(self, x: tf.Tensor) -> tf.Tensor:
        return _check_window(x, self.seq_len, "the context window")

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "seq_len": self.seq_len}


class PositionEmbedding(keras.layers.Layer):
    """Adds a learned position vector to each of the first T positions; T must be <= seq_len."""

    def __init__(self, seq_len: int, d_model: int, init_std: float = 0.02, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seq_len = seq_len
        self.d_model = d_model
        self.init_std = init_std

    def build(self, input_shape: tf.TensorShape) -> None:
        self.positions = self.add_weight(
            name="positions", shape=(self.seq_len, self.d_model), initializer=_init(self.init_std)
        )
        super().build(input_shape)

    def call(self, x: tf.Tensor) -> tf.Tensor:
        x = _check_window(x, self.seq_len, "the position table")
        return x + tf.cast(self.positions[: tf.shape(x)[1]], x.dtype)[tf.newaxis]  # (B, T, C)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "seq_len": self.seq_len,
            "d_model": self.d_model,
            "init_std": self.init_std,
        }


def rotate(x: tf.Tensor, base: float = 10000.0, start: Any = 0) -> tf.Tensor:
    """Rotary position embedding (RoPE; Su et al. 2021, as GPT-NeoX and LLaMA apply it).

    x is (B, H, T, hd) queries or keys at positions start, ..., start + T - 1; the pair
    (x[i], x[i + hd/2]) of position t turns by the angle t * base^(-2i/hd). A query's and a
    key's dot product then depends on their positions through t_q - t_k only. The angles are
    computed in float32 (in bfloat16, t * freq would lose the position past t = 256) and their
    cos and sin cast to x's dtype.
    """
    t, hd = tf.shape(x)[2], x.shape[-1]
    freq = base ** (-tf.range(0, hd, 2, dtype=tf.float32) / hd)  # (hd/2,)
    positions = tf.cast(tf.range(t) + start, tf.float32)  # (T,)
    angle = positions[:, tf.newaxis] * freq  # (T, hd/2)
    cos, sin = tf.cast(tf.cos(angle), x.dtype), tf.cast(tf.sin(angle), x.dtype)
    x1, x2 = tf.split(x, 2, axis=-1)  # each (B, H, T, hd/2)
    return tf.concat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def seeded_dropout(
    layer: keras.layers.Dropout, x: tf.Tensor, training: bool | None, seed: Any
) -> tf.Tensor:
    """`layer(x)`, or given a seed ((2,) int32), stateless dropout at the layer's rate: the same
    seed drops the same units, which a recomputed block needs (trainer/recompute.py)."""
    if seed is None:
        return layer(x, training=training)
    if layer.rate == 0:
        return x
    return tf.nn.experimental.stateless_dropout(x, layer.rate, seed)


class CausalSelfAttention(keras.layers.Layer):
    """Multi-head self-attention where position t attends to positions <= t only; `rotary`:
    queries and keys rotated by their positions first (`rotate`)."""

    def __init__(
        self,
        d_model: int,
        n_head: int,
        dropout: float = 0.0,
        init_std: float = 0.02,
        proj_std: float = 0.02,
        rotary: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.d_model = d_model
        self.n_head = n_head
        self.dropout = dropout
        self.init_std = init_std
        self.proj_std = proj_std
        self.rotary = rotary
        self.qkv = keras.layers.Dense(3 * d_model, kernel_initializer=_init(init_std), name="qkv")
        self.proj = keras.layers.Dense(d_model, kernel_initializer=_init(proj_std), name="proj")
        self.attn_drop = keras.layers.Dropout(dropout)
        self.resid_drop = keras.layers.Dropout(dropout)

    def call(self, x: tf.Tensor, training: bool | None = None, seeds: Any = None) -> tf.Tensor:
        """`seeds`: None, or (2, 2) int32 for stateless dropout (`seeded_dropout`) when training."""
        q, k, v = self.heads(x)  # each (B, H, T, hd)
        t = tf.shape(x)[1]
        causal = tf.linalg.band_part(tf.ones((t, t), x.dtype), -1, 0)  # 1 on, below diagonal
        y = self.attend(q, k, v, causal, training, _seed(seeds, 0))  # (B, H, T, hd)
        return self.merge(y, training, _seed(seeds, 1))

    def heads(self, x: tf.Tensor, start: Any = 0) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """x (B, T, C) at positions start, ... -> queries, keys, values, each (B, H, T, hd)."""
        b, t = tf.shape(x)[0], tf.shape(x)[1]
        hd = self.d_model // self.n_head
        qkv = self.qkv(tf.reshape(x, (-1, self.d_model)))  # (B*T, 3C)
        qkv = tf.reshape(qkv, (b, t, 3, self.n_head, hd))  # (B, T, 3, H, hd)
        q, k, v = tf.unstack(tf.transpose(qkv, (2, 0, 3, 1, 4)))  # each (B, H, T, hd)
        if self.rotary:
            q, k = rotate(q, start=start), rotate(k, start=start)
        return q, k, v

    def attend(
        self,
        q: tf.Tensor,
        k: tf.Tensor,
        v: tf.Tensor,
        visible: tf.Tensor,
        training: bool | None = None,
        seed: Any = None,
    ) -> tf.Tensor:
        """q (B, H, Tq, hd) over k, v (B, H, Tk, hd) where `visible` (Tq, Tk, or broadcasting to
        (B, H, Tq, Tk)) is 1 -> (B, H, Tq, hd)."""
        # Scores, mask and softmax in the compute dtype, as tf-keras' MultiHeadAttention has
        # them and as Megatron's fused softmax takes and gives bfloat16 (Keras 3's
        # dot_product_attention, the peer's, up-casts them to float32). TensorFlow's bfloat16
        # softmax and sums accumulate in float32 and round once where the CPU has bfloat16
        # instructions (within one bfloat16 ulp of float64: tests/trainer/test_model.py; where it
        # emulates bfloat16, `auto` picks float32: trainer/precision.py), oneDNN accumulates
        # the bfloat16 matmul in float32, and the probabilities go to the A.V matmul in
        # bfloat16 anyway; the float32 round trip
        # cost 5-8% of the step on CPU, and on a GPU it doubles the (B, H, T, T) tensors'
        # memory. Scaling q (B, H, T, hd) rather than the scores (B, H, T, T) is T/hd times
        # fewer multiplies. The mask is added, not selected, so its backward pass is no op;
        # masked scores get a large finite negative, whose exp is exactly 0 (-1e9 would be
        # -inf in float16, and 0 * -inf is NaN).
        q *= tf.cast(1.0 / math.sqrt(self.d_model // self.n_head), q.dtype)
        att = tf.matmul(q, k, transpose_b=True)  # (B, H, Tq, Tk)
        att += (1.0 - tf.cast(visible, att.dtype)) * tf.cast(-0.7 * att.dtype.max, att.dtype)
        att = seeded_dropout(self.attn_drop, tf.nn.softmax(att, axis=-1), training, seed)
        return tf.matmul(att, v)  # (B, H, Tq, hd)

    def merge(self, y: tf.Tensor, training: bool | None = None, seed: Any = None) -> tf.Tensor:
        """The heads' outputs (B, H, T, hd) -> the layer's output (B, T, C)."""
        b, t = tf.shape(y)[0], tf.shape(y)[2]
        y = tf.reshape(tf.transpose(y, (0, 2, 1, 3)), (-1, self.d_model))  # (B*T, C)
        y = tf.reshape(self.proj(y), (b, t, self.d_model))  # (B, T, C)
        return seeded_dropout(self.resid_drop, y, training, seed)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "d_model": self.d_model,
            "n_head": self.n_head,
            "dropout": self.dropout,
            "init_std": self.init_std,
            "proj_std": self.proj_std,
            "rotary": self.rotary,
        }


def _seed(seeds: Any, i: int) -> Any:
    return None if seeds is None else seeds[i]


class Block(keras.layers.Layer):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x)).

    `recompute`: in training, the block's activations are not kept for the backward pass but
    recomputed there (trainer/recompute.py), and its dropout is stateless, from seeds drawn per
    step outside the recomputation, so that it drops the same units both times. The weights,
    their names and the inference graph are the same either way.
    """

    def __init__(
        self,
        d_model: int,
        n_head: int,
        d_ff: int,
        dropout: float = 0.0,
        layer_norm_epsilon: float = 1e-5,
        init_std: float = 0.02,
        proj_std: float = 0.02,
        use_xla_gelu: bool = False,
        rotary: bool = False,
        recompute: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.d_model = d_model
        self.n_head = n_head
        self.d_ff = d_ff
        self.use_xla_gelu = use_xla_gelu
        self.dropout = dropout
        self.layer_norm_epsilon = layer_norm_epsilon
        self.init_std = init_std
        self.proj_std = proj_std
        self.rotary = rotary
        self.recompute = recompute
        self.ln_1 = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, name="ln_1")
        self.attn = CausalSelfAttention(
            d_model, n_head, dropout, init_std, proj_std, rotary, name="attn"
        )
        self.ln_2 = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, name="ln_2")
        self.fc = keras.layers.Dense(d_ff, kernel_initializer=_init(init_std), name="fc")
        self.fc_proj = keras.layers.Dense(
            d_model, kernel_initializer=_init(proj_std), name="fc_proj"
        )
        self.mlp_drop = keras.layers.Dropout(dropout)

    def call(self, x: tf.Tensor, training: bool | None = None) -> tf.Tensor:
        # As for xla_gelu below: fit's training=True, a Python bool, recomputes; no other call.
        if not (self.recompute and training is True):
            return self._forward(x, training)
        if not self.fc_proj.built:
            raise ValueError(f"{self.name}: build the block (call it once) before recomputing")
        seeds = self._dropout_seeds()
        return recompute.recomputed(lambda h: self._forward(h, True, seeds), x)

    def _dropout_seeds(self) -> tf.Tensor | None:
        """(3, 2) int32 seeds for the block's three dropouts, drawn from the global random
        state once per step (outside the recomputation); None without dropout."""
        if self.dropout == 0:
            return None
        low, high = tf.int32.min, tf.int32.max
        return tf.random.uniform((3, 2), low, high, dtype=tf.int32)

    def _forward(self, x: tf.Tensor, training: bool | None, seeds: Any = None) -> tf.Tensor:
        """The block; `seeds` (`_dropout_seeds`), if given, make its dropout stateless."""
        attn_seeds = None if seeds is None else seeds[:2]
        x = x + self.attn(self.ln_1(x), training=training, seeds=attn_seeds)  # (B, T, C)
        return x + self.mlp(x, training, _seed(seeds, 2))

    def mlp(self, x: tf.Tensor, training: bool | None = None, seed: Any = None) -> tf.Tensor:
        """The MLP branch on the residual stream x (B, T, C): what the block adds to it."""
        h = self.fc(tf.reshape(self.ln_2(x), (-1, self.d_model)))  # (B*T, d_ff)
        # The XLA-fused GELU only in training: evaluation and serving graphs stay plain ops.
        # Keras' fit passes training=True as a Python bool (train_step.InstrumentedGPT), build
        # and evaluate None or False; anything else (a tensor) takes the plain path, slower only.
        h = xla_gelu(h) if self.use_xla_gelu and training is True else gelu(h)
        y = tf.reshape(self.fc_proj(h), tf.shape(x))  # (B, T, C)
        return seeded_dropout(self.mlp_drop, y, training, seed)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "d_model": self.d_model,
            "n_head": self.n_head,
            "d_ff": self.d_ff,
            "dropout": self.dropout,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "init_std": self.init_std,
            "proj_std": self.proj_std,
            "use_xla_gelu": self.use_xla_gelu,
            "rotary": self.rotary,
            "recompute": self.recompute,
        }


def build_gpt(cfg: ModelConfig, xla_kernels: bool = False, recompute: bool = False) -> keras.Model:
    """Functional GPT: int32 ids (B, T<=seq_len) -> float32 logits (B, T, vocab_size).

    `xla_kernels`: when training, GELU runs as `xla_gelu` (config.use_xla_kernels).
    `recompute`: when training, each block recomputes its activations in the backward pass
    (train.recompute=blocks; `Block`). The math, the weights and the inference graph are the
    same either way.
    """
    # GPT-2 scales the init of residual projections by 1/sqrt(2 * n_layer).
    proj_std = cfg.init_std / math.sqrt(2 * cfg.n_layer)
    ids = keras.Input(shape=(None,), dtype="int32", name="ids")  # (B, T)
    wte = TiedEmbedding(cfg.vocab_size, cfg.d_model, cfg.init_std, name="wte")
    x = wte(ids)  # (B, T, C)
    if cfg.position == "learned":
        x = PositionEmbedding(cfg.seq_len, cfg.d_model, cfg.init_std, name="wpe")(x)
    else:
        x = ContextLimit(cfg.seq_len, name="context_limit")(x)
    x = keras.layers.Dropout(cfg.dropout, name="drop")(x)
    for i in range(cfg.n_layer):
        x = Block(
            cfg.d_model,
            cfg.n_head,
            cfg.d_ff,
            cfg.dropout,
            cfg.layer_norm_epsilon,
            cfg.init_std,
            proj_std,
            use_xla_gelu=xla_kernels,
            rotary=cfg.position == "rotary",
            recompute=recompute,
            name=f"h_{i}",
        )(x)
    x = keras.layers.LayerNormalization(epsilon=cfg.layer_norm_epsilon, name="ln_f")(x)
    logits = wte(x, reverse=True)  # (B, T, V)
    logits = keras.layers.Activation("linear", dtype="float32", name="logits")(logits)
    return keras.Model(ids, logits, name="gpt")
