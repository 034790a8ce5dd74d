"""Servability: whether TF Serving can run every op a SavedModel's graph uses.

TF Serving loads a SavedModel's graph tagged `serve`, and only if its model server registers
each op the graph uses; one missing op (a TF Text op it does not link, a custom op) fails the
load in service, long after the push that published it. So the push step reads the graph and
refuses such a model first.

An op is servable if it is a TensorFlow core op or one of the TF Text ops the model server
links (`TF_TEXT_OPS`). Core ops are the names in `tf.raw_ops`, generated when TensorFlow is
built from its own op libraries: unlike the process's op registry, it holds no op a custom
library registers (tensorflow_text, whether loaded here or not), nor TensorFlow's test ops. The
TensorFlow here is pinned to 2.19 (pyproject.toml), the TensorFlow TF Serving 2.19.1 is built
on. Out of scope: a core op the model server registers but has no kernel for on its device (a
TPU op, a GPU-only kernel on a CPU server); the server fails on those, not this check. The case
we know to matter is refused here: the Python-function ops, whose kernels live in the Python
runtime (`PYTHON_ONLY_OPS`).

Every function in the graph's library is read, not only those a signature reaches: While and If
bodies and the tf.functions they call are library functions too, and an op in a function no
signature calls errs towards refusing a model, never towards publishing one that fails.
"""

from __future__ import annotations

import functools
from collections import defaultdict

import tensorflow as tf
from google.protobuf.message import DecodeError
from tensorflow.core.protobuf import saved_model_pb2

from components import storage
from contracts.artifacts import SAVED_MODEL_FILE
from contracts.errors import UserError

SERVER = "TF Serving 2.19.1"  # the model server the lists below were read from

# The TF Text ops TF Serving 2.19.1's model server registers. Its
# tensorflow_serving/model_servers/BUILD (tag 2.19.1) links
# `@org_tensorflow_text//tensorflow_text:ops_lib`, and tensorflow_serving/workspace.bzl pins
# that repository to tensorflow/text v2.12.1. There, tensorflow_text/BUILD's `ops_lib` is the
# `<name>_cc` libraries of 21 `py_tf_text_library` rules, whose `cc_op_defs` are the
# tensorflow_text/core/ops/*.cc files; the names are their REGISTER_OP names and, for
# REGISTER_TF_OP_SHIM, the `kOpName` of the op in core/kernels/*_kernel_template.h.
# Not linked, though tensorflow_text 2.19 registers them: trimmer_ops.cc's
# TFText>RoundRobinTrim and TFText>RoundRobinGenerateMasks, and TFText>Utf8Binarize. (The model
# server also links TF Decision Forests' inference ops; no model of ours uses them.)
# A graph made with tensorflow-text 2.19 runs on those 2.12.1 kernels: our export uses only
# SentencepieceOp, SentencepieceTokenizeOp and SentencepieceDetokenizeOp, and between tags
# v2.12.1 and v2.19.0 their REGISTER_OPs (core/ops/sentencepiece_ops.cc: inputs, outputs, attrs)
# and kernels (core/kernels/sentencepiece_kernels.cc) differ only in `OkStatus()` becoming
# `absl::OkStatus()`, and both tags build SentencePiece v0.1.96 (WORKSPACE).
TF_TEXT_OPS = frozenset(
    {
        "CaseFoldUTF8",  # normalize_ops.cc
        "ConstrainedSequence",  # constrained_sequence_op.cc
        "FastBertNormalize",  # fast_bert_normalizer_op.cc
        "FastWordpieceTokenizeWithOffsets",  # fast_wordpiece_tokenizer_op.cc
        "FindSourceOffsets",  # normalize_ops.cc
        "MaxSpanningTree",  # mst_ops.cc
        "NormalizeUTF8",  # normalize_ops.cc
        "NormalizeUTF8WithOffsetsMap",  # normalize_ops.cc
        "PhraseTokenize",  # phrase_tokenizer_op.cc
        "RegexSplitWithOffsets",  # regex_split_ops.cc
        "RougeL",  # rouge_l_op.cc
        "SentenceFragments",  # sentence_breaking_ops.cc
        "SentenceFragmentsV2",  # sentence_fragmenter_v2_op.cc
        "SentencepieceDetokenizeOp",  # sentencepiece_ops.cc
        "SentencepieceIdToStringOp",  # sentencepiece_ops.cc
        "SentencepieceOp",  # sentencepiece_ops.cc
        "SentencepieceStringToIdOp",  # sentencepiece_ops.cc
        "SentencepieceTokenizeOp",  # sentencepiece_ops.cc
        "SentencepieceTokenizeWithOffsetsOp",  # sentencepiece_ops.cc
        "SentencepieceVocabSizeOp",  # sentencepiece_ops.cc
        "SplitMergeTokenizeWithOffsets",  # split_merge_tokenize_op.cc
        "TFText>BoiseTagsToOffsets",  # boise_offset_converter_op.cc
        "TFText>ByteSplitByOffsets",  # byte_splitter_op.cc
        "TFText>ByteSplitWithOffsets",  # byte_splitter_op.cc
        "TFText>FastSentencepieceDetokenize",  # fast_sentencepiece_ops.cc
        "TFText>FastSentencepieceTokenize",  # fast_sentencepiece_ops.cc
        "TFText>FastWordpieceDetokenize",  # fast_wordpiece_tokenizer_op.cc
        "TFText>NgramsStringJoin",  # ngrams_op.cc
        "TFText>OffsetsToBoiseTags",  # boise_offset_converter_op.cc
        "TFText>PhraseDetokenize",  # phrase_tokenizer_op.cc
        "TFText>WhitespaceTokenizeWithOffsetsV2",  # whitespace_tokenizer_op.cc
        "TokenizerFromLogits",  # tokenizer_from_logits_op.cc
        "UnicodeScriptTokenizeWithOffsets",  # unicode_script_tokenize_op.cc
        "WhitespaceTokenizeWithOffsets",  # whitespace_tokenize_op.cc
        "WordpieceTokenizeWithOffsets",  # wordpiece_op.cc
    }
)

