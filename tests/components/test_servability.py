"""Servability: the ops a SavedModel uses, and which of them TF Serving 2.19.1 has."""

import re

import pytest

from components import servability
from contracts.artifacts import SERVING_DIR
from contracts.errors import UserError
from tests.tiny import UNLINKED_TF_TEXT_OP, saved_model_graph

SENTENCEPIECE_OPS = {"SentencepieceOp", "SentencepieceTokenizeOp", "SentencepieceDetokenizeOp"}


@pytest.mark.slow
def test_the_exported_model_uses_only_ops_tf_serving_has(tiny_model):
    saved_model = str(tiny_model / SERVING_DIR)
    ops = servability.ops_used(saved_model)
    assert ops.keys() >= SENTENCEPIECE_OPS  # the in-graph tokenizer, found in the library
    # Exactly the TF Text ops whose 2.12.1 definitions were checked against 2.19's (servability.py).
    assert {op for op in ops if op in servability.TF_TEXT_OPS} == SENTENCEPIECE_OPS
    assert ops.keys() >= {"StatefulPartitionedCall", "VarHandleOp", "SaveV2", "RestoreV2"}
    assert [op for op in ops if not servability.is_servable(op)] == []
    servability.check(saved_model)


@pytest.mark.slow
def test_an_op_only_inside_a_while_body_is_found_and_named(unlinked_op_model):
    saved_model = str(unlinked_op_model / SERVING_DIR)
    ops = servability.ops_used(saved_model)
    (body,) = ops[UNLINKED_TF_TEXT_OP]
    assert body.startswith("while_body")  # not the signature's function, nor the graph
    assert set(ops["StatelessWhile"]).isdisjoint(ops[UNLINKED_TF_TEXT_OP])
    message = f"uses ops TF Serving 2.19.1 does not have: {UNLINKED_TF_TEXT_OP} (in {body}); "
    with pytest.raises(UserError, match=re.escape(message)):
        servability.check(saved_model)


@pytest.mark.slow
def test_the_tf_text_ops_listed_are_tensorflow_texts_and_not_core_ones():
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 -- registers its ops
    from tensorflow.python.framework import op_def_registry

    assert [op for op in servability.TF_TEXT_OPS if op_def_registry.get(op) is None] == []
    assert servability.TF_TEXT_OPS.isdisjoint(dir(tf.raw_ops))
    assert op_def_registry.get(UNLINKED_TF_TEXT_OP) is not None
    assert not servability.is_servable(UNLINKED_TF_TEXT_OP)


@pytest.mark.parametrize(
    "graph, says",
    [
        pytest.param(b"graph", r"saved_model.pb is not a SavedModel graph", id="not-a-proto"),
        pytest.param(b"", r"has no graph tagged 'serve'", id="empty"),
        pytest.param(
            saved_model_graph("g", ops=("Const", "EagerPyFunc", "MadeUpOp")),
            r"does not have: EagerPyFunc \(in the graph\), MadeUpOp \(in the graph\); export",
            id="python-function-and-made-up-op",
        ),
    ],
)
def test_a_graph_tf_serving_could_not_load_is_refused_in_one_line(tmp_path, graph, says):
    (tmp_path / "saved_model.pb").write_bytes(graph)
    with pytest.raises(UserError, match=says) as refused:
        servability.check(str(tmp_path))
    assert "\n" not in str(refused.value)


def test_a_savedmodel_on_gcs_is_read_through_the_storage_layer(gcs):
    gcs.put("model/Format-Serving/saved_model.pb", saved_model_graph("g", ops=("SentencepieceOp",)))
    saved_model = gcs.uri("model/Format-Serving")
    assert servability.ops_used(saved_model) == {"SentencepieceOp": (servability.GRAPH,)}
    servability.check(saved_model)
