"""Encode text to token ids in worker processes, in input order, with bounded work in flight.

A corpus of GBs is encoded by processes, each loading the model once and then taking one chunk
of text at a time. Not threads: SentencePiece hands its ids back as Python lists, built under
the GIL, as is the parent's packing, and in a process that has loaded TensorFlow (the parent,
which writes the shards) SentencePiece encodes about 30% slower. The parent hands chunk i to
worker i % n and reads the results back in the same order, so the ids are those of one
process encoding the chunks one after another, whatever n is. One chunk per worker is in
flight: memory does not grow with the corpus, and no worker can block sending a result while
the parent blocks sending it text. Unlike Pool.imap, whose feeder thread would read the
corpus ahead, the input is pulled only as results are taken.

A worker is a fresh interpreter (`python -c`, importing only this module: numpy and
sentencepiece), so it is safe after the parent started TensorFlow's threads, its peak memory
counts in its parent's (which waits for it), and, unlike multiprocessing's "spawn", it never
runs the caller's `__main__` again, so no caller needs a `__main__` guard. It talks over two
pipes of its own; the parent holds their other ends only, so a worker whose parent dies reads
end-of-file and exits.
"""

from __future__ import annotations

import itertools
import math
import os
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn, TypeVar

import numpy as np
import sentencepiece as spm

_T = TypeVar("_T")
JOIN_S = 10.0  # how long a finished worker may take to exit before it is terminated


def default_workers() -> int:
    """The CPUs this process may use: its affinity, capped by a cgroup's CPU quota (a
    Kubernetes pod's CPU limit; the node's CPUs would start a worker per CPU of the node)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    quota = cpu_quota()
    return max(1, min(cpus, math.ceil(quota))) if quota else cpus


CGROUP = Path("/sys/fs/cgroup")


def cpu_quota(cgroup: Path = CGROUP) -> float | None:
    """The CPUs the cgroup's quota allows, or None when it sets none (v2 `cpu.max`, else v1
    `cpu.cfs_quota_us` over `cpu.cfs_period_us`)."""
    try:
        if (cgroup / "cpu.max").exists():
            quota, period = (cgroup / "cpu.max").read_text().split()
        else:
            quota = (cgroup / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (cgroup / "cpu" / "cpu.cfs_period_us").read_text().strip()
        return None if quota in ("max", "-1") else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def encode_text(processor: spm.SentencePieceProcessor, text: str) -> np.ndarray:
    """The ids of `text`, as int32: equal to `processor.encode(text)`, about twice as fast.

    "\\n" is a piece of its own that no merge crosses, so encoding line by line and putting a
    newline id between the lines gives the ids of the whole text; BPE on short lines is
    faster than on one long string.
    """
    lines = text.split("\n")
    encoded = processor.encode(lines, num_threads=1)
    counts = np.fromiter(map(len, encoded), np.int64, len(encoded))
    flat = np.fromiter(itertools.chain.from_iterable(encoded), np.int32, int(counts.sum()))
    return np.insert(flat, np.cumsum(counts[:-1]), np.int32(processor.piece_to_id("\n")))


class Encoder:
    """Encodes items' text on `workers` processes (or here, for one), results in input order.

    with Encoder(model, workers) as encoder:
        for item, ids in encoder.map(items, text_of):
            ...
    """

    def __init__(self, model: bytes, workers: int) -> None:
        self._model = model
        self._count = workers
        self._workers: list[_Worker] = []
        self._processor: spm.SentencePieceProcessor | None = None

    def __enter__(self) -> Encoder:
        if self._count <= 1:
            self._processor = spm.SentencePieceProcessor(model_proto=self._model)
            return self
        try:
            for _ in range(self._count):
                self._workers.append(_Worker(self._model))
        except BaseException:
            self._stop(terminate=True)
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop(terminate=kind is not None)

    def map(self, items: Iterable[_T], text_of: Callable[[_T], str]) -> Iterator[tuple[_T, Any]]:
        """Yield (item, ids) in input order; pulls the next item only as a result is taken."""
        if self._processor is not None:
            for item in items:
                yield item, encode_text(self._processor, text_of(item))
            return
        source = iter(items)
        in_flight: deque[tuple[_T, _Worker]] = deque()
        # zip stops at the last worker before pulling an item for none (strict would pull it).
        for worker, item in zip(self._workers, source, strict=False):
            worker.send(text_of(item))
            in_flight.append((item, worker))
        while in_flight:
            item, worker = in_flight.popleft()
            following = list(itertools.islice(source, 1))  # read while the workers encode
            ids = worker.receive()
            for next_item in following:
                worker.send(text_of(next_item))
                in_flight.append((next_item, worker))
            yield item, ids

    def _stop(self, terminate: bool) -> None:
        for worker in self._workers:
            worker.close(terminate)
        for worker in self._workers:
            worker.wait()
        self._workers = []


# The worker's program: this module, found where the parent found it.
_PROGRAM = (
    "import sys; from components.tokenize.encode import serve; serve(*map(int, sys.argv[1:]))"
)
_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding the `components` package


class _Worker:
    """One worker process and the two pipes to it: text in, (ok, ids or error) out."""

    def __init__(self, model: bytes) -> None:
        text_read, text_write = os.pipe()
        ids_read, ids_write = os.pipe()
        path = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _PROGRAM, str(text_read), str(ids_write)],
                pass_fds=(text_read, ids_write),
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": path},
            )
        except BaseException:
            for fd in (text_write, ids_read):
                os.close(fd)
            raise
        finally:  # the worker's ends: once only it holds them, either side sees the other close
            os.close(text_read)
            os.close(ids_write)
        self.texts = Connection(text_write, readable=False)
        self.ids = Connection(ids_read, writable=False)
        self.send(model)

    def send(self, message: Any) -> None:
        try:
            self.texts.send(message)
        except BrokenPipeError:
            self._died()

    def receive(self) -> Any:
        try:
            ok, value = self.ids.recv()
        except EOFError:
            self._died()
        if not ok:
            raise RuntimeError(f"tokenize: encode worker {self.process.pid} failed: {value}")
        return value

    def _died(self) -> NoReturn:
        code = self.process.wait(JOIN_S)
        raise RuntimeError(
            f"tokenize: encode worker {self.process.pid} exited with code {code} "
            "(killed for memory?)"
        ) from None

    def close(self, terminate: bool) -> None:
        self.texts.close()  # a worker waiting for text reads end-of-file and exits
        self.ids.close()
        if terminate:
            self.process.terminate()

    def wait(self) -> None:
        try:
            self.process.wait(JOIN_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def serve(texts: int, ids: int) -> None:
    """A worker's loop: load the model (the first message), then encode each text it
    receives until end-of-file."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    source, sink = Connection(texts, writable=False), Connection(ids, readable=False)
    try:
        processor = spm.SentencePieceProcessor(model_proto=source.recv())
        while True:
            text = source.recv()
            try:
                reply: tuple[bool, Any] = (True, encode_text(processor, text))
            except Exception as e:  # sent back whole: the parent names the worker
                reply = (False, f"{type(e).__name__}: {e}")
            sink.send(reply)
    except (EOFError, BrokenPipeError):  # the parent closed its ends, or died
        return
