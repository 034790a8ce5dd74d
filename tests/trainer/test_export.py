"""trainer.export: tokenizer parity with python sentencepiece, and the SavedModel signatures."""

from typing import Any

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf
import tensorflow_text as tf_text
import tf_keras as keras

from tests.tiny import SEQ_LEN, VOCAB_SIZE, tiny_corpus, train_tokenizer
from trainer.config import resolve_config
from trainer.export import export_model
from trainer.model import build_gpt

# Each test loads TensorFlow models: the module is the slow tier's.
pytestmark = pytest.mark.slow
TEXTS = [
    "ROMEO:\nBut soft, what light through yonder window breaks?\n\n",
    "  two leading spaces,\tand a tab\n   and  runs   of spaces  ",
    "héllo wörld, naïve café — ☃ 日本語 🙂\n",
    "\n",
    "",
]


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    return train_tokenizer(tiny_corpus(), tmp_path_factory.mktemp("tok") / "tokenizer")


def _export(tokenizer_path, folder, *overrides: str):
    """An untrained tiny model exported with the fixture tokenizer: (keras model, loaded,
    its folder). Float32 whatever an earlier test left as the global policy: the reference
    model must compute as the exported one does."""
    keras.mixed_precision.set_global_policy("float32")
    keras.utils.set_random_seed(0)
    cfg = resolve_config(
        "tiny",
        [
            f"vocab_size={VOCAB_SIZE}",
            f"seq_len={SEQ_LEN}",
            "n_layer=1",
            "d_model=16",
            "n_head=2",
            "d_ff=32",
            *overrides,
        ],
    )
    model = build_gpt(cfg.model)
    export_dir = folder / "Format-Serving"
    export_model(model, cfg, str(tokenizer_path), str(export_dir))
    return model, tf.saved_model.load(str(export_dir)), export_dir


@pytest.fixture(scope="module")
def exported(tokenizer_path, tmp_path_factory):
    return _export(tokenizer_path, tmp_path_factory.mktemp("model"))


def test_tf_text_tokenizer_matches_python_sentencepiece(tokenizer_path):
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_path))
    tok = tf_text.SentencepieceTokenizer(model=tokenizer_path.read_bytes())
    ids = tok.tokenize(tf.constant(TEXTS)).to_list()
    for text, row in zip(TEXTS, ids, strict=True):
        assert row == sp.encode(text), text
        assert sp.decode(row) == text
    back = tok.detokenize(tf.ragged.constant(ids, dtype=tf.int32)).numpy()
    assert [b.decode("utf-8") for b in back] == TEXTS
    assert sp.piece_to_id("\n") != sp.unk_id()  # newline is one piece, not bytes


def test_export_layout_and_signatures(exported):
    _, loaded, export_dir = exported
    assert (export_dir / "saved_model.pb").exists()
    assert (export_dir / "assets" / "tokenizer.model").exists()
    assert not list(export_dir.parent.glob(".Format-Serving.tmp-*"))
    assert set(loaded.signatures) == {"serving_default", "generate", "generate_seeded", "score"}
    gen = loaded.signatures["generate"]
    assert set(gen.structured_outputs) == {"completion"}
    assert set(loaded.signatures["serving_default"].structured_outputs) == {"completion"}
    assert set(loaded.signatures["score"].structured_outputs) == {
        "nats",
        "tokens",
        "chars",
        "nats_per_token",
        "nats_per_char",
    }


def _greedy_reference(model, sp, prompt, n):
    ids = sp.encode(prompt) or sp.encode("\n")
    start = len(ids)
    for _ in range(n):
        logits = model(np.array([ids[-SEQ_LEN:]], dtype="int32"))[0, -1]
        ids.append(int(np.argmax(logits)))
    return sp.decode(ids[start:])


def test_generate_greedy_matches_keras_and_handles_ragged_batches(exported, tokenizer_path):
    model, loaded, _ = exported
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_path))
    prompts = ["ROMEO:\n", "", "To be, or not to be, that is the question. Speak, speak."]
    n = SEQ_LEN + 4  # longer than the window: the context must be cropped
    out = loaded.signatures["generate"](
        prompt=tf.constant(prompts), max_new_tokens=tf.constant(n), temperature=tf.constant(0.0)
    )["completion"].numpy()
    got = [c.decode("utf-8") for c in out]
    assert got == [_greedy_reference(model, sp, p, n) for p in prompts]


def test_generate_sampling_and_zero_tokens(exported):
    _, loaded, _ = exported
    gen = loaded.signatures["serving_default"]
    out = gen(
        prompt=tf.constant(["a", "bb"]), max_new_tokens=tf.constant(5), temperature=tf.constant(1.0)
    )["completion"]
    assert out.shape == (2,) and all(len(c) > 0 for c in out.numpy())
    empty = gen(
        prompt=tf.constant(["a"]), max_new_tokens=tf.constant(0), temperature=tf.constant(0.7)
    )["completion"].numpy()
    assert empty.tolist() == [b""]


def _reference_nats(model, ids):
    """Sum of next-token losses over windows of SEQ_LEN + 1 with stride SEQ_LEN (tail included)."""
    total = 0.0
    for start in range(0, max(len(ids) - 1, 0), SEQ_LEN):
        window = ids[start : start + SEQ_LEN + 1]
        logits = model(np.array([window[:-1]], dtype="int32"))[0].numpy().astype("float64")
        top = logits.max(-1, keepdims=True)
        logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
        total -= sum(logp[i, t] for i, t in enumerate(window[1:]))
    return total


def _assert_scores_match_keras(model, loaded, tokenizer_path) -> Any:
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_path))
    texts = [tiny_corpus(12, seed=1), "x", "", tiny_corpus(3, seed=2) + "日本"]
    out = loaded.signatures["score"](text=tf.constant(texts))
    for i, text in enumerate(texts):
        ids = sp.encode(text)
        assert out["tokens"].numpy()[i] == max(len(ids) - 1, 0)
        assert out["chars"].numpy()[i] == len(text)
        assert out["nats"].numpy()[i] == pytest.approx(
            _reference_nats(model, ids), rel=1e-4, abs=1e-4
        )
    return out


def test_score_matches_keras_on_the_same_windows(exported, tokenizer_path):
    model, loaded, _ = exported
    out = _assert_scores_match_keras(model, loaded, tokenizer_path)
    per_token = out["nats_per_token"].numpy()
    assert per_token[0] == pytest.approx(out["nats"].numpy()[0] / out["tokens"].numpy()[0])
    assert per_token[0] == pytest.approx(np.log(VOCAB_SIZE), rel=0.1)  # untrained: ~uniform
    assert out["nats"].numpy()[2] == 0.0 and per_token[2] == 0.0


@pytest.mark.slow
def test_a_rotary_model_exports_generates_and_scores_like_keras(tokenizer_path, tmp_path):
    """model.position=rotary: no position table in the SavedModel, the same signatures."""
    model, loaded, _ = _export(tokenizer_path, tmp_path, "position=rotary")
    assert not any("wpe" in w.name for w in model.weights)
    _assert_scores_match_keras(model, loaded, tokenizer_path)
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_path))
    n = SEQ_LEN + 4  # the context cropped to the last seq_len tokens, as with the table
    out = loaded.signatures["generate"](
        prompt=tf.constant(["ROMEO:\n"]),
        max_new_tokens=tf.constant(n),
        temperature=tf.constant(0.0),
    )["completion"].numpy()
    assert out[0].decode("utf-8") == _greedy_reference(model, sp, "ROMEO:\n", n)
