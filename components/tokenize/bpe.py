"""SentencePiece BPE: train the tokenizer on the train split, check a given one, encode text.

The options make the model reproduce text exactly (newlines and runs of spaces included), never
emit <unk> (unseen characters become UTF-8 byte pieces), and train deterministically; the
exported SavedModel's in-graph `tensorflow_text.SentencepieceTokenizer` reads the same model.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import sentencepiece as spm

from components import storage
from contracts.errors import UserError

# Options for SentencePieceTrainer.train besides the input and vocab_size. They make the model
# (a) reproduce text exactly: decode(encode(text)) == text, newlines and runs of spaces included
# (identity normalization, no dummy prefix, no whitespace folding, "\n" a symbol of its own);
# (b) never emit <unk>: unseen characters become UTF-8 byte pieces;
# (c) deterministic: one thread, every sentence used in order, no sampling.
# tensorflow_text.SentencepieceTokenizer(model, add_bos=False, add_eos=False) reads the same model.
SENTENCEPIECE_TRAINER_OPTIONS: dict[str, Any] = {
    "model_type": "bpe",
    "byte_fallback": True,
    "normalization_rule_name": "identity",
    "remove_extra_whitespaces": False,
    "add_dummy_prefix": False,
    "user_defined_symbols": ["\n"],
    "allow_whitespace_only_pieces": True,
    "split_digits": False,
    "character_coverage": 0.9995,
    "max_sentence_length": 1 << 16,
    "input_sentence_size": 0,
    "shuffle_input_sentence": False,
    "num_threads": 1,
    "unk_id": 0,
    "bos_id": 1,
    "eos_id": 2,
    "pad_id": -1,
}

ENCODE_CHUNK_CHARS = 1 << 16  # one unit of work for an encode thread, cut after a newline
ROUND_TRIP_PROBE = "First line\n\n  two  spaces,\ttab.\nlast"


def train(train_text: str, vocab_size: int, corpus: str, say: Callable[[str], None]) -> bytes:
    """Train the BPE model on the train split's lines; return the serialized model."""
    say(
        f"training SentencePiece BPE, vocab_size {vocab_size}, "
        f"on {len(train_text):,} train characters"
    )
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(train_text.split("\n")),
            model_writer=model,
            vocab_size=vocab_size,
            minloglevel=2,
            **SENTENCEPIECE_TRAINER_OPTIONS,
        )
    except RuntimeError as e:
        raise UserError(
            f"cannot train a tokenizer with vocab_size {vocab_size} on corpus "
            f"{corpus!r}: {_explain_trainer_error(str(e))}"
        ) from None
    return model.getvalue()


def _explain_trainer_error(message: str) -> str:
    """Turn SentencePiece's check failures into the fix a user can make here."""
    too_small = re.search(r"smaller than required_chars\. \d+ vs (\d+)", message)
    if too_small:
        return (
            f"byte pieces, special pieces and the corpus's characters need at least "
            f"{too_small[1]}; use vocab_size >= {too_small[1]}"
        )
    too_high = re.search(
        r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)", message
    )
    if too_high:
        return (
            f"the train split yields at most {too_high[1]} pieces; use vocab_size <= "
            f"{too_high[1]} or more data"
        )
    return message.split("] ")[-1]


def read_given(path: str, vocab_size: int) -> bytes:
    """Read and check a user-supplied SentencePiece model."""
    try:
        model = storage.read_bytes(path)
    except (OSError, UserError):
        raise UserError(
            f"tokenizer {path!r} not found; give a SentencePiece .model file or omit it"
        ) from None
    try:
        processor = spm.SentencePieceProcessor(model_proto=model)
    except RuntimeError:
        raise UserError(f"tokenizer {path!r} is not a SentencePiece model") from None
    if processor.vocab_size() != vocab_size:
        raise UserError(
            f"tokenizer {path!r} has {processor.vocab_size()} pieces but vocab_size "
            f"is {vocab_size}; set vocab_size={processor.vocab_size()} or omit "
            "the tokenizer to train one"
        )
    if processor.decode(processor.encode(ROUND_TRIP_PROBE)) != ROUND_TRIP_PROBE:
        raise UserError(
            f"tokenizer {path!r} does not reproduce newlines and spaces exactly; "
            "train it with SENTENCEPIECE_TRAINER_OPTIONS or omit it"
        )
    return model


def _line_chunks(text: str, chunk_chars: int) -> list[str]:
    """Cut text after a newline every ~chunk_chars; the cut points depend on the text only."""
    chunks, start = [], 0
    while start < len(text):
        newline = text.find("\n", min(start + chunk_chars, len(text)) - 1)
        end = len(text) if newline == -1 else newline + 1
        chunks.append(text[start:end])
        start = end
    return chunks


def encode(
    model: bytes,
    text: str,
    workers: int,
    advance: Callable[[int, int], None],
    chunk_chars: int = ENCODE_CHUNK_CHARS,
) -> np.ndarray:
    """Encode text to int64 ids on `workers` threads, chunk order kept.

    SentencePiece's batch encode runs C++ threads without the GIL, so it uses every core with no
    process pool: spawned workers would cost more than the encode (about 0.2 s per MB on one core)
    and need a `__main__` guard in every caller, and forking after TensorFlow started its threads
    is unsafe. "\\n" is a piece of its own, so no piece spans a chunk boundary and the ids equal
    those of encoding the text whole, whatever `workers` is.
    """
    processor = spm.SentencePieceProcessor(model_proto=model)
    chunks = _line_chunks(text, chunk_chars)
    batch = 8 * workers  # chunks per progress report
    encoded = [np.zeros(0, np.int64)]
    for start in range(0, len(chunks), batch):
        for ids in processor.encode(chunks[start : start + batch], num_threads=workers):
            encoded.append(np.asarray(ids, dtype=np.int64))
        advance(min(start + batch, len(chunks)), len(chunks))
    return np.concatenate(encoded)
