"""Helpers for tests that start real processes: is a pid still running?"""

from pathlib import Path


def alive(pid: int) -> bool:
    """True if `pid` runs (a zombie, which only waits for its parent to reap it, is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"
