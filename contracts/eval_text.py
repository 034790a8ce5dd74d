"""The eval split's text in an Examples folder (`EVAL_TEXT`), document by document.

Tokenize writes it and evaluate scores it, tokenizer-independently, in bounded memory whatever
its size. It is JSON Lines: each line one `EvalPiece`, a run of whole lines of one document;
the pieces of a document are consecutive and its last has `end: true`. Documents are never
joined: evaluate scores each apart, as the model saw each one end with the tokenizer's EOS.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

from contracts.artifacts import EVAL_TEXT  # noqa: F401 - the file, relative to the Examples
from contracts.errors import UserError


@dataclass(frozen=True)
class EvalPiece:
    """Whole lines of one eval document (its last piece may end without a newline)."""

    text: str
    end: bool  # True on the document's last piece


def piece_line(piece: EvalPiece) -> bytes:
    """One line of the file (UTF-8, JSON with non-ASCII kept as it is)."""
    data = {"text": piece.text, "end": piece.end}
    return (json.dumps(data, ensure_ascii=False) + "\n").encode("utf-8")


def read_pieces(f: IO[bytes], where: str) -> Iterator[EvalPiece]:
    """Stream the pieces of the file open as `f` (`where` names it in errors), a line at a time."""
    for number, line in enumerate(f, 1):
        try:
            data = json.loads(line)
            piece = EvalPiece(data["text"], data["end"])
        except (ValueError, KeyError, TypeError):
            raise UserError(
                f"examples: {where} line {number} is not an eval-text piece "
                '({"text": ..., "end": ...}); tokenize the corpus again'
            ) from None
        if not isinstance(piece.text, str) or not isinstance(piece.end, bool):
            raise UserError(f"examples: {where} line {number} has a value of the wrong type")
        yield piece
