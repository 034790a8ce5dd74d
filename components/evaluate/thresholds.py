"""The blessing thresholds' valid ranges, checked wherever they enter: `gptpipe kfp run` and
`schedule` before a run exists, `gptpipe run --local` before any step, and evaluate itself, since
a NaN threshold would bless every model and a tolerance over 1 is a percentage typed as a
fraction. TensorFlow-free, so the CLI can import it cheaply."""

from __future__ import annotations

import math

from contracts.errors import UserError


def check_thresholds(max_nats_per_char: object, tolerance: object, prefix: str = "") -> None:
    """Raise UserError naming `<prefix>max_nats_per_char` or `<prefix>tolerance` if invalid.

    Values that are not numbers are left to the caller's type checks (None: not given).
    """
    if _number(max_nats_per_char) and not (
        math.isfinite(max_nats_per_char) and max_nats_per_char > 0  # type: ignore[arg-type,operator]
    ):
        raise UserError(
            f"{prefix}max_nats_per_char={max_nats_per_char}: the blessing threshold is a "
            "positive, finite loss in nats per character; pass one such as 2.2"
        )
    if _number(tolerance) and not (
        math.isfinite(tolerance) and 0 <= tolerance <= 1  # type: ignore[arg-type,operator]
    ):
        raise UserError(
            f"{prefix}tolerance={tolerance}: the regression allowed against the baseline is a "
            "fraction in [0, 1]; pass one such as 0.01 (1%)"
        )


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
