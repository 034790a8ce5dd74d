"""`gptpipe serve` against the same signatures called in-process.

The model: `SHAPE` (4 layers, d_model 256, seq_len 256, vocabulary 1024), its weights as
initialised (speed does not depend on training), with a SentencePiece BPE trained on the
bundled corpus, exported as push publishes it (trainer/export.py) into a serving folder.
`gptpipe serve` runs as its own process on loopback, as a user runs it; the client is
`server.client.RestModel` (HTTP/1.1 keep-alive, JSON both ways), in this process.

- score: requests/s of `score` on one 1 KB text a request (whole lines of the corpus, a
  different text each time, the same texts for both sides), one client: through the server
  over calling the loaded SavedModel's `score` signature here. Rounds of each side are
  interleaved (A B B A ...), so each served round has an in-process one next to it in time;
  the figure is the median of those pairs' ratios, which a swing in the machine's other load
  moves less than each side's best (both are in the details, with the median time of a GET of
  the status: the HTTP path's own cost). Target >= 0.8.
- generate: the p50 and p99 latency of a 64-token `generate_seeded` (temperature 0.8, no stop
  at EOS) with 8 clients at once, each sending its next request when its last is answered.
  Reported, without a target: it is the model's cost more than the server's.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import alternate
from bench.results import Figure, Target

TIER = "quick"
REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "data" / "tinyshakespeare.txt"
SHAPE = (
    "model.vocab_size=1024",
    "model.seq_len=256",
    "model.n_layer=4",
    "model.n_head=4",
    "model.d_model=256",
    "model.d_ff=1024",
)
TEXT_BYTES = 1024  # each score request's text, about
TEXTS = 64  # distinct texts, cycled
SCORE_ROUNDS = 8  # timed rounds of each side, interleaved
ROUND_S = 2.0  # about how long one round runs
STATUS_REQUESTS = 50  # GETs of the status: the HTTP path's own cost, without TensorFlow
GENERATE_TOKENS = 64
CLIENTS = 8
GENERATE_PER_CLIENT = 8  # requests each generate client sends
START_TIMEOUT_S = 600.0  # gptpipe serve's start-up on a loaded machine


def one_kb_texts(text: str, count: int, size: int = TEXT_BYTES) -> list[str]:
    """`count` consecutive pieces of `text`, each whole lines adding up to about `size` bytes."""
    pieces, current, length = [], [], 0
    for line in text.splitlines(keepends=True):
        current.append(line)
        length += len(line.encode("utf-8"))
        if length >= size:
            pieces.append("".join(current))
            current, length = [], 0
            if len(pieces) == count:
                break
    return pieces


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile (0..1) of `values`, nearest rank (no interpolation)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def export_model(folder: Path) -> Path:
    """The bench model as version 1 of a serving folder under `folder`; the serving folder."""
    import tf_keras as keras

    from components import serving
    from components.tokenize import bpe
    from trainer import export, model
    from trainer.config import resolve_config

    cfg = resolve_config("tiny", SHAPE)
    tokenizer = folder / "tokenizer.model"
    sample = CORPUS.read_text(encoding="utf-8")[:300_000]
    tokenizer.write_bytes(bpe.train(sample, cfg.model.vocab_size, "bench", lambda _: None))
    keras.mixed_precision.set_global_policy("float32")
    saved = export.export_model(model.build_gpt(cfg.model), cfg, str(tokenizer), str(folder / "m"))
    destination = folder / "serving" / "gpt"
    destination.mkdir(parents=True)
    serving.publish_next(saved, str(destination))
    return destination


@contextlib.contextmanager
def gptpipe_serve(destination: Path) -> Iterator[str]:
    """`gptpipe serve` on a free port, as its own process; its base URL once it answers."""
    script = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from pipelines.cli.main import main; sys.exit(main())"
    )
    argv = [sys.executable, "-c", script, "serve", "--model", str(destination), "--port", "0"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    try:
        line = lines.get(timeout=START_TIMEOUT_S)
        match = re.search(r" at (http://\S+)/v1/models/", line)
        if not match:
            raise RuntimeError(f"gptpipe serve printed {line!r}")
        yield match.group(1)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def score_rates(base: str, saved_model: Path, texts: list[str]) -> dict[str, list[float]]:
    """Requests/s of each side, per round (interleaved)."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 -- the SentencePiece ops

    from server.client import Endpoint, RestModel

    score = tf.saved_model.load(str(saved_model)).signatures["score"]
    client = RestModel(Endpoint(base, "gpt"))

    def in_process(text: str) -> Any:
        return {k: v.numpy() for k, v in score(text=tf.constant([text])).items()}

    def served(text: str) -> Any:
        return client.predict("score", {"text": [text]})

    for call in (in_process, served):  # tracing, connections, caches: not timed
        for text in texts[:4]:
            call(text)
    started = time.perf_counter()
    for text in texts:
        in_process(text)
    per_round = max(8, int(ROUND_S * len(texts) / (time.perf_counter() - started)))

    def rate(call: Any) -> float:
        started = time.perf_counter()
        for i in range(per_round):
            call(texts[i % len(texts)])
        return per_round / (time.perf_counter() - started)

    local, remote = alternate.abba(lambda _: rate(in_process), lambda _: rate(served), SCORE_ROUNDS)
    client.close()
    return {"in_process": local, "served": remote, "requests_per_round": [per_round]}


