"""Try `quality` recipes without touching the quality benchmark's eval text.

    python -m bench.quality_tune                          # VARIANTS, on today's preset
    python -m bench.quality_tune --variant "6 layers:model.n_layer=6" --variant ...

The tuning corpus is the train split of quality_bench's (the bundled corpus's first 90%), split
again by the tokenize step with the same eval_fraction: each variant trains on its first 90% and
is scored on its last 10%, so the benchmark's held-out tail is never seen while choosing a
recipe. Each variant is the `quality` preset plus its key=value overrides, trained by the real
trainer (1 worker, 2 threads) and scored at POINTS checkpoints, as quality_bench scores its
curve; there is no time budget, since the question is which recipe makes the better model.
About 6 minutes a variant at the preset's size on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import quality_bench, trainer_run

PRESET = "quality"
EVAL_FRACTION = 0.1
# (label, overrides) on today's preset, which trains with rotary positions and dropout 0.15
# since 2026-12-03; the others at dropout 0.1, as docs/benchmarks.md's tuning table has them.
PREVIOUS_DROPOUT = "model.dropout=0.1"  # the preset's until 2026-12-03
VARIANTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("the preset", ()),
    ("the learned position table, dropout 0.1", ("model.position=learned", PREVIOUS_DROPOUT)),
    ("dropout 0.1", (PREVIOUS_DROPOUT,)),
    ("dropout 0.2", ("model.dropout=0.2",)),
    ("1,200 steps, dropout 0.1", ("train.train_steps=1200", PREVIOUS_DROPOUT)),
    ("6 layers, dropout 0.1", ("model.n_layer=6", PREVIOUS_DROPOUT)),
    ("8 heads, dropout 0.1", ("model.n_head=8", PREVIOUS_DROPOUT)),
    ("2 heads, dropout 0.1", ("model.n_head=2", PREVIOUS_DROPOUT)),
)


def parse_variant(text: str) -> tuple[str, tuple[str, ...]]:
    """ "label:key=value,key=value" -> (label, overrides); "label:" is the preset itself."""
    label, sep, overrides = text.partition(":")
    if not sep or not label.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: write a variant as 'label:key=value,...'")
    return label.strip(), tuple(o.strip() for o in overrides.split(",") if o.strip())


def tuning_corpus() -> Path:
    """The quality benchmark's train text alone, as a corpus file in the scratch folder."""
    base = trainer_run.config(PRESET, ())
    examples = trainer_run.examples(base.model.vocab_size, base.model.seq_len, EVAL_FRACTION)
    train_text, _held_out = quality_bench.train_split(examples)
    path = trainer_run.scratch() / "quality-tune-corpus.txt"
    path.write_text(train_text, encoding="utf-8")
    return path


def run_variant(label: str, overrides: Sequence[str], corpus: Path) -> dict[str, Any]:
    """Train one variant on the tuning corpus's train split; its curve on the split's tail."""
    from trainer.config import config_to_dict

    steps = trainer_run.config(PRESET, overrides).train.train_steps
    if steps % quality_bench.POINTS:  # the curve's last point is the exported Model's
        raise SystemExit(
            f"quality_tune: variant {label!r}: train.train_steps={steps} is not a multiple of "
            f"{quality_bench.POINTS}, so its last step would have no checkpoint on the curve"
        )
    every = quality_bench.checkpoint_at_points(steps)
    cfg = trainer_run.config(PRESET, (every, *overrides))  # the variant's own value wins
    examples = trainer_run.examples(
        cfg.model.vocab_size, cfg.model.seq_len, EVAL_FRACTION, corpus=corpus
    )
    _train, held_out = quality_bench.train_split(examples, corpus)
    _job, curve = quality_bench.scored_run(cfg, examples, held_out)
    return {
        "label": label,
        "overrides": list(overrides),
        "config": config_to_dict(cfg),
        "curve": curve,
        "nats_per_char": curve[-1]["nats_per_char"],
    }


def table(results: Sequence[dict[str, Any]]) -> str:
    """Markdown: each variant's final nats/char and its change over the first variant's."""
    lines = ["| variant | steps | nats/char | vs the first |", "|---|---|---|---|"]
    for i, r in enumerate(results):
        change = f"{r['nats_per_char'] / results[0]['nats_per_char'] - 1:+.1%}" if i else "–"
        steps = r["curve"][-1]["step"]
        lines.append(f"| {r['label']} | {steps} | {r['nats_per_char']:.3f} | {change} |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.quality_tune")
    p.add_argument(
        "--variant",
        action="append",
        type=parse_variant,
        help="'label:key=value,...' on top of the quality preset; repeatable (default: VARIANTS)",
    )
    p.add_argument("--output", type=Path, help="write the results, with curves, as JSON here")
    args = p.parse_args(argv)
    corpus = tuning_corpus()
    results = []
    for label, overrides in args.variant or VARIANTS:
        results.append(run_variant(label, overrides, corpus))
        print(json.dumps(results[-1]["curve"]), file=sys.stderr, flush=True)
    print(table(results))
    if args.output:
        args.output.write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
