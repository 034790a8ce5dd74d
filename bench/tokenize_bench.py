"""Tokenize throughput and scale: the step's core over a bare SentencePiece encode, and how its
time and memory grow with the corpus (issue 13, item 3).

Corpora of 1, 10 and 100 MB (and 1000 MB with --full) are made by repeating the lines of the
bundled text, shuffled with a fixed seed, into a temporary folder. Each is tokenized by the
step itself (`executor.run`, vocabulary and window of `tiny`, the default worker count) in a
fresh process, which imports TensorFlow first so that its import is not timed. Its core is
the `encode` and `write` stages: the second read, encode on the worker processes, windows,
GZIP TFRecord shards, as the step's own progress events time them; listing, the checking read
and the tokenizer's training come before and are reported apart.

The reference is a bare `sentencepiece` encode of the same corpus's first REFERENCE_MB, on one
thread, line by line (the fastest way to call it: a whole 1 MiB string encodes about half as
fast), in a fresh process that loads nothing else (TensorFlow in the same process slows it).
Memory is each process's own peak (VmHWM: ru_maxrss would count what a child inherited from
its parent at exec) and the sum over the step and its workers, sampled every SAMPLE_S.
Timing on a shared machine moves by tens of percent: compare ratios. At 100 MB, the target's
size, the step runs twice between two references (A B B A) and each side's best counts, as
peer_bench keeps each side's best run. The details also give CPU seconds per MB, of the core's
processes together and of the bare encode, which other load on the machine moves far less than
wall time.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.results import Figure, Target

TIER = "quick"
QUICK_MB = (1, 10, 100)
FULL_MB = (1000,)
REFERENCE_MB = 10  # of each corpus, encoded bare for the reference
# Runs of the step at these sizes (else one), between two bare references (A B B A): the
# target's size, where the ratio ranged 0.63-1.53 across single runs on a shared machine.
ATTEMPTS = {100: 2}
SAMPLE_S = 0.1  # how often the step's memory is sampled
VOCAB_SIZE, SEQ_LEN = 512, 64  # trainer/config.py's `tiny`
SEED = 0
REPO = Path(__file__).resolve().parents[1]
TEXT = REPO / "data" / "tinyshakespeare.txt"
RATIO_TARGET = Target(">=", 1.0)
LINEAR_TARGET = Target(">=", 0.9)  # MB/s at the largest size over the smallest: no slow-down
RSS_TARGET = Target("<=", 1000.0)  # MB, every process of the step together
# Peak RSS at the largest size over at 10 MB. Not 1.0: the tokenizer's sample grows with the
# corpus until it reaches bpe.SAMPLE_BYTES (at about 18 MB of corpus); nothing grows after.
GROWTH_TARGET = Target("<=", 1.1)


def figures(full: bool) -> list[Figure]:
    """The core's speed over the bare encode, its growth with size, and peak memory."""
    m = main(full)
    runs, largest, smallest = m["runs"], m["runs"][-1], m["runs"][0]
    inputs = {k: m[k] for k in ("vocab_size", "seq_len", "workers", "cores", "sizes_MB")}
    rows = [
        Figure(
            name=f"tokenize core MB/s / bare sentencepiece encode MB/s (1 thread), "
            f"{largest['MB']} MB, {m['workers']} workers",
            value=largest["ratio_vs_bare"],
            target=RATIO_TARGET,
            inputs=inputs,
            details=largest,
        )
    ]
    rows += [
        Figure(
            name=f"tokenize core time per MB, {run['MB']} MB",
            value=run["core_s_per_MB"],
            unit="s/MB",
            inputs=inputs,
            details=run,
        )
        for run in runs
    ]
    # Linear time: compared at the same number of encoding processes (a corpus of 1 MB is two
    # chunks, encoded in the step's own process; larger ones on the workers).
    same = [r for r in runs[:-1] if r.get("processes") == largest.get("processes")]
    base = same[0] if same else smallest  # on many cores every size has its own count
    counts = sorted({str(r.get("processes", "?")) for r in (base, largest)})
    rows.append(
        Figure(
            name=f"tokenize core MB/s at {largest['MB']} MB / at {base['MB']} MB, "
            f"{' and '.join(counts)} encoding processes",
            value=largest["core_MBps"] / base["core_MBps"],
            target=LINEAR_TARGET,
            inputs=inputs,
            details={
                "MBps": {r["MB"]: r["core_MBps"] for r in runs},
                "processes": {r["MB"]: r.get("processes") for r in runs},
            },
        )
    )
    rows.append(
        Figure(
            name=f"tokenize peak RSS, step and workers together, {largest['MB']} MB",
            value=largest["peak_total_MB"],
            unit="MB",
            target=RSS_TARGET,
            inputs=inputs,
            details={"peak_total_MB": {r["MB"]: r["peak_total_MB"] for r in runs}},
        )
    )
    at_10 = next((r for r in runs if r["MB"] == 10), smallest)
    rows.append(
        Figure(
            name=f"tokenize peak RSS at {largest['MB']} MB / at {at_10['MB']} MB",
            value=largest["peak_total_MB"] / at_10["peak_total_MB"],
            target=GROWTH_TARGET,
            inputs=inputs,
            details={r["MB"]: {k: v for k, v in r.items() if "peak" in k} for r in runs},
        )
    )
    return rows


