"""Tokenize at scale (issue 36): a generated .jsonl.zst corpus through the step in parts.

The corpus: a large size (100 MB; 1000 MB with --full) of document text and a small one (20 MB;
100 MB with --full), as JSONL lines `{"text": ...}` compressed with zstandard into FILES files,
made in a temporary folder from the bundled text with a fixed seed: each document is a span of
it starting at a line, its length lognormal between 200 B and 50 KB. Each file is one unit
(`tokenize.unit_bytes` = UNIT_BYTES: its default, 64 MiB of listed bytes, would make the quick
tier's corpus, tens of MB compressed, a single unit with nothing for parts to share; a corpus of
64 MiB files is cut the same way), so units and parts here share the work as a large corpus's
would.

Each run is the step itself (`executor.run`, vocabulary and window of `tiny`, its tokenizer
trained as usual) in a fresh process that imports nothing else. Its stages are timed from the
progress events it reports (`read`: phase 1, `encode`: phase 2, `write`: the merge), from the
first (none done) to the last (all done); CPU seconds of the step and its parts are taken over
the same stages. Memory is each process's own peak (VmHWM, sampled every SAMPLE_S): the sum of
the step's and its parts' of one phase (what is resident at once, at most), and the largest.

- Throughput per encoding process: the encode phase on 1 part (in the step's own process)
  over a bare SentencePiece encode of the first REFERENCE_MB of the same documents' text, line
  by line on one thread, in a fresh process that loads sentencepiece (and zstandard and json to
  read the text, untimed), with the tokenizer the step trained.
- Scaling: the encode phase's wall time on 1 part over on 2 parts (local processes).
- Memory: on 2 parts, the peaks at the large size over at the small, and the sum at the large.
- Identity: every file's sha256 of the Examples from 4 parts (small size) and 2 parts (both
  sizes) against 1 part's; the figure counts the files that differ on 4 parts, held to zero.
- The 1 TB estimate on a 16-pod Indexed Job, from the per-part rates measured here and the
  assumptions in `Cluster` (docs/benchmarks.md, "Tokenize at scale").

At the large size the runs alternate 1 part, bare, 2 parts, 2 parts, bare, 1 part, so that both
ratios are A B B A, and each side's best run counts (as peer_bench). Timing on a shared
machine moves by tens of percent: read the ratios, and the CPU seconds beside them, which other
load moves far less. Scaling shows only on an idle machine with 2 free cores.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.results import Figure, Target

TIER = "quick"
# (small, large) MB of document text in the quick and full tiers. The small size is above what
# grows with a small corpus: the tokenizer's sample reaches bpe.SAMPLE_BYTES at about 18 MB,
# and each of the FILES units fills a chunk (1 MiB) to encode at 16 MB.
SIZES_MB = {False: (20, 100), True: (100, 1000)}
FILES = 16  # of the corpus, each one unit
DOC_BYTES = (200, 50_000)  # a document's length, at least and at most
DOC_MEDIAN, DOC_SIGMA = 2000, 1.0  # its lognormal distribution: median bytes, sigma of the log
REFERENCE_MB = 10  # of the documents' text, encoded bare for the reference
SAMPLE_S = 0.1  # how often memory is sampled
UNIT_BYTES = 1  # the step's tokenize.unit_bytes here: every file is a unit of its own
VOCAB_SIZE, SEQ_LEN = 512, 64  # trainer/config.py's `tiny`
SEED = 0
REPO = Path(__file__).resolve().parents[1]
TEXT = REPO / "data" / "tinyshakespeare.txt"
RATIO_TARGET = Target(">=", 1.0)  # encode MB/s per part over the bare encode's
SCALING_TARGET = Target(">=", 1.8)  # encode wall time on 1 part over on 2
GROWTH_TARGET = Target("<=", 1.1)  # peak RSS at the large size over at the small
RSS_TARGET = Target("<=", 1000.0)  # MB, the step and its parts together
IDENTICAL_TARGET = Target("<=", 0)  # files that differ (results.Target has no "==")


@dataclass(frozen=True)
class Cluster:
    """What the 1 TB estimate assumes besides the rates measured here."""

    text_bytes: float = 1e12  # the corpus's document text
    pods: int = 16  # parts of the Indexed Job, one pod each
    pod_cpus: int = 2  # per pod: the part's process, and one for gzip, GCS and the OS
    gcs_MBps: float = 100.0  # GCS read bandwidth of one pod (one stream at a time)
    compression: float = 3.0  # text bytes per stored byte of a real .jsonl.zst corpus
    copy_s: float = 0.1  # one server-side copy (a rewrite within the bucket, no data moved)
    copies_per_shard: int = 2  # the merge: work folder to staging, staging to the Examples
    copy_threads: int = 8  # components/storage/gcs.py's WORKERS
    pod_start_s: float = 60.0  # per phase: schedule the pods, start the image (pulled)
    unit_bytes: int = 64 << 20  # tokenize.unit_bytes's default, of stored bytes
    shard_windows: int = 4096  # executor.DEFAULT_SHARD_WINDOWS


def figures(full: bool) -> list[Figure]:
    """Throughput per part, scaling, memory, identity and the 1 TB estimate."""
    m = main(full)
    small, large = m["small"], m["large"]
    inputs = {k: m[k] for k in ("vocab_size", "seq_len", "files", "cores", "sizes_MB")}
    mb = large["MB"]
    rows = [
        Figure(
            name=f"tokenize encode MB/s, 1 part / bare sentencepiece MB/s (1 thread), "
            f"{mb} MB .jsonl.zst",
            value=large["ratio_vs_bare"],
            target=RATIO_TARGET,
            inputs=inputs,
            details=speed_details(large),
        ),
        Figure(
            name=f"tokenize encode wall time, 1 part / 2 parts, {mb} MB",
            value=large["scaling"],
            target=SCALING_TARGET,
            inputs=inputs,
            details=scaling_details(large) | {"load": [m["load_before"], m["load_after"]]},
            note=f"{m['cores']} cores, load {m['load_before']:.1f}-{m['load_after']:.1f}",
        ),
    ]
    rows += memory_figures(small, large, inputs)
    rows.append(identity_figure(small, large, inputs))
    rows.append(estimate_figure(large, inputs))
    return rows


def main(full: bool = False, sizes: tuple[int, int] | None = None) -> dict[str, Any]:
    """Every measurement: the small corpus on 1, 4 and 2 parts, the large one as the module's
    docstring alternates its runs."""
    small_mb, large_mb = sizes or SIZES_MB[full]
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="tokenize-bench-") as tmp:
        work = Path(tmp)
        corpus = make_corpus(work / f"corpus-{small_mb}MB", small_mb)
        small = {
            "MB": small_mb,
            "corpus": corpus_info(corpus),
            "runs": {p: [run_step(corpus, work / f"out-{p}", p)] for p in (1, 4, 2)},
        }
        shutil.rmtree(corpus)  # the disk holds one corpus at a time
        corpus = make_corpus(work / f"corpus-{large_mb}MB", large_mb)
        runs: dict[int, list[dict]] = {1: [], 2: []}
        bares: list[tuple[float, float]] = []
        model = work / "tokenizer.model"
        for who in (1, "bare", 2, 2, "bare", 1):
            if who == "bare":
                bares.append(bare_encode(corpus, model, min(large_mb, REFERENCE_MB)))
            else:
                runs[who].append(run_step(corpus, work / "out", who, keep_model=model))
        large = {"MB": large_mb, "corpus": corpus_info(corpus), "runs": runs, "bares": bares}
    return {
        "vocab_size": VOCAB_SIZE,
        "seq_len": SEQ_LEN,
        "files": FILES,
        "cores": os.cpu_count(),
        "sizes_MB": [small_mb, large_mb],
        "load_before": load,
        "load_after": os.getloadavg()[0],
        "small": small,
        "large": summarize(large),
    }


def summarize(large: dict[str, Any]) -> dict[str, Any]:
    """The large corpus's ratios from its runs: each side's best (shortest encode phase, the
    reference's highest MB/s), so that other load in one run weighs less."""
    one, two = (min(large["runs"][p], key=_encode_s) for p in (1, 2))
    bare, _ = max(large["bares"])
    mb = large["MB"]
    return {
        **large,
        "best": {1: one, 2: two},
        "encode_MBps": mb / _encode_s(one),
        "bare_MBps": bare,
        "ratio_vs_bare": mb / _encode_s(one) / bare,
        "scaling": _encode_s(one) / _encode_s(two),
    }


def _encode_s(run: dict) -> float:
    return float(run["stages_s"]["encode"])


def speed_details(large: dict[str, Any]) -> dict[str, Any]:
    one, mb = large["best"][1], large["MB"]
    return {
        "encode_MBps": large["encode_MBps"],
        "bare_MBps": large["bare_MBps"],
        "encode_s_samples": [_encode_s(r) for r in large["runs"][1]],
        "bare_MBps_samples": [b for b, _ in large["bares"]],
        # CPU seconds per MB of text: the encode phase's (reading included), the bare encode's
        "encode_cpu_s_per_MB": one["stages_cpu_s"]["encode"] / mb,
        "bare_cpu_s_per_MB": 1 / max(per_cpu for _, per_cpu in large["bares"]),
        "corpus": large["corpus"],
    }


def scaling_details(large: dict[str, Any]) -> dict[str, Any]:
    return {
        str(p): {
            "encode_s_samples": [_encode_s(r) for r in large["runs"][p]],
            "encode_cpu_s_samples": [r["stages_cpu_s"]["encode"] for r in large["runs"][p]],
            "stages_s": large["best"][p]["stages_s"],
            "units": large["best"][p]["units"],
        }
        for p in (1, 2)
    }


def memory_figures(small: dict, large: dict, inputs: dict) -> list[Figure]:
    """Peak RSS on 2 parts: its growth from the small corpus to the large, and its size."""
    at = {"small": _peaks(small["runs"][2]), "large": _peaks(large["runs"][2])}
    sizes = f"{large['MB']} MB / at {small['MB']} MB"
    return [
        Figure(
            name=f"tokenize peak RSS, step + 2 parts summed, at {sizes}",
            value=at["large"]["peak_sum_MB"] / at["small"]["peak_sum_MB"],
            target=GROWTH_TARGET,
            inputs=inputs,
            details=at,
        ),
        Figure(
            name=f"tokenize peak RSS, largest process, at {sizes}",
            value=at["large"]["peak_largest_MB"] / at["small"]["peak_largest_MB"],
            target=GROWTH_TARGET,
            inputs=inputs,
            details=at,
        ),
        Figure(
            name=f"tokenize peak RSS, step + 2 parts summed, {large['MB']} MB",
            value=at["large"]["peak_sum_MB"],
            unit="MB",
            target=RSS_TARGET,
            inputs=inputs,
            details=at,
        ),
    ]


def _peaks(runs: list[dict]) -> dict[str, Any]:
    """The highest peaks of any of `runs`."""
    keys = ("peak_step_MB", "peak_sum_MB", "peak_largest_MB")
    return {k: max(r[k] for r in runs) for k in keys} | {"parts_MB": runs[0]["parts_MB"]}


def identity_figure(small: dict, large: dict, inputs: dict) -> Figure:
    """Files of the Examples that differ from 1 part's: 4 parts on the small corpus, 2 parts on
    the large one (every run of it against the first on 1 part)."""
    one = small["runs"][1][0]["digests"]
    compared = {f"{small['MB']} MB, 4 parts": differing(one, small["runs"][4][0]["digests"])}
    compared[f"{small['MB']} MB, 2 parts"] = differing(one, small["runs"][2][0]["digests"])
    first = large["runs"][1][0]["digests"]
    for p in (1, 2):
        for i, run in enumerate(large["runs"][p]):
            compared[f"{large['MB']} MB, {p} parts, run {i}"] = differing(first, run["digests"])
    return Figure(
        name=f"tokenize Examples on 4 parts vs 1 part: files that differ, {small['MB']} MB",
        value=len(compared[f"{small['MB']} MB, 4 parts"]),
        unit="files",
        target=IDENTICAL_TARGET,
        inputs=inputs,
        details={"files": len(one), "differing": compared},
        note="" if not any(compared.values()) else "other runs differ too: see details",
    )


def differing(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """Names whose sha256 differs between two trees, or that only one has."""
    return sorted(name for name in a.keys() | b.keys() if a.get(name) != b.get(name))


def tree_digests(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder`, by its relative name."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def estimate_figure(large: dict, inputs: dict) -> Figure:
    """The 1 TB estimate from 1 part's best run on the large corpus."""
    one, mb = large["best"][1], large["MB"]
    rates = {
        "read_MBps": mb / one["stages_s"]["read"],
        "encode_MBps": mb / one["stages_s"]["encode"],
        "tokenizer_s": one["between_s"],
        "windows_per_MB": one["windows"] / mb,
    }
    cluster = Cluster()
    estimate = extrapolate(cluster, **rates)
    # The same corpus at seq_len 1024 (GPT-2's): 16 times fewer windows of 16 times the tokens,
    # so 16 times fewer shards to copy.
    longer = dict(rates, windows_per_MB=rates["windows_per_MB"] * SEQ_LEN / 1024)
    return Figure(
        name=f"tokenize 1 TB on a {cluster.pods}-pod Indexed Job (extrapolated), seq_len {SEQ_LEN}",
        value=estimate["total_s"] / 3600,
        unit="h",
        inputs=inputs,
        details={
            "measured": rates,
            "assumed": asdict(cluster),
            "estimate": estimate,
            "estimate_at_seq_len_1024": extrapolate(cluster, **longer),
        },
    )


def extrapolate(
    c: Cluster,
    *,
    read_MBps: float,
    encode_MBps: float,
    tokenizer_s: float,
    windows_per_MB: float,
) -> dict[str, float]:
    """Seconds of each stage of tokenizing `c.text_bytes` on `c.pods` pods, each as fast as
    one part here or as its GCS reads allow (both phases read every byte), and of the merge,
    which copies every shard `c.copies_per_shard` times server-side."""
    text_MB = c.text_bytes / 1e6
    per_pod_MB = text_MB / c.pods
    gcs_text_MBps = c.gcs_MBps * c.compression  # text MB/s that the stored bytes carry
    units = math.ceil(c.text_bytes / c.compression / c.unit_bytes)
    # Each unit ends each split with a shard not yet full.
    shards = windows_per_MB * text_MB / c.shard_windows + 2 * units
    stages = {
        "start_s": 2 * c.pod_start_s,
        "phase1_s": per_pod_MB / min(read_MBps, gcs_text_MBps),
        "tokenizer_s": tokenizer_s,
        "phase2_s": per_pod_MB / min(encode_MBps, gcs_text_MBps),
        "merge_s": shards * c.copies_per_shard * c.copy_s / c.copy_threads,
    }
    return {**stages, "units": units, "shards": shards, "total_s": math.fsum(stages.values())}


# ---- the corpus -----------------------------------------------------------------------------


def make_corpus(folder: Path, mb: int) -> Path:
    """`mb` MB of document text as FILES .jsonl.zst files in `folder` (the module's docstring)."""
    import zstandard

    text = TEXT.read_text(encoding="utf-8")
    starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n" and i + 1 < len(text)]
    rng = random.Random(SEED)
    folder.mkdir(parents=True)
    per_file = mb * 10**6 // FILES
    for index in range(FILES):
        lines, size = io.StringIO(), 0
        while size < per_file:
            doc = document(text, starts, rng)
            lines.write(json.dumps({"text": doc}) + "\n")
            size += len(doc)
        data = zstandard.ZstdCompressor(level=3).compress(lines.getvalue().encode("utf-8"))
        (folder / f"part-{index:03d}.jsonl.zst").write_bytes(data)
    return folder


def document(text: str, starts: list[int], rng: random.Random) -> str:
    """A span of `text` from a line start, of lognormal length within DOC_BYTES (the text is
    ASCII: characters are bytes), wrapping round at the end."""
    length = round(rng.lognormvariate(math.log(DOC_MEDIAN), DOC_SIGMA))
    length = min(max(length, DOC_BYTES[0]), DOC_BYTES[1])
    start = rng.choice(starts)
    return (text[start:] + text)[:length]


def corpus_info(folder: Path) -> dict[str, Any]:
    files = sorted(folder.iterdir())
    return {"files": len(files), "stored_MB": sum(f.stat().st_size for f in files) / 1e6}


# ---- the bare reference ---------------------------------------------------------------------


def bare_encode(corpus: Path, model: Path, mb: int) -> tuple[float, float]:
    """MB per second and per CPU second of SentencePiece alone on the first `mb` MB of the
    corpus's document text (see _BARE)."""
    done = subprocess.run(
        [sys.executable, "-c", _BARE, str(corpus), str(model), str(mb)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the bare encode failed: {done.stderr.strip()[-2000:]}")
    wall, cpu = done.stdout.strip().splitlines()[-1].split()
    return float(wall), float(cpu)


# A fresh process that imports sentencepiece, zstandard and json: the documents are read first
# (not timed), then encoded line by line on one thread, about 1 MB of lines per call.
_BARE = """
import json, sys, time
from pathlib import Path
import sentencepiece as spm
import zstandard
corpus, model, mb = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
processor = spm.SentencePieceProcessor(model_file=model)
batches, batch, size, batch_size = [], [], 0, 0
for path in sorted(corpus.iterdir()):
    with zstandard.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["text"]
            batch += text.split("\\n")
            size += len(text.encode("utf-8"))
            if size - batch_size >= 1 << 20:
                batches.append(batch)
                batch, batch_size = [], size
            if size >= mb * 10**6:
                break
    if size >= mb * 10**6:
        break
batches.append(batch)
started, used = time.perf_counter(), time.process_time()
for lines in batches:
    processor.encode(lines, num_threads=1)
print(size / 1e6 / (time.perf_counter() - started), size / 1e6 / (time.process_time() - used))
"""


# ---- the step -------------------------------------------------------------------------------


def run_step(corpus: Path, out: Path, parts: int, keep_model: Path | None = None) -> dict:
    """The tokenize step on `corpus` in a fresh process on `parts` parts: its stage times, CPU
    seconds, peak memory and the sha256 of every file it wrote (the output is then removed;
    its tokenizer is copied to `keep_model` first, if given)."""
    args = [corpus, out, parts, SAMPLE_S, VOCAB_SIZE, SEQ_LEN, UNIT_BYTES]
    done = subprocess.run(
        [sys.executable, "-c", _STEP, *map(str, args)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"tokenize of {corpus.name} on {parts} parts failed: {done.stderr.strip()[-2000:]}"
        )
    run = json.loads(done.stdout.strip().splitlines()[-1])
    run["digests"] = tree_digests(out)
    run["shards"] = sum(1 for name in run["digests"] if name.endswith(".gz"))
    if keep_model is not None:
        from contracts.artifacts import TOKENIZER_FILE

        shutil.copyfile(out / TOKENIZER_FILE, keep_model)
    shutil.rmtree(out)
    return run


# The step in a fresh process (every file its own unit: the module's docstring). A stage runs
# from its first progress event to its last; `between_s` is the tokenizer's training, between
# the read and encode stages. Each child's VmHWM is sampled with the stage it was first seen
# in, so that the parts of one phase are summed together.
_STEP = """
import json, resource, sys, threading, time
from pathlib import Path
from components.tokenize import executor
from contracts.progress import Progress

corpus, out, parts, every, vocab, seq_len, unit_bytes = sys.argv[1:8]

def hwm(pid):
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
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

def cpu():
    return sum(
        u.ru_utime + u.ru_stime
        for u in (resource.getrusage(resource.RUSAGE_SELF),
                  resource.getrusage(resource.RUSAGE_CHILDREN))
    )

class Clock(Progress):
    def __init__(self):
        super().__init__(None, "tokenize")
        self.wall, self.cpu, self.current, self.notes = {}, {}, None, []
    def update(self, done, total, unit, *, final=False, **numbers):
        stage, now, used = numbers.get("stage"), time.perf_counter(), cpu()
        self.current = stage
        self.wall.setdefault(stage, [now, now])[1] = now
        self.cpu.setdefault(stage, [used, used])[1] = used
    def note(self, text):
        self.notes.append(text)

clock = Clock()
seen = {}  # pid: [stage first seen in, peak MB]
finished = threading.Event()
def sample():
    while not finished.wait(float(every)):
        for pid in children():
            entry = seen.setdefault(pid, [clock.current, 0])
            entry[1] = max(entry[1], hwm(pid))
threading.Thread(target=sample, daemon=True).start()
started = time.perf_counter()
manifest = executor.run(
    corpus, out, vocab_size=int(vocab), seq_len=int(seq_len), parts=int(parts),
    unit_bytes=int(unit_bytes), progress=False, reporter=clock,
)
wall = time.perf_counter() - started
finished.set()
by_stage = {}
for stage, peak in seen.values():
    by_stage.setdefault(stage, []).append(peak)
step = hwm("self")
print(json.dumps({
    "wall_s": wall,
    "stages_s": {k: v[1] - v[0] for k, v in clock.wall.items()},
    "stages_cpu_s": {k: v[1] - v[0] for k, v in clock.cpu.items()},
    "between_s": clock.wall["encode"][0] - clock.wall["read"][1],
    "units": next(n for n in clock.notes if " units, on " in n),
    "peak_step_MB": step,
    "parts_MB": by_stage,
    "peak_sum_MB": step + max([sum(p) for p in by_stage.values()] + [0]),
    "peak_largest_MB": max([step] + [max(p) for p in by_stage.values()]),
    "tokens": manifest.total("tokens"),
    "windows": manifest.total("windows"),
}))
"""


if __name__ == "__main__":
    from bench.results import markdown_table

    print(markdown_table(figures(full="--full" in sys.argv[1:])))