def status_ms(base: str) -> float:
    """The median milliseconds of a GET of the model's status over a kept connection: what
    the HTTP path costs a request, without TensorFlow."""
    import http.client
    import socket

    connection = http.client.HTTPConnection(base.removeprefix("http://"), timeout=60)
    connection.connect()
    connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times = []
    for _ in range(STATUS_REQUESTS):
        started = time.perf_counter()
        connection.request("GET", "/v1/models/gpt")
        connection.getresponse().read()
        times.append((time.perf_counter() - started) * 1000)
    connection.close()
    return statistics.median(times)


def generate_latencies(base: str) -> list[float]:
    """Seconds of each 64-token generate, CLIENTS clients at once."""
    from server.client import Endpoint, RestModel

    latencies: list[float] = []
    lock = threading.Lock()
    inputs = {"prompt": ["ROMEO:"], "max_new_tokens": GENERATE_TOKENS, "temperature": 0.8}

    def client(index: int) -> None:
        rest = RestModel(Endpoint(base, "gpt"))
        for i in range(GENERATE_PER_CLIENT + 1):
            seed = {"seed": index * 1000 + i, "stop_at_eos": False}
            started = time.perf_counter()
            rest.predict("generate_seeded", {**inputs, **seed})
            if i:  # the first of each client warms its connection and the graph
                with lock:
                    latencies.append(time.perf_counter() - started)
        rest.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies


def figures(full: bool) -> list[Figure]:
    """Score requests/s served over in-process; generate's latency under 8 clients."""
    from trainer.config import config_to_dict, resolve_config

    texts = one_kb_texts(CORPUS.read_text(encoding="utf-8"), TEXTS)
    with tempfile.TemporaryDirectory(prefix="gptpipe-serve-bench-") as tmp:
        destination = export_model(Path(tmp))
        with gptpipe_serve(destination) as base:
            rates = score_rates(base, destination / "1", texts)
            status = status_ms(base)
            latencies = generate_latencies(base)
    inputs = {
        "config": config_to_dict(resolve_config("tiny", SHAPE)),
        "text_bytes": [len(t.encode()) for t in texts[:4]],
        "rounds": SCORE_ROUNDS,
        "clients": CLIENTS,
        "generate_tokens": GENERATE_TOKENS,
        "cores": os.cpu_count(),
    }
    best_local, best_served = max(rates["in_process"]), max(rates["served"])
    pairs = [b / a for a, b in zip(rates["in_process"], rates["served"], strict=True)]
    ms = [s * 1000 for s in latencies]
    generate = {"latencies_ms": ms, "requests": len(ms), "mean_ms": statistics.mean(ms)}
    return [
        Figure(
            "serve: score requests/s, gptpipe serve / in-process (1 KB texts, 1 client)",
            statistics.median(pairs),
            target=Target(">=", 0.8),
            inputs=inputs,
            details={
                "requests_per_s": rates,
                "round_ratios": pairs,
                "best": [best_local, best_served],
                "best_ratio": best_served / best_local,
                "status_get_median_ms": status,
            },
        ),
        Figure(
            f"serve: generate {GENERATE_TOKENS} tokens, p50 latency ({CLIENTS} clients)",
            percentile(ms, 0.50),
            unit="ms",
            inputs=inputs,
            details=generate,
        ),
        Figure(
            f"serve: generate {GENERATE_TOKENS} tokens, p99 latency ({CLIENTS} clients)",
            percentile(ms, 0.99),
            unit="ms",
            inputs=inputs,
            details=generate,
        ),
    ]


if __name__ == "__main__":
    for figure in figures(full=False):
        print(figure.name, figure.value)