def main(full: bool = False) -> dict[str, Any]:
    """Tokenize each corpus size in a fresh process; every measurement, per size."""
    from components.tokenize.encode import default_workers

    sizes = QUICK_MB + (FULL_MB if full else ())
    runs = []
    with tempfile.TemporaryDirectory(prefix="tokenize-bench-") as tmp:
        model = reference_tokenizer(Path(tmp))
        for mb in sizes:
            corpus = make_corpus(Path(tmp) / f"corpus-{mb}MB.txt", mb)
            bares, steps = [bare_encode_mbps(corpus, model, min(mb, REFERENCE_MB))], []
            for attempt in range(ATTEMPTS.get(mb, 1)):
                out = Path(tmp) / f"examples-{mb}MB-{attempt}"
                steps.append(run_step(corpus, out))
                shutil.rmtree(out)  # the disk holds one output at a time
            if len(steps) > 1:  # A B B A: the reference again after the step's runs
                bares.append(bare_encode_mbps(corpus, model, min(mb, REFERENCE_MB)))
            runs.append(measured(mb, steps, bares))
            corpus.unlink()  # and one size at a time
    return {
        "vocab_size": VOCAB_SIZE,
        "seq_len": SEQ_LEN,
        "workers": default_workers(),
        "cores": os.cpu_count(),
        "sizes_MB": list(sizes),
        "runs": runs,
    }


def measured(mb: int, steps: list[dict], bares: list[tuple[float, float]]) -> dict[str, Any]:
    """One size's figures from its step runs and bare references: each side's best (the
    step's shortest core time, the reference's highest MB/s), as peer_bench keeps each side's
    best run, so that other load on a shared machine in one run weighs less; memory the
    highest peak of any run."""
    step = min(steps, key=_core_s)
    core_s = _core_s(step)
    bare, bare_per_cpu_s = max(bares)
    peaks = {k: max(s[k] for s in steps) for k in step if k.startswith("peak_")}
    return {
        "MB": mb,
        **step,
        **peaks,
        "attempts": len(steps),
        "core_s": core_s,
        "core_s_samples": [_core_s(s) for s in steps],
        "core_s_per_MB": core_s / mb,
        "core_MBps": mb / core_s,
        "bare_MBps": bare,
        "bare_MBps_samples": [b for b, _ in bares],
        "ratio_vs_bare": mb / core_s / bare,
        # CPU seconds per MB: all the core's processes, and the bare encode's.
        "core_cpu_s_per_MB": step["core_cpu_s"] / mb,
        "bare_cpu_s_per_MB": 1 / bare_per_cpu_s,
    }


def _core_s(step: dict) -> float:
    """The step's core: its encode and write stages (the module's docstring)."""
    return float(step["stages_s"]["encode"] + step["stages_s"]["write"])


def make_corpus(path: Path, mb: int) -> Path:
    """`mb` MB of the bundled text's lines, each pass over them shuffled (fixed seed)."""
    lines = TEXT.read_text(encoding="utf-8").split("\n")
    rng = random.Random(SEED)
    left = mb * 10**6
    with path.open("w", encoding="utf-8") as f:
        while left > 0:
            rng.shuffle(lines)
            block = ("\n".join(lines) + "\n").encode("utf-8")[:left]
            block = block[: block.rfind(b"\n") + 1] or block
            f.write(block.decode("utf-8"))
            left -= len(block)
    return path


def bare_encode_mbps(corpus: Path, model: Path, mb: int) -> tuple[float, float]:
    """MB per second and per CPU second of SentencePiece alone on the corpus's first `mb` MB
    (see _BARE)."""
    done = subprocess.run(
        [sys.executable, "-c", _BARE, str(corpus), str(model), str(mb)],
        capture_output=True,
        text=True,
        check=True,
    )
    wall, cpu = done.stdout.strip().splitlines()[-1].split()
    return float(wall), float(cpu)


