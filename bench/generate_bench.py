"""Generation speed of the exported `generate`: against KerasHub, and against the uncached path.

The shape (issue 38's): 6 layers, d_model 512, 8 heads, MLP 2048, seq_len 512, vocabulary 2048,
random init; prompts of 64 tokens continued by 128, greedy, at batch 1 and 8, 2 threads.

- **Against KerasHub**: the trainer's SavedModel (exported as a run exports it, loaded back,
  its `generate` signature: tokenizing and detokenizing included) over KerasHub 0.31's
  `GPT2CausalLM.generate` with its key/value cache and the greedy sampler, compiled as it comes
  (bench/peer_generate.py, in the peer venv: bench/peer_env.py), given the same prompts' ids.
  Tokens/s in all; each side's best of its timed runs, in fresh processes alternated A B B A.
  Target >= 1.2x at batch 1 and at batch 8.
- **Over the uncached path**: the same model's `generate` over `generate_uncached` (the path
  before the cache, kept for its tests: the whole context through the model for every token, a
  row at a time), both in one process, batch 1. Target >= 4x.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import alternate, child, peer_env, workloads
from bench.results import Figure, Target

TIER = "quick"
SHAPE = {
    "vocab_size": 2048,
    "seq_len": 512,
    "n_layer": 6,
    "n_head": 8,
    "d_model": 512,
    "d_ff": 2048,
}
PROMPT_TOKENS = 64
NEW_TOKENS = 128
BATCHES = (1, 8)
RUNS = 3  # timed calls per process, after one untimed (tracing, compiling)
ROUNDS = 2  # processes per side, alternated
TIMEOUT_S = 1200
CORPUS = Path(__file__).resolve().parents[1] / "data" / "tinyshakespeare.txt"
TOKENIZER_TEXT_CHARS = 300_000


def _tokenizer(folder: Path) -> Path:
    """A SentencePiece model of the shape's vocabulary, trained as tokenize trains one."""
    import sentencepiece as spm

    from components.tokenize.bpe import SENTENCEPIECE_TRAINER_OPTIONS

    text = folder / "corpus.txt"
    text.write_text(CORPUS.read_text(encoding="utf-8")[:TOKENIZER_TEXT_CHARS], encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(text),
        model_prefix=str(folder / "tokenizer"),
        vocab_size=SHAPE["vocab_size"],
        minloglevel=2,
        **SENTENCEPIECE_TRAINER_OPTIONS,
    )
    return folder / "tokenizer.model"


def prompts(tokenizer: Path, batch: int) -> list[str]:
    """`batch` passages of the corpus that tokenize to exactly PROMPT_TOKENS ids each."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(tokenizer))
    ids = sp.encode(CORPUS.read_text(encoding="utf-8")[:200_000])
    found, start = [], 0
    while len(found) < batch:
        text = sp.decode(ids[start : start + PROMPT_TOKENS])
        if len(sp.encode(text)) == PROMPT_TOKENS:
            found.append(text)
        start += 500
    return found


def ours_child(folder: str) -> dict[str, Any]:
    """In this process: export the model, load it, time its `generate` at each batch, and the
    in-memory module's cached over uncached `generate` at batch 1."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(workloads.THREADS)
    tf.config.threading.set_inter_op_parallelism_threads(workloads.THREADS)
    import tf_keras as keras

    from trainer.config import resolve_config
    from trainer.export import GPTServing, export_model
    from trainer.model import build_gpt

    tokenizer = Path(folder) / "tokenizer.model"
    cfg = resolve_config("tiny", [f"model.{k}={v}" for k, v in SHAPE.items()])
    keras.utils.set_random_seed(0)
    gpt = build_gpt(cfg.model)
    export_dir = Path(tempfile.mkdtemp(dir=folder)) / "model"
    export_model(gpt, cfg, str(tokenizer), str(export_dir))
    generate = tf.saved_model.load(str(export_dir)).signatures["generate"]
    fixed = {
        "max_new_tokens": tf.constant(NEW_TOKENS),
        "temperature": tf.constant(0.0),
        "stop_at_eos": tf.constant(False),
    }
    rates: dict[str, Any] = {}
    for batch in BATCHES:
        batch_prompts = tf.constant(prompts(tokenizer, batch))
        rates[f"batch_{batch}"] = _rates(lambda p=batch_prompts: generate(prompt=p, **fixed), batch)
    module = GPTServing(gpt, cfg.model.seq_len, str(tokenizer))
    uncached = tf.function(module.generate_uncached)
    one = tf.constant(prompts(tokenizer, 1))
    args = (one, fixed["max_new_tokens"], fixed["temperature"], None, fixed["stop_at_eos"])
    cached, plain = alternate.abba(
        lambda _: _rates(lambda: module.generate(one, *args[1:3], args[4]), 1, runs=1),
        lambda _: _rates(lambda: uncached(*args), 1, runs=1),
        RUNS,
    )
    rates["cached_in_memory"] = [r for rs in cached for r in rs]
    rates["uncached_in_memory"] = [r for rs in plain for r in rs]
    return rates


