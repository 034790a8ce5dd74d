"""The one error type for mistakes a user can make: bad config, bad corpus, bad paths."""


class UserError(ValueError):
    """An error caused by user input. Its message names the input and the fix.

    The CLI prints the message alone (no traceback) and exits with status 2.
    """