# A bare encode in a fresh process that imports nothing but sentencepiece: with TensorFlow
# loaded in the same process, SentencePiece encodes about 30% slower here.
_BARE = """
import sys, time
import sentencepiece as spm
corpus, model, mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
processor = spm.SentencePieceProcessor(model_file=model)
with open(corpus, encoding="utf-8") as f:
    texts = [f.read(1 << 20) for _ in range(mb)]
size = sum(len(t.encode("utf-8")) for t in texts)
pieces = [t.split("\\n") for t in texts]
started, used = time.perf_counter(), time.process_time()
for lines in pieces:
    processor.encode(lines, num_threads=1)
print(size / 1e6 / (time.perf_counter() - started), size / 1e6 / (time.process_time() - used))
"""


def reference_tokenizer(folder: Path) -> Path:
    """A tokenizer trained as the step trains one, on the bundled text's train part."""
    from components.tokenize import bpe

    text = TEXT.read_text(encoding="utf-8")
    model = bpe.train(text[: int(len(text) * 0.9)], VOCAB_SIZE, str(TEXT), lambda line: None)
    path = folder / "reference.model"
    path.write_bytes(model)
    return path


# The step in a fresh process: TensorFlow imported first (not timed), each stage timed from
# its first progress event (none done) to its last (all done), memory sampled meanwhile.
_STEP = """
import json, resource, sys, threading, time
from pathlib import Path
import tensorflow
from components.tokenize import executor
from contracts.progress import Progress

def status(pid, key):
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) >> 10  # kB -> MB
    except OSError:
        pass
    return 0

def children():
    found = []
    for task in Path("/proc/self/task").iterdir():
        try:
            found += (task / "children").read_text().split()
        except OSError:
            pass
    return found

def cpu(who):
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime

class Clock(Progress):
    def __init__(self):
        super().__init__(None, "tokenize")
        self.stages, self.cpu, self.notes = {}, {}, []
    def update(self, done, total, unit, *, final=False, **numbers):
        now, used = time.perf_counter(), cpu(resource.RUSAGE_SELF)
        self.stages.setdefault(numbers.get("stage"), [now, now])[1] = now
        self.cpu.setdefault(numbers.get("stage"), [used, used])[1] = used
    def note(self, text):
        self.notes.append(text)

peak = {"total": 0, "worker": 0}
done = threading.Event()
def sample():
    while not done.wait(float(sys.argv[3])):
        pids = children()
        total = status("self", "VmRSS") + sum(status(p, "VmRSS") for p in pids)
        peak["total"] = max(peak["total"], total)
        peak["worker"] = max([peak["worker"]] + [status(p, "VmHWM") for p in pids])
threading.Thread(target=sample, daemon=True).start()
clock = Clock()
children_cpu = cpu(resource.RUSAGE_CHILDREN)
started = time.perf_counter()
manifest = executor.run(
    sys.argv[1], sys.argv[2], vocab_size=int(sys.argv[4]), seq_len=int(sys.argv[5]),
    progress=False, reporter=clock,
)
wall = time.perf_counter() - started
done.set()
encoding = next((n for n in clock.notes if n.startswith("encoding ")), "")
print(json.dumps({
    "wall_s": wall,
    # how many processes encoded: "encoding N chunks on P worker processes" or "in this process"
    "processes": int(encoding.split(" on ")[1].split()[0]) if " on " in encoding else 1,
    "stages_s": {k: v[1] - v[0] for k, v in clock.stages.items()},
    # CPU seconds of the core: this process's in the encode and write stages, and its
    # workers' (they run only then).
    "core_cpu_s": sum(clock.cpu[k][1] - clock.cpu[k][0] for k in ("encode", "write"))
    + cpu(resource.RUSAGE_CHILDREN) - children_cpu,
    "peak_step_MB": status("self", "VmHWM"),
    "peak_worker_MB": peak["worker"],
    "peak_total_MB": max(peak["total"], status("self", "VmHWM")),
    "tokens": manifest.total("tokens"),
    "windows": manifest.total("windows"),
    "shards_MB": sum(p.stat().st_size for p in Path(sys.argv[2]).rglob("*.gz")) / 1e6,
}))
"""


def run_step(corpus: Path, out: Path) -> dict[str, Any]:
    """The tokenize step on `corpus` in a fresh process: its stage times and peak memory."""
    args = [str(corpus), str(out), str(SAMPLE_S), str(VOCAB_SIZE), str(SEQ_LEN)]
    done = subprocess.run(
        [sys.executable, "-c", _STEP, *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"tokenize on {corpus.name} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    from bench.results import markdown_table

    print(markdown_table(figures(full="--full" in sys.argv[1:])))
