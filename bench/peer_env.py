"""The peer's own virtual environment: Keras 3 + KerasHub on TensorFlow, made and cached here.

The trainer runs on tf-keras 2.19; KerasHub needs Keras 3. They cannot share a process (both
register as `tf.keras`), so the peer runs in `bench/.peer-venv/`, a venv this module makes with
`python -m venv` and pip from the package registry, and reuses while its pin set is unchanged.

PINS was chosen with `pip install --dry-run keras-hub keras "tensorflow==2.19.*"` in a fresh
venv: keras-hub 0.31.0 resolves beside tensorflow 2.19.1 and keras 3.15.1 (it also brings
sentencepiece and tensorflow-text, which the quality benchmark's peer uses). No model weights
are downloaded: the peer is built from a config (random init), never `from_preset`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
VENV = BENCH / ".peer-venv"
PINS = ("keras-hub==0.31.0", "keras==3.15.1", "tensorflow==2.19.1")
STAMP = "pins.json"  # in the venv: the pin set it was made with, written last
PEER_SCRIPT = BENCH / "peer_gpt2.py"  # what the peer venv runs
INSTALL_TIMEOUT_S = 1800


def pins_key(pins: tuple[str, ...] = PINS) -> str:
    """A short digest of a pin set (order-free): the cache key of the venv."""
    return hashlib.sha256("\n".join(sorted(pins)).encode()).hexdigest()[:16]


def python(venv: Path = VENV) -> Path:
    """The interpreter inside a venv."""
    return venv / "bin" / "python"


def _is_current(venv: Path, pins: tuple[str, ...]) -> bool:
    stamp = venv / STAMP
    if not stamp.is_file() or not python(venv).exists():
        return False
    try:
        return json.loads(stamp.read_text()).get("key") == pins_key(pins)
    except ValueError:
        return False


def ensure(venv: Path = VENV, pins: tuple[str, ...] = PINS, say=print) -> Path:
    """The venv's python, making the venv first when it is missing or has other pins (the
    KerasHub peer's by default; bench/torch_env.py passes the PyTorch peer's)."""
    if _is_current(venv, pins):
        return python(venv)
    say(f"making the venv {venv} with {' '.join(pins)} (once; a few minutes)")
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    done = subprocess.run(
        [str(python(venv)), "-m", "pip", "install", "--quiet", *pins],
        capture_output=True,
        text=True,
        env=env,
        timeout=INSTALL_TIMEOUT_S,
    )
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise RuntimeError(
            f"could not make {venv.name} with {' '.join(pins)} (pip exited {done.returncode}): "
            f"{tail}"
        )
    (venv / STAMP).write_text(json.dumps({"key": pins_key(pins), "pins": sorted(pins)}) + "\n")
    return python(venv)


def run_peer(
    args: list[str],
    timeout_s: float,
    threads: int | None = None,
    extra_env: dict[str, str] | None = None,
    script: Path = PEER_SCRIPT,
) -> dict:
    """Run `script` (bench/peer_gpt2.py) in the peer venv with `args`; return the JSON it
    prints last.

    The environment is this one's minus anything that would make the peer pick tf-keras or the
    project's packages (it must see only its own site-packages), with `extra_env` over it.
    """
    exe = ensure()
    env = {k: v for k, v in os.environ.items() if k not in ("TF_USE_LEGACY_KERAS", "PYTHONPATH")}
    env.update({"KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2", **(extra_env or {})})
    command = [str(exe), str(script), *args]
    if threads:
        command += ["--threads", str(threads)]
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=timeout_s, cwd=BENCH
    )
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"peer exited {done.returncode}: {' | '.join(tail)}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(ensure())
