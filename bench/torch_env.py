"""The PyTorch peer's own virtual environment: torch (the CPU build), made and cached here.

The trainer's venv has no PyTorch, and should not: the peer runs in `bench/.torch-venv/`, made
by bench/peer_env.py's `ensure` with pip from the package registry, reused while PINS is
unchanged. `pip install --dry-run torch==2.13.0` in a fresh venv resolves to the CPU build,
2.13.0+cpu, with sympy, networkx, jinja2, filelock and fsspec (no numpy, no CUDA libraries).
Where pip cannot install it, `ensure` raises one line naming the venv, the pins and pip's
last words, which `python -m bench` shows as the benchmark's failed row.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from bench import peer_env

VENV = peer_env.BENCH / ".torch-venv"
PINS = ("torch==2.13.0",)
SCRIPT = peer_env.BENCH / "peer_torch.py"  # what the torch venv runs


def run(args: list[str], timeout_s: float, threads: int) -> dict[str, Any]:
    """Run bench/peer_torch.py in the torch venv with `args`; return the JSON it prints last.

    It sees only its own site-packages (no PYTHONPATH), and `threads` intra- and inter-op
    threads, as the trainer's side gets."""
    exe = peer_env.ensure(VENV, PINS)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = str(threads)  # before torch starts its pool: the same as set below
    command = [str(exe), str(SCRIPT), *args, "--threads", str(threads)]
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=timeout_s, cwd=peer_env.BENCH
    )
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"torch peer exited {done.returncode}: {' | '.join(tail)}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


if __name__ == "__main__":
    print(peer_env.ensure(VENV, PINS))