def _rates(call: Any, batch: int, runs: int = RUNS) -> list[float]:
    """Tokens/s in all of `runs` timed calls, after one untimed."""
    call()
    found = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        found.append(batch * NEW_TOKENS / (time.perf_counter() - started))
    return found


def peer(folder: Path, batch: int) -> list[float]:
    """KerasHub's tokens/s in all at `batch`, on the same prompts' ids."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    ids = [sp.encode(text) for text in prompts(folder / "tokenizer.model", batch)]
    args = ["--shape", json.dumps(SHAPE), "--prompts", json.dumps(ids)]
    args += ["--new-tokens", str(NEW_TOKENS), "--runs", str(RUNS)]
    found = peer_env.run_peer(
        args, TIMEOUT_S, threads=workloads.THREADS, script=peer_env.BENCH / "peer_generate.py"
    )
    return found["tokens_per_second"]


def figures(full: bool) -> list[Figure]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _tokenizer(folder)
        ours, theirs = alternate.abba(
            lambda _: child.run("generate_bench", "--ours", str(folder), timeout_s=TIMEOUT_S),
            lambda _: {f"batch_{b}": peer(folder, b) for b in BATCHES},
            ROUNDS,
        )
    found = []
    inputs = {
        **SHAPE,
        "prompt_tokens": PROMPT_TOKENS,
        "new_tokens": NEW_TOKENS,
        "threads": workloads.THREADS,
    }
    for batch in BATCHES:
        key = f"batch_{batch}"
        mine = max(r for o in ours for r in o[key])
        best = max(r for t in theirs for r in t[key])
        found.append(
            Figure(
                f"generate tokens/s vs KerasHub GPT2CausalLM.generate, batch {batch}",
                mine / best,
                target=Target(">=", 1.2),
                inputs={**inputs, "batch": batch, "peer_pins": list(peer_env.PINS)},
                details={
                    "ours_tokens_per_s": [o[key] for o in ours],
                    "peer_tokens_per_s": [t[key] for t in theirs],
                },
            )
        )
    cached = max(r for o in ours for r in o["cached_in_memory"])
    plain = max(r for o in ours for r in o["uncached_in_memory"])
    found.append(
        Figure(
            "generate tokens/s, key/value cache over the uncached path, batch 1",
            cached / plain,
            target=Target(">=", 4.0),
            inputs={**inputs, "batch": 1},
            details={
                "cached_tokens_per_s": [o["cached_in_memory"] for o in ours],
                "uncached_tokens_per_s": [o["uncached_in_memory"] for o in ours],
            },
        )
    )
    return found


if __name__ == "__main__":
    if sys.argv[1:2] == ["--ours"] and len(sys.argv) == 3:
        print(json.dumps(ours_child(sys.argv[2])))
    else:
        sys.exit(
            "usage: python -m bench.generate_bench --ours FOLDER (or: python -m bench generate)"
        )
