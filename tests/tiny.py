"""The tiny configs and corpus tests train on, and the builders of a tiny Examples folder and
an exported Model from them.

Tests take the built artifacts as tests/conftest.py's session fixtures `examples` and
`tiny_model`, made once per run; they combine the configs themselves:

    cfg = resolve_config("tiny", TINY_OVERRIDES + ("train.train_steps=10",))

The tokenizer is trained with `SENTENCEPIECE_TRAINER_OPTIONS`, the same options the
tokenize step uses, so the in-graph tensorflow_text tokenizer matches the python one.

`saved_model_graph` is a stand-in SavedModel graph, for tests that move models without running
them (push, rollback); `make_unlinked_op_model`, a real SavedModel TF Serving could not load.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

import sentencepiece as spm

from components import overlap
from components.tokenize.bpe import SENTENCEPIECE_TRAINER_OPTIONS
from contracts.artifacts import (
    EVAL_TEXT,
    EXAMPLES_MANIFEST,
    MODEL_COMPLETE,
    SERVING_DIR,
    TOKENIZER_FILE,
    TRAIN_TEXT_SKETCH,
)
from contracts.eval_text import EvalPiece, piece_line, read_pieces
from contracts.examples import (
    FORMAT_VERSION,
    DatasetParameters,
    ExamplesManifest,
    LocalSource,
    SplitStats,
    TokenizerRecord,
    manifest_json,
)

SEQ_LEN = 16
VOCAB_SIZE = 320  # byte fallback needs 256 byte pieces + the corpus' characters + merges

# A tiny model that trains in seconds on 2 CPU cores; pass to resolve_config("tiny", ...).
TINY_OVERRIDES = (
    f"model.vocab_size={VOCAB_SIZE}",
    f"model.seq_len={SEQ_LEN}",
    "model.n_layer=1",
    "model.n_head=2",
    "model.d_model=32",
    "model.d_ff=64",
    "train.batch_size=8",
    "train.train_steps=40",
    "train.warmup_steps=4",
    "train.learning_rate=1e-2",
    "train.reference_batch_size=8",
    "train.checkpoint_every=20",
    "train.log_every=10",
    "train.preemption_check_every=5",  # the fault tests' SIGTERM at step 25 stops at 25
    "train.eval_batches=2",
    "train.shuffle_buffer=64",
)

_LINES = [
    "ROMEO:\nBut soft, what light through yonder window breaks?\n",
    "JULIET:\nO Romeo, Romeo, wherefore art thou Romeo?\n",
    "HAMLET:\nTo be, or not to be, that is the question.\n",
    "FIRST CITIZEN:\nBefore we proceed any further, hear me speak.\n",
    "ALL:\nSpeak, speak.\n",
]


def tiny_corpus(n_lines: int = 400, seed: int = 0) -> str:
    """A repetitive Shakespeare-like text a tiny model learns quickly."""
    rng = random.Random(seed)
    return "\n".join(rng.choice(_LINES) for _ in range(n_lines))


def train_tokenizer(text: str, prefix: Path, vocab_size: int = VOCAB_SIZE) -> Path:
    """Train a SentencePiece BPE model on `text`; returns the .model path."""
    corpus = prefix.with_suffix(".txt")
    corpus.write_text(text, encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        minloglevel=2,
        **SENTENCEPIECE_TRAINER_OPTIONS,
    )
    return prefix.with_suffix(".model")


def write_eval_text(path: Path, documents: Sequence[str], piece_lines: int = 4) -> None:
    """Write `documents` as tokenize writes the eval text (contracts/eval_text.py): each in
    pieces of `piece_lines` whole lines, its last marked as its end."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        for document in documents:
            lines = document.splitlines(keepends=True)
            runs = [lines[i : i + piece_lines] for i in range(0, len(lines), piece_lines)]
            for i, run in enumerate(runs or [[]]):
                f.write(piece_line(EvalPiece("".join(run), i == max(len(runs) - 1, 0))))


def read_eval_documents(examples: Path) -> list[str]:
    """The documents of an Examples folder's eval text, each whole."""
    documents, current = [], []
    with (examples / EVAL_TEXT).open("rb") as f:
        for piece in read_pieces(f, str(examples / EVAL_TEXT)):
            current.append(piece.text)
            if piece.end:
                documents.append("".join(current))
                current = []
    return documents


