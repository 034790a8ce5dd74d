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
from trainer.export import GPTServing, export_model
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
    for name in ("generate", "generate_seeded"):
        inputs = loaded.signatures[name].structured_input_signature[1]
        assert inputs["stop_at_eos"] == tf.TensorSpec([], tf.bool, name="stop_at_eos")
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
        prompt=tf.constant(prompts),
        max_new_tokens=tf.constant(n),
        temperature=tf.constant(0.0),
        stop_at_eos=tf.constant(False),
    )["completion"].numpy()
    got = [c.decode("utf-8") for c in out]
    assert got == [_greedy_reference(model, sp, p, n) for p in prompts]


def test_generate_sampling_and_zero_tokens(exported):
    _, loaded, _ = exported
    gen = loaded.signatures["serving_default"]
    out = gen(
        prompt=tf.constant(["a", "bb"]),
        max_new_tokens=tf.constant(5),
        temperature=tf.constant(1.0),
        stop_at_eos=tf.constant(False),
    )["completion"]
    assert out.shape == (2,) and all(len(c) > 0 for c in out.numpy())
    empty = gen(
        prompt=tf.constant(["a"]),
        max_new_tokens=tf.constant(0),
        temperature=tf.constant(0.7),
        stop_at_eos=tf.constant(True),
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
        stop_at_eos=tf.constant(False),
    )["completion"].numpy()
    assert out[0].decode("utf-8") == _greedy_reference(model, sp, "ROMEO:\n", n)


# ---- generation ends at the document's end (EOS) ---------------------------------------------


def _table_model(next_ids: dict[int, int], default: int) -> keras.Model:
    """A model whose next token after id i is next_ids.get(i, default), by a wide margin."""
    table = np.zeros((VOCAB_SIZE, VOCAB_SIZE), dtype="float32")
    for i in range(VOCAB_SIZE):
        table[i, next_ids.get(i, default)] = 50.0
    ids = keras.Input((None,), dtype="int32")
    init = keras.initializers.Constant(table)
    logits = keras.layers.Embedding(VOCAB_SIZE, VOCAB_SIZE, embeddings_initializer=init)(ids)
    return keras.Model(ids, logits)  # (B, T, V)


@pytest.fixture(scope="module")
def eos_after_one(tokenizer_path, tmp_path_factory):
    """A SavedModel that continues any prompt with A, EOS, then B for ever (and B with B):
    (loaded, sp, A, B)."""
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_path))
    a, b = sp.encode("R")[0], sp.encode("J")[0]
    assert len({a, b, sp.eos_id()}) == 3 and sp.eos_id() == 2
    model = _table_model({a: sp.eos_id(), sp.eos_id(): b, b: b}, default=a)
    cfg = resolve_config("tiny", [f"vocab_size={VOCAB_SIZE}", f"seq_len={SEQ_LEN}"])
    export_dir = tmp_path_factory.mktemp("eos") / "Format-Serving"
    export_model(model, cfg, str(tokenizer_path), str(export_dir))
    return tf.saved_model.load(str(export_dir)), sp, a, b


def _continue(loaded, prompts, stop_at_eos, temperature=0.0, seed=None):
    inputs = {
        "prompt": tf.constant(prompts),
        "max_new_tokens": tf.constant(6),
        "temperature": tf.constant(temperature),
        "stop_at_eos": tf.constant(stop_at_eos),
    }
    name = "generate" if seed is None else "generate_seeded"
    if seed is not None:
        inputs["seed"] = tf.constant(seed, tf.int64)
    return [c.decode("utf-8") for c in loaded.signatures[name](**inputs)["completion"].numpy()]


def test_generation_stops_at_eos_per_row_and_leaves_it_out(eos_after_one):
    loaded, sp, a, b = eos_after_one
    # The first row meets EOS after A; the second, ending in B, never does and runs to 6.
    prompts = ["ROMEO:\n", sp.decode([b])]
    assert _continue(loaded, prompts, True) == [sp.decode([a]), sp.decode([b] * 6)]
    for seed in (1, 2):  # sampling (temperature 1) stops alike
        assert _continue(loaded, prompts[:1], True, 1.0, seed) == [sp.decode([a])]


def test_generation_continues_through_eos_when_asked(eos_after_one):
    loaded, sp, a, b = eos_after_one
    through = sp.decode([a, sp.eos_id(), b, b, b, b])
    assert through == sp.decode([a]) + sp.decode([b] * 4)  # EOS itself is no text
    assert _continue(loaded, ["ROMEO:\n"], False) == [through]
    assert _continue(loaded, ["ROMEO:\n"], False, 1.0, 3) == [through]


def test_a_tokenizer_without_eos_never_stops(tmp_path):
    from components.tokenize.bpe import SENTENCEPIECE_TRAINER_OPTIONS

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(tiny_corpus(), encoding="utf-8")
    options = {**SENTENCEPIECE_TRAINER_OPTIONS, "eos_id": -1}
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(tmp_path / "no-eos"),
        vocab_size=VOCAB_SIZE,
        minloglevel=2,
        **options,
    )
    module = GPTServing(_table_model({}, default=2), SEQ_LEN, str(tmp_path / "no-eos.model"))
    assert module.eos_id == -1
    out = module.generate(
        tf.constant(["ROMEO:"]), tf.constant(5), tf.constant(0.0), tf.constant(True)
    )
    ids = module.tokenizer.tokenize(out["completion"])
    assert ids.row_lengths().numpy().tolist() == [5]


def test_text_never_tokenizes_to_eos(tokenizer_path):
    """EOS is a control symbol: the text "</s>" is its characters, so a scored string never
    holds a document's end."""
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_path))
    tok = tf_text.SentencepieceTokenizer(model=tokenizer_path.read_bytes())
    texts = ["</s>", "a</s>b\n", "<s></s><unk>"]
    for row in tok.tokenize(tf.constant(texts)).to_list():
        assert sp.eos_id() not in row
    assert all(sp.eos_id() not in sp.encode(text) for text in texts)
