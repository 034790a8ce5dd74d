#!/usr/bin/env bash
# GPU benchmark (issues 13, 37): the trainer's model at gpt2-small's shape (12 layers, 12 heads,
# d_model 768, vocabulary 50257, seq_len 1024) and at gpt2-xl's (48 layers, d_model 1600, seq_len
# 1024, with and without train.recompute=blocks) on random tokens. Prints ONE JSON line: tokens/s
# per configuration, MFU against the chip's dense bf16 peak (H100/H200 989 TFLOP/s, A100 312,
# L4 121, others null; targets: gpt2-small >= 45%, gpt2-xl with recomputation >= 50%), the
# mixed-precision (bf16 / fp32) and XLA speed-ups, the cost of per-step host syncs,
# MirroredStrategy scaling over the visible GPUs with and without XLA, recomputation's cost and
# gradient accumulation's (4 micro-batches a step / 1). bench/gpu_bench.py says how each is
# measured. It downloads nothing and finishes within 8 minutes; on a machine without a GPU it
# prints {"skipped": true, ...} and exits 0.
#
# On a fresh GPU machine with this repository:
#   make install                  # or: python3.11 -m venv .venv && .venv/bin/pip install -e .
#   .venv/bin/pip install "tensorflow[and-cuda]==2.19.*"   # only if TensorFlow sees no GPU:
#                                 # the CUDA libraries as wheels, when the host has none
#   bash bench/gpu.sh             # or: bash bench/gpu.sh --batch 16 (sequences per GPU)
#
# The Python is $PYTHON, else .venv/bin/python, else python3.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
[[ -x $python ]] || python=python3
export TF_CPP_MIN_LOG_LEVEL=2
# gpu_bench ends its runs by its own 440 s deadline; this is only the backstop.
exec timeout --kill-after=10 470 "$python" -m bench.gpu_bench "$@"
