"""Input pipeline headroom: trainer/data.py's tokens/s over the trainer's consumption (`tiny`).

Supply: `trainer.data.train_dataset` as the trainer builds its training set (trainer/task.py via
`data.distributed_datasets`: the train split's shards in `TrainOrder` with the config's seed
and shuffle buffer, without end, batched by train.batch_size, parsed), read alone in this
process after its shards are checked as the trainer checks them; tokens/s over READ_BATCHES
batches after a warm-up that fills the shuffle buffer. Consumption: the real trainer's
tokens/s on the same Examples at the same config, one worker with 2 threads
(bench/trainer_run.py, its own run: peer_bench's `tiny` run sets its precision by name, this one
takes `auto`, so the two are different configs to its cache). Headroom >= 10
means the input pipeline could feed ten such trainers, so the trainer should never wait for it.
"""

from __future__ import annotations

import time

from bench import trainer_run, workloads
from bench.results import Figure, Target

TIER = "quick"
TARGET = Target(">=", 10.0)
WARMUP_BATCHES = 100
READ_BATCHES = 2000


def supply_tokens_per_second(cfg, examples: str, batches: int = READ_BATCHES) -> float:
    """tokens/s of the trainer's training input pipeline over `batches` batches."""
    from trainer import data, shard_check

    manifest = data.read_manifest(examples)
    shards = data.split_shards(examples, manifest, "train")
    shard_check.verify_shards(examples, shards.files, windows=shards.windows)
    ds = data.train_dataset(shards, cfg)
    iterator = iter(ds)
    for _ in range(WARMUP_BATCHES):
        next(iterator)
    started = time.perf_counter()
    for _ in range(batches):
        inputs, _targets = next(iterator)
    inputs.numpy()
    seconds = time.perf_counter() - started
    return batches * cfg.train.batch_size * cfg.model.seq_len / seconds


def figures(full: bool) -> list[Figure]:
    from trainer.config import config_to_dict

    overrides = workloads.tiny_overrides(workloads.steps(workloads.TINY_STEPS, full))
    cfg = trainer_run.config("tiny", overrides)
    examples = trainer_run.examples(cfg.model.vocab_size, cfg.model.seq_len)
    consumed = trainer_run.tokens_per_second("tiny", overrides)
    batches = READ_BATCHES * (2 if full else 1)
    supplied = supply_tokens_per_second(cfg, str(examples), batches)
    return [
        Figure(
            name="input pipeline headroom (tf.data tokens/s / trainer tokens/s), tiny",
            value=supplied / consumed,
            target=TARGET,
            inputs={
                "config": config_to_dict(cfg),
                "tokens_read": batches * cfg.train.batch_size * cfg.model.seq_len,
                "trainer_threads": workloads.THREADS,
            },
            details={"input_tokens_per_s": supplied, "trainer_tokens_per_s": consumed},
        )
    ]


if __name__ == "__main__":
    from bench.results import markdown_table

    print(markdown_table(figures(full=False)))
