"""SentencePiece BPE: train the tokenizer on a bounded sample of the train split, or check a
given one. (Encoding is `encode.py`, which worker processes import without this module.)

The options make the model reproduce text exactly (newlines and runs of spaces included), never
emit <unk> (unseen characters become UTF-8 byte pieces), and train deterministically; the
exported SavedModel's in-graph `tensorflow_text.SentencepieceTokenizer` reads the same model.
"""

from __future__ import annotations

import heapq
import io
import math
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import sentencepiece as spm

from components import storage
from components.tokenize.encode import encode_text
from contracts.errors import UserError
from contracts.process import pending_stop

# Options for SentencePieceTrainer.train besides the input and vocab_size. They make the model
# (a) reproduce text exactly: decode(encode(text)) == text, newlines and runs of spaces included
# (identity normalization, no dummy prefix, no whitespace folding, "\n" a symbol of its own);
# (b) never emit <unk>: unseen characters become UTF-8 byte pieces;
# (c) deterministic: one thread, every sentence it is given used in order, no sampling of its
#     own (the sample is chosen by `Sample`, from the bytes alone).
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

SAMPLE_BYTES = 16 << 20  # what the tokenizer learns from, at most: ~0.3 GB to train on
ROUND_TRIP_PROBE = "First line\n\n  two  spaces,\ttab.\nlast"


class Sample:
    """A sample of train text with a hard bound in bytes, spread evenly, for the tokenizer.

    Of each train piece it takes the first whole lines holding `fraction` of its characters
    (all of a corpus whose train text fits the bound: the step sets `fraction` from the listed
    sizes), and keeps, of those runs, the ones with the smallest keys that fit in `budget`
    UTF-8 bytes. A key is a hash of the piece's identity, so the runs kept are a uniform draw
    over the whole unit, never its first files; and the same bytes always give the same
    sample. Memory: the runs kept, at most `budget` bytes, plus one run.
    """

    def __init__(self, budget: int, fraction: float) -> None:
        self.budget = budget
        self.fraction = fraction
        self.bytes = 0  # of the runs kept
        self._kept: list[tuple[int, int, str, int]] = []  # a heap of (-key, order, run, bytes)
        self._order = 0

    def add(self, text: str, key: int) -> None:
        """Take the share of one train piece (whole lines), `key` its identity's hash."""
        if self.fraction < 1.0:
            keep = math.ceil(len(text) * self.fraction)
            text = text[: text.find("\n", keep - 1) + 1 or len(text)]
        size = len(text.encode("utf-8"))
        self._order += 1
        if size > self.budget:
            return
        heapq.heappush(self._kept, (-key, self._order, text, size))
        self.bytes += size
        while self.bytes > self.budget:
            self.bytes -= heapq.heappop(self._kept)[3]

    def text(self) -> str:
        """The runs kept, in the order they were added, each ending in a newline."""
        runs = sorted(self._kept, key=lambda kept: kept[1])
        return "".join(run if run.endswith("\n") else run + "\n" for _, _, run, _ in runs)


def train(
    sample: str | Sequence[str], vocab_size: int, corpus: str, say: Callable[[str], None]
) -> bytes:
    """Train the BPE model on the lines of `sample` (text, or runs of whole lines); return the
    serialized model."""
    pieces = [sample] if isinstance(sample, str) else sample
    say(
        f"training SentencePiece BPE, vocab_size {vocab_size}, "
        f"on {sum(len(p) for p in pieces):,} train characters"
    )
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_lines(pieces),
            model_writer=model,
            vocab_size=vocab_size,
            minloglevel=2,
            **SENTENCEPIECE_TRAINER_OPTIONS,
        )
    except RuntimeError as e:
        if (stop := pending_stop()) is not None:  # stopped while it read: not the corpus's fault
            raise stop from None
        raise UserError(
            f"cannot train a tokenizer with vocab_size {vocab_size} on corpus "
            f"{corpus!r}: {_explain_trainer_error(str(e))}"
        ) from None
    return model.getvalue()


def _lines(pieces: Sequence[str]) -> Iterator[str]:
    """The sentences SentencePiece learns from: lines, without their newline (it skips empty
    ones), one piece split at a time."""
    for piece in pieces:
        yield from piece.split("\n")


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
    except (FileNotFoundError, storage.ObjectNotFound):
        raise UserError(
            f"tokenizer {path!r} not found; give a SentencePiece .model file or omit it"
        ) from None
    except IsADirectoryError:
        raise UserError(
            f"tokenizer {path!r} is a folder; give the SentencePiece .model file in it"
        ) from None
    except OSError as e:  # permissions, I/O: the cause, not "not found"
        raise UserError(f"cannot read tokenizer {path!r}: {e.strerror or e}") from None
    except UserError as e:  # gs:// access, named by the storage layer
        raise UserError(f"cannot read tokenizer {path!r}: {e}") from None
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
    # The step encodes line by line (encode_text), which gives the model's own ids only where
    # "\n" is a piece of its own and no line gets a dummy prefix: otherwise every shard would
    # hold ids the exported model's tokenizer never produces, and nothing would fail.
    if encode_text(processor, ROUND_TRIP_PROBE).tolist() != processor.encode(ROUND_TRIP_PROBE):
        raise UserError(
            f"tokenizer {path!r} does not keep newlines as a piece of their own "
            "(user_defined_symbols=['\\n'], add_dummy_prefix=False): the step's line-by-line "
            "encoding would not match it; train it with SENTENCEPIECE_TRAINER_OPTIONS or omit it"
        )
    return model
