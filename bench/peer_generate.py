"""The generation peer: KerasHub's `GPT2CausalLM.generate` (Keras 3, TensorFlow backend).

Runs only inside the peer venv (bench/peer_env.py), as a script that imports nothing of this
project. The model is `GPT2Backbone` at the given shape (random init from a config, never
`from_preset`) under `GPT2CausalLM` with no preprocessor, compiled with the greedy sampler, as
it comes otherwise: KerasHub decodes with its key/value cache (`GPT2CausalLM.call_with_cache`)
inside one compiled generate function (XLA on the TensorFlow backend, its default).

    python bench/peer_generate.py --shape JSON --prompts JSON --new-tokens N --runs R

`--prompts` is a JSON list of rows of token ids, all of one length (the batch); each row is
continued by N tokens (`token_ids` padded to prompt + N with `padding_mask` over the prompt,
`stop_token_ids=None`: never stopping early). Prints one JSON line: tokens/s in all of each
timed run (the first call, which compiles, is not timed).
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", required=True, help="JSON: vocab_size, n_layer, n_head, ...")
    p.add_argument("--prompts", required=True, help="JSON list of equal-length id rows")
    p.add_argument("--new-tokens", type=int, required=True)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--threads", type=int, default=0)
    args = p.parse_args()

    import numpy as np
    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    import keras
    import keras_hub

    shape, prompts = json.loads(args.shape), np.array(json.loads(args.prompts), "int32")
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=shape["vocab_size"],
        num_layers=shape["n_layer"],
        num_heads=shape["n_head"],
        hidden_dim=shape["d_model"],
        intermediate_dim=shape["d_ff"],
        dropout=0.0,
        max_sequence_length=shape["seq_len"],
    )
    model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    model.compile(sampler="greedy")
    b, n = prompts.shape[0], prompts.shape[1]
    token_ids = np.zeros((b, n + args.new_tokens), "int32")
    token_ids[:, :n] = prompts
    mask = np.zeros_like(token_ids, bool)
    mask[:, :n] = True
    inputs = {"token_ids": token_ids, "padding_mask": mask}
    model.generate(inputs, stop_token_ids=None)  # compiles
    rates = []
    for _ in range(args.runs):
        started = time.perf_counter()
        out = model.generate(inputs, stop_token_ids=None)
        rates.append(b * args.new_tokens / (time.perf_counter() - started))
    assert np.asarray(out["token_ids"]).shape == token_ids.shape
    versions = {"keras": keras.__version__, "keras_hub": keras_hub.__version__}
    print(json.dumps({"tokens_per_second": rates, "versions": versions}))


if __name__ == "__main__":
    main()