# Core ops (tensorflow/core/ops/script_ops.cc) whose kernels are registered by the Python
# runtime, which a model server does not have: tf.py_function and tf.numpy_function.
PYTHON_ONLY_OPS = frozenset({"EagerPyFunc", "PyFunc", "PyFuncStateless"})

GRAPH = "the graph"  # where an op is used: a MetaGraphDef's own graph, not a library function


def ops_used(saved_model: str) -> dict[str, tuple[str, ...]]:
    """Every op the SavedModel at `saved_model` (a local folder or gs://) uses, with where:
    {op: (the library functions using it, or GRAPH), sorted}."""
    return _ops(_read(saved_model))


def is_servable(op: str) -> bool:
    """Whether the model server registers `op`: a core op, or a TF Text op it links."""
    if op in PYTHON_ONLY_OPS:
        return False
    return op in TF_TEXT_OPS or op in _core_ops()


def check(saved_model: str) -> None:
    """Raise a one-line UserError if TF Serving could not load the SavedModel at
    `saved_model`: it has no graph tagged `serve`, or uses ops the server does not have (each
    named, with where)."""
    proto = _read(saved_model)
    if not any(tf.saved_model.SERVING in g.meta_info_def.tags for g in proto.meta_graphs):
        raise UserError(
            f"the SavedModel at {saved_model} has no graph tagged {tf.saved_model.SERVING!r}, "
            f"the one {SERVER} loads; export the model again"
        )
    unservable = {op: where for op, where in _ops(proto).items() if not is_servable(op)}
    if unservable:
        ops = ", ".join(f"{op} (in {_places(where)})" for op, where in unservable.items())
        raise UserError(
            f"the SavedModel at {saved_model} uses ops {SERVER} does not have: {ops}; export "
            "it without them (servable: TensorFlow core ops and the TF Text ops "
            "components/servability.py lists)"
        )


def _ops(proto: saved_model_pb2.SavedModel) -> dict[str, tuple[str, ...]]:
    """`ops_used` of a parsed SavedModel. A node that calls a library function by name is a
    call, not an op: the function's own nodes are read with the rest of the library."""
    where: defaultdict[str, set[str]] = defaultdict(set)
    for meta_graph in proto.meta_graphs:
        library = meta_graph.graph_def.library.function
        functions = {f.signature.name for f in library}
        for node in meta_graph.graph_def.node:
            if node.op not in functions:
                where[node.op].add(GRAPH)
        for function in library:
            for node in function.node_def:
                if node.op not in functions:
                    where[node.op].add(function.signature.name)
    return {op: tuple(sorted(places)) for op, places in sorted(where.items())}


@functools.cache
def _core_ops() -> frozenset[str]:
    return frozenset(name for name in dir(tf.raw_ops) if not name.startswith("_"))


def _read(saved_model: str) -> saved_model_pb2.SavedModel:
    uri = storage.join(saved_model, SAVED_MODEL_FILE)
    proto = saved_model_pb2.SavedModel()
    try:
        proto.ParseFromString(storage.read_bytes(uri))
    except DecodeError as e:
        raise UserError(f"{uri} is not a SavedModel graph ({e}); export the model again") from e
    return proto


def _places(places: tuple[str, ...], shown: int = 3) -> str:
    more = f" and {len(places) - shown} more" if len(places) > shown else ""
    return ", ".join(places[:shown]) + more
