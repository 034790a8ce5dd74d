"""Evaluate's peak memory against the eval text's size: 100 MB over 10 MB of eval text.

Each size runs in its own process (`python -m bench.eval_memory_bench --child FILE`), which
streams a generated eval text (contracts/eval_text.py: documents of 1 to 200 lines, pieces of
16 lines) through evaluate's own path, `components.evaluate.scoring.score_eval_text`, with the
overlap count against a train-text sketch on the same pass. Its peak RSS is the child's
`ru_maxrss` from `os.wait4`. The scorer stands in for the SavedModel's `score` signature (a
sum over each batch's characters): the model's memory per batch does not depend on the eval
size, and scoring 100 MB through a model on CPU would take hours. The target: at most 1.1x.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.results import Figure, Target

SIZES_MB = (10, 100)  # the eval texts compared: the larger's peak over the smaller's
TIER = "quick"


def write_eval_text(path: Path, megabytes: int, seed: int = 0) -> int:
    """Write about `megabytes` MB of eval text to `path`; returns its bytes of document text."""
    from contracts.eval_text import EvalPiece, piece_line

    rng = random.Random(seed)
    size = 0
    with path.open("wb") as f:
        while size < megabytes * 1_000_000:
            lines = [
                f"line {i} " + "x" * rng.randint(0, 120) + "\n" for i in range(rng.randint(1, 200))
            ]
            for start in range(0, len(lines), 16):
                text = "".join(lines[start : start + 16])
                f.write(piece_line(EvalPiece(text, start + 16 >= len(lines))))
                size += len(text)
    return size


def child(path: str) -> None:
    """Score the eval text at `path` as evaluate does (see the module's docstring)."""
    from components import overlap
    from components.evaluate import scoring

    sketch = overlap.Sketch()
    sketch.add("".join(f"line {i} " + "x" * 40 + "\n" for i in range(1000)).encode())
    seen = overlap.SeenCount.of(sketch.to_bytes())

    def score(batch: list[str]) -> tuple[float, int, int]:
        chars = sum(len(s) for s in batch)
        return 0.5 * chars, chars, chars

    scoring.score_eval_text(score, path, seen)
    assert seen is not None and seen.result() is not None


def peak_rss_kib(path: Path) -> int:
    """The peak RSS (KiB) of a child process that scores the eval text at `path`."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    cmd = [sys.executable, "-m", "bench.eval_memory_bench", "--child", str(path)]
    process = subprocess.Popen(cmd, env=env)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise RuntimeError(f"the scoring child failed with exit status {process.returncode}")
    return int(usage.ru_maxrss)


def figures(full: bool) -> list[Figure]:
    """The peak RSS at SIZES_MB[1] MB of eval text over that at SIZES_MB[0] MB."""
    with tempfile.TemporaryDirectory(prefix="eval-memory-") as tmp:
        peaks, sizes = {}, {}
        for megabytes in SIZES_MB:
            path = Path(tmp) / f"eval-{megabytes}.jsonl"
            sizes[megabytes] = write_eval_text(path, megabytes, seed=megabytes)
            peaks[megabytes] = peak_rss_kib(path)
            path.unlink()
    small, large = SIZES_MB
    return [
        Figure(
            f"evaluate peak RSS, {large} MB / {small} MB of eval text",
            peaks[large] / peaks[small],
            target=Target("<=", 1.1),
            inputs={"sizes_MB": list(SIZES_MB), "text_bytes": sizes},
            details={"peak_rss_KiB": peaks},
        )
    ]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"] and len(sys.argv) == 3:
        child(sys.argv[2])
    else:
        print(figures(full=False))
