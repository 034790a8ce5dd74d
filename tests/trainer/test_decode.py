"""trainer.decode: the cached, batched generate gives the uncached path's tokens, and uses the
cache where it can."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tests.tiny import SEQ_LEN, VOCAB_SIZE, tiny_corpus, train_tokenizer
from trainer import decode
from trainer.config import resolve_config
from trainer.export import GPTServing
from trainer.model import build_gpt

pytestmark = pytest.mark.slow  # TensorFlow models
# Lengths 0 (a newline is the prompt), short, and longer than the window (16 tokens).
PROMPTS = ["ROMEO:\n", "", "To be, or not to be, that is the question. Speak, speak, I say.", "a"]


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    return train_tokenizer(tiny_corpus(), tmp_path_factory.mktemp("tok") / "tokenizer")


def _module(tokenizer_path, position: str) -> GPTServing:
    keras.mixed_precision.set_global_policy("float32")
    cfg = resolve_config(
        "tiny",
        [
            f"vocab_size={VOCAB_SIZE}",
            f"seq_len={SEQ_LEN}",
            "n_layer=2",
            "d_model=32",
            "n_head=4",
            "d_ff=64",
            f"position={position}",
        ],
    )
    return GPTServing(build_gpt(cfg.model), SEQ_LEN, str(tokenizer_path))


@pytest.fixture(scope="module")
def modules(tokenizer_path):
    """Both kinds of position and a model that is no GPT, made after the one seeding: seeding
    clears TensorFlow's eager kernel cache, and with it an eager tokenizer's resource."""
    keras.utils.set_random_seed(1)
    found = {position: _module(tokenizer_path, position) for position in ("learned", "rotary")}
    table = np.random.RandomState(0).normal(size=(VOCAB_SIZE, VOCAB_SIZE)).astype("float32")
    ids = keras.Input((None,), dtype="int32")
    init = keras.initializers.Constant(table)
    logits = keras.layers.Embedding(VOCAB_SIZE, VOCAB_SIZE, embeddings_initializer=init)(ids)
    found["table"] = GPTServing(keras.Model(ids, logits), SEQ_LEN, str(tokenizer_path))
    return found


@pytest.fixture(scope="module")
def module(modules):
    return modules["learned"]


def _both(module, prompts, n, temperature=0.0, seed=None, stop_at_eos=False, paths=2):
    """(cached, uncached) completions, as lists of str; `paths=1`: (cached,)."""
    args = (
        tf.constant(prompts),
        tf.constant(n),
        tf.constant(temperature),
        None if seed is None else tf.constant(seed, tf.int64),
        tf.constant(stop_at_eos),
    )
    found = []
    for fn in (module._generate, module.generate_uncached)[:paths]:
        out = tf.function(fn)(*args)["completion"].numpy()
        found.append([c.decode("utf-8", errors="replace") for c in out])
    return found


def test_greedy_cached_equals_uncached(module):
    cached, uncached = _both(module, PROMPTS, SEQ_LEN + 6)  # past the window
    assert cached == uncached
    assert all(c for c in cached)


def test_greedy_cached_equals_uncached_with_rotary_positions(modules):
    cached, uncached = _both(modules["rotary"], PROMPTS, SEQ_LEN + 6)
    assert cached == uncached


def test_seeded_sampling_cached_equals_uncached_row_by_row(module):
    cached, uncached = _both(module, PROMPTS, SEQ_LEN, temperature=1.0, seed=3)
    assert cached == uncached
    # A row's stream depends on its seed and position only, not on the rows beside it.
    alone = [_both(module, [p], SEQ_LEN, 1.0, seed=3, paths=1)[0][0] for p in PROMPTS[:2]]
    assert alone == cached[:2]


def test_stop_at_eos_cached_equals_uncached(module):
    """EOS taken as an id the greedy path reaches: the row ends before it, alike both ways."""
    prompts = tf.ragged.constant([[5, 6, 7], [8, 9]], tf.int32)
    dense, lengths = decode.prompt_ids(prompts, tf.constant([4], tf.int32))

    def run(eos_id, stop, cached=True):
        s = decode.Sampling(tf.constant(8), tf.constant(0.0), None, tf.constant(stop))
        if cached:
            return decode.generate_ids(module.decoder, dense, lengths, s, eos_id).to_list()
        return decode.generate_uncached(module.model, SEQ_LEN, prompts, None, s, eos_id).to_list()

    free = run(-1, False)
    # The first id of a row that is new to it after at least one other: the row stops there.
    row, at = next((r, i) for r in (0, 1) for i in range(1, 8) if free[r][i] not in free[r][:i])
    stopped = run(free[row][at], True)
    assert stopped[row] == free[row][:at]
    assert stopped == run(free[row][at], True, cached=False)


def test_unseeded_sampling_gives_each_row_its_tokens(module):
    prompts = tf.constant([[5, 6, 7], [8, 9, 10]], tf.int32)
    sampling = decode.Sampling(tf.constant(6), tf.constant(1.0), None, tf.constant(False))
    new = decode.generate_ids(module.decoder, prompts, tf.constant([3, 2]), sampling, eos_id=-1)
    assert new.row_lengths().numpy().tolist() == [6, 6]
    assert new.flat_values.numpy().min() >= 0 and new.flat_values.numpy().max() < VOCAB_SIZE


class _Counting(decode.Decoder):
    """A Decoder that counts its forward passes (tf.while_loop runs its body eagerly)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.calls = {"prefill": 0, "step": 0, "window": 0}
        self.lengths = []  # the cache's positions, per prefill

    def prefill(self, tokens, length):
        self.calls["prefill"] += 1
        self.lengths.append(int(length))
        return super().prefill(tokens, length)

    def step(self, token, position, cache):
        self.calls["step"] += 1
        return super().step(token, position, cache)

    def window(self, tokens, end):
        self.calls["window"] += 1
        return super().window(tokens, end)


