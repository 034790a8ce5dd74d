"""The one error type for mistakes a user can make (bad config, bad corpus, bad paths), and the
edge that prints one as a single line."""

import contextlib
import sys
from collections.abc import Iterator


class UserError(ValueError):
    """An error caused by user input. Its message names the input and the fix.

    The CLI and each pipeline step print the message alone (no traceback) and exit with 2.
    """


@contextlib.contextmanager
def one_line_errors(who: str) -> Iterator[None]:
    """At a program's edge: a UserError in the block becomes `<who>: error: <message>` on
    stderr and exit status 2, so a step's log ends with the fix, not a traceback."""
    try:
        yield
    except UserError as err:
        print(f"{who}: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
