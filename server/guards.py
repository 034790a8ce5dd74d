"""The checks this server makes on a predict request before it runs the graph, which TF
Serving does not make (it hands every well-formed tensor to the session).

- `max_new_tokens`: each generated token is a forward pass, so one request for millions would
  hold a CPU for hours, and a negative count is meaningless. An input of that name must be
  0 to the cap (`gptpipe serve --max-new-tokens-cap`), checked here so a bad count is a 400
  before any work, whichever model version is served.
- text: a DT_STRING input is text the model tokenizes, unless its name ends in `_bytes` (TF
  Serving's own mark of binary strings, json_tensor.cc's kBytesTensorNameSuffix). A JSON
  string always is UTF-8; a `{"b64": ...}` value need not be, and bytes that are not UTF-8
  would be scored or continued as byte pieces no text has: refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from server.json_tensor import BYTES_SUFFIX, Tensor
from server.status import invalid_argument

MAX_NEW_TOKENS_INPUT = "max_new_tokens"  # the generate signatures' input (trainer/export.py)
DEFAULT_MAX_NEW_TOKENS_CAP = 1024  # the most tokens one request may ask for, by default


@dataclass(frozen=True)
class Limits:
    """What one request may ask of the server."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS_CAP  # the most tokens one request generates


def check(inputs: Mapping[str, Tensor], limits: Limits) -> None:
    """Raise INVALID_ARGUMENT for a request this server refuses to run (module docstring)."""
    count = inputs.get(MAX_NEW_TOKENS_INPUT)
    if count is not None and count.dtype.startswith("DT_INT"):
        for value in count.values:
            if not 0 <= value <= limits.max_new_tokens:
                raise invalid_argument(
                    f"{MAX_NEW_TOKENS_INPUT} is {value}: this server generates 0 to "
                    f"{limits.max_new_tokens} tokens a request (gptpipe serve "
                    "--max-new-tokens-cap)"
                )
    for name, tensor in sorted(inputs.items()):
        if tensor.dtype == "DT_STRING" and not name.endswith(BYTES_SUFFIX):
            _check_text(name, tensor)


def _check_text(name: str, tensor: Tensor) -> None:
    for index, value in enumerate(tensor.values):
        try:
            value.decode("utf-8")
        except UnicodeDecodeError as err:
            raise invalid_argument(
                f"input {name}: element {index} is not UTF-8 text (byte 0x{value[err.start]:02x} "
                f"at offset {err.start}); the model reads {name} as text: send UTF-8, as a JSON "
                'string or {"b64": ...} of UTF-8 bytes'
            ) from None