def _windows(ids: list[int], seq_len: int) -> list[list[int]]:
    """Windows of seq_len + 1 with stride seq_len; the incomplete tail is dropped."""
    return [ids[i : i + seq_len + 1] for i in range(0, len(ids) - seq_len, seq_len)]


def _write_shards(
    folder: Path, split: str, windows: list[list[int]], shard_windows: int
) -> list[str]:
    """Write `windows` as tokenize does: shards filled with `shard_windows` windows in order, the
    last with the rest (components/tokenize/shards.py), which trainer/data.py's counts rely on."""
    import tensorflow as tf

    (folder / f"Split-{split}").mkdir(parents=True, exist_ok=True)
    n_shards = -(-len(windows) // shard_windows)
    shards = []
    for s in range(n_shards):
        rel = f"Split-{split}/data_tfrecord-{s:05d}-of-{n_shards:05d}.gz"
        with tf.io.TFRecordWriter(str(folder / rel), options="GZIP") as w:
            for window in windows[s * shard_windows : (s + 1) * shard_windows]:
                feature = tf.train.Feature(int64_list=tf.train.Int64List(value=window))
                example = tf.train.Example(
                    features=tf.train.Features(feature={"input_ids": feature})
                )
                w.write(example.SerializeToString())
        shards.append(rel)
    return shards


def examples_manifest(
    splits: dict[str, SplitStats],
    *,
    seq_len: int = SEQ_LEN,
    vocab_size: int = VOCAB_SIZE,
    eval_fraction: float = 0.1,
    shard_windows: int = 1,
    dataset_version: str = "0" * 64,
    tokenizer_sha256: str = "0" * 64,
    sources: tuple[LocalSource, ...] = (),
) -> ExamplesManifest:
    """A manifest as tokenize writes one, for Examples a test makes by hand."""
    parameters = DatasetParameters(
        format_version=FORMAT_VERSION,
        split_method="file-tail-bytes-v3",
        vocab_size=vocab_size,
        seq_len=seq_len,
        eval_fraction=eval_fraction,
        eval_max_bytes=100_000_000,
        text_field="text",
        unit_bytes=64 << 20,
        shard_windows=shard_windows,
        chunk_bytes=1 << 20,
        tokenizer_sample_bytes=1 << 24,
        sentencepiece_version=spm.__version__,
        tokenizer_options=SENTENCEPIECE_TRAINER_OPTIONS,
        given_tokenizer_sha256=None,
    )
    tokenizer = TokenizerRecord(TOKENIZER_FILE, tokenizer_sha256, vocab_size, trained=True)
    return ExamplesManifest(
        dataset_version,
        seq_len,
        vocab_size,
        eval_fraction,
        splits,
        tokenizer,
        sources,
        parameters,
        documents=dict.fromkeys(splits, 1),
        empty_documents=0,
        formats={"txt": 1},
    )


def make_examples_dir(
    folder: Path,
    seq_len: int = SEQ_LEN,
    vocab_size: int = VOCAB_SIZE,
    text: str | None = None,
    train_shards: int = 2,
    eval_fraction: float = 0.1,
) -> Path:
    """Write a complete tiny Examples artifact (design.md layout) into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    text = text if text is not None else tiny_corpus()
    cut = int(len(text) * (1 - eval_fraction))
    parts = {"train": text[:cut], "eval": text[cut:]}
    model_path = train_tokenizer(parts["train"], folder / "tokenizer", vocab_size)
    (folder / "tokenizer.txt").unlink()
    (folder / "tokenizer.vocab").unlink()
    sp = spm.SentencePieceProcessor(model_file=str(model_path))
    # The eval split as two documents, so that evaluate meets a document's end mid-text.
    middle = parts["eval"].find("\n", len(parts["eval"]) // 2) + 1
    halves = [parts["eval"][:middle], parts["eval"][middle:]]
    write_eval_text(folder / EVAL_TEXT, [half for half in halves if half])
    ids = {split: sp.encode(part) for split, part in parts.items()}
    windows = {split: _windows(split_ids, seq_len) for split, split_ids in ids.items()}
    shard_windows = -(-len(windows["train"]) // train_shards)  # train_shards full shards or fewer
    splits = {
        split: SplitStats(
            tuple(_write_shards(folder, split, windows[split], shard_windows)),
            len(windows[split]),
            len(ids[split]),
            len(part),
        )
        for split, part in parts.items()
    }
    sketch = overlap.Sketch()  # as tokenize sketches its train chunks
    sketch.add(parts["train"].encode("utf-8"))
    (folder / TRAIN_TEXT_SKETCH).write_bytes(sketch.to_bytes())
    digest = hashlib.sha256(model_path.read_bytes()).hexdigest()
    source = LocalSource(
        "tiny_corpus", len(text.encode()), hashlib.sha256(text.encode()).hexdigest()
    )
    manifest = examples_manifest(
        splits,
        seq_len=seq_len,
        vocab_size=vocab_size,
        eval_fraction=eval_fraction,
        shard_windows=shard_windows,
        dataset_version=hashlib.sha256(text.encode() + digest.encode()).hexdigest(),
        tokenizer_sha256=digest,
        sources=(source,),
    )
    (folder / EXAMPLES_MANIFEST).write_text(manifest_json(manifest), encoding="utf-8")
    return folder


def make_model_dir(tmp_path: Path, examples_dir: Path, overrides: tuple[str, ...] = ()) -> Path:
    """Train the tiny config briefly on `examples_dir` and write a Model artifact; returns it."""
    from trainer.config import resolve_config
    from trainer.task import train

    cfg = resolve_config("tiny", TINY_OVERRIDES + ("train.train_steps=20",) + tuple(overrides))
    model_dir = Path(tmp_path) / "model"
    train(str(examples_dir), str(model_dir), str(Path(tmp_path) / "work"), cfg)
    return model_dir


def saved_model_graph(label: str, ops: Sequence[str] = ("NoOp",)) -> bytes:
    """A `saved_model.pb` for a SavedModel-shaped folder: one `serve` graph whose nodes, one per
    op in `ops`, are named after `label`, so two labels give two different files. Push reads
    the graph (components/servability.py) and nothing else."""
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    graph = proto.meta_graphs.add()
    graph.meta_info_def.tags.append("serve")
    for i, op in enumerate(ops):
        graph.graph_def.node.add(name=f"{label}_{i}", op=op)
    return proto.SerializeToString()


# A TF Text op tensorflow_text 2.19 registers and TF Serving 2.19.1 does not link
# (components/servability.py's TF_TEXT_OPS).
UNLINKED_TF_TEXT_OP = "TFText>Utf8Binarize"


def make_unlinked_op_model(tmp_path: Path) -> Path:
    """Write a Model artifact TF Serving could not load: its SavedModel's signature runs
    `UNLINKED_TF_TEXT_OP`, and only inside a While loop's body. Returns the Model folder."""
    import tensorflow as tf
    import tensorflow_text as text

    class Binarizer(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def bits(self, words: tf.Tensor) -> dict[str, tf.Tensor]:
            def body(i: tf.Tensor, total: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
                return i + 1, total + tf.reduce_sum(text.utf8_binarize(words))

            start = (tf.constant(0), tf.constant(0.0))
            _, total = tf.while_loop(lambda i, _: i < 2, body, start)
            return {"bits": total}

    model = Binarizer()
    model_dir = Path(tmp_path) / "model"
    signatures = {"serving_default": model.bits}
    tf.saved_model.save(model, str(model_dir / SERVING_DIR), signatures=signatures)
    (model_dir / MODEL_COMPLETE).write_text("")
    return model_dir


# The smallest config a whole pipeline run trains: the e2e tests, the security run, racing runs.
PIPELINE_SMALL = (
    "model.vocab_size=400",
    "model.seq_len=32",
    "model.n_layer=1",
    "model.n_head=2",
    "model.d_model=32",
    "model.d_ff=64",
    "train.batch_size=8",
    "train.train_steps=30",
    "train.warmup_steps=5",
    "train.checkpoint_every=15",
    "train.log_every=10",
    "train.eval_batches=2",
    "train.shuffle_buffer=64",
)


@contextlib.contextmanager
def keras_policy(policy: str) -> Iterator[None]:
    """Layers made inside take Keras' `policy`; the other tests' float32 is back afterwards."""
    import tf_keras as keras

    keras.mixed_precision.set_global_policy(policy)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")