def _count(module, prompt_ids, n):
    decoder = _Counting(module.model, SEQ_LEN)
    prompts = tf.constant(prompt_ids, tf.int32)
    lengths = tf.constant([len(r) for r in prompt_ids], tf.int32)
    sampling = decode.Sampling(tf.constant(n), tf.constant(0.0), None, tf.constant(False))
    new = decode.generate_ids(decoder, prompts, lengths, sampling, eos_id=-1)
    assert new.row_lengths().numpy().tolist() == [n] * len(prompt_ids)
    return {**decoder.calls, "cached": decoder.lengths}


def test_the_prompt_is_prefilled_once_then_one_position_per_token(module):
    # Two rows of 3 tokens, 5 new: one prefill, then a step per position but the last, in a
    # cache of the 8 positions the call can reach.
    calls = _count(module, [[5, 6, 7], [8, 9, 10]], 5)
    assert calls == {"prefill": 1, "step": 4, "window": 0, "cached": [8]}


def test_past_the_window_each_token_runs_the_window(module):
    # 10 prompt tokens + 10 new: positions 10..15 step in the cache, 16..18 run the window.
    calls = _count(module, [list(range(3, 13))], 10)
    assert calls == {
        "prefill": 1,
        "step": SEQ_LEN - 10,
        "window": 19 - SEQ_LEN,
        "cached": [SEQ_LEN],  # no more than seq_len positions, ever
    }


def test_any_keras_model_decodes_uncached(modules):
    module = modules["table"]  # an embedding table: (B, T) -> (B, T, V), no blocks
    assert not module.decoder.cached
    cached, uncached = _both(module, PROMPTS, SEQ_LEN + 3)
    assert cached == uncached


def test_a_negative_token_count_is_refused(module):
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_new_tokens must be 0 or more"):
        module.generate(tf.constant(["a"]), tf.constant(-1), tf.constant(0.0), tf.constant(True))


def test_an_empty_batch_no_tokens_and_long_prompts_decode_as_before(module):
    """Edges: no prompt at all; max_new_tokens 0; every prompt past the window (no cache)."""
    empty = module.generate(tf.constant([], tf.string), tf.constant(5), tf.constant(0.0),
                            tf.constant(True))["completion"]  # fmt: skip
    assert empty.shape == (0,)
    cached, uncached = _both(module, PROMPTS[:2], 0)
    assert cached == uncached == ["", ""]
    long_prompts = [PROMPTS[2], PROMPTS[2] + " And more."]
    cached, uncached = _both(module, long_prompts, 4)
    assert cached == uncached and all(cached)
