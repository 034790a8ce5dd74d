"""A benchmark's measurement in a fresh process: `python -m bench.<module> ARGS`, as JSON.

A fresh process gets its own TensorFlow thread settings and allocator, and its peak memory is
its own (bench/proc_memory.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run(module: str, *args: str, timeout_s: float) -> dict[str, Any]:
    """The JSON a fresh `python -m bench.<module> ARGS` prints last; a failure raises, with the
    child's stderr tail."""
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        "TF_USE_LEGACY_KERAS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    cmd = [sys.executable, "-m", f"bench.{module}", *args]
    done = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if done.returncode:
        raise RuntimeError(f"{module} {' '.join(args)}: the child failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
