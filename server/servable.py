"""One loaded model version: its SavedModel, its signature defs, and predict on it.

TF Serving keeps a version as a SavedModelBundle: the session and the MetaGraphDef tagged
"serve", whose signature defs its metadata endpoint prints and its predict checks requests
against (tensorflow_serving/servables/tensorflow/predict_util.cc, RunPredict). Here the
SavedModel is loaded with `tf.saved_model.load` and run through its signature functions; the
signature defs are read from the same saved_model.pb, so both come from one file. A gs://
version is downloaded to a temporary folder first (the storage layer; TensorFlow's own GCS
file system needs Google credentials and ignores the emulator) and removed once loaded:
loading restores every variable and runs every initializer, so nothing reads the files later.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from components import storage
from contracts.artifacts import SAVED_MODEL_FILE
from server.json_tensor import Tensor
from server.status import Code, ServingError, invalid_argument

DEFAULT_SIGNATURE = "serving_default"  # kDefaultServingSignatureDefKey
SERVE_TAG = "serve"  # kSavedModelTagServe: the MetaGraphDef TF Serving loads


@dataclass(frozen=True)
class Servable:
    """A loaded version of a model."""

    name: str  # the model's name (TF Serving's --model_name)
    version: int
    signature_defs: Mapping[str, Any]  # name -> tensorflow.SignatureDef, as saved_model.pb has them
    functions: Mapping[str, Any]  # name -> the loaded signature's ConcreteFunction
    saved_model: Any  # the loaded SavedModel: holds the variables the functions read

    def inputs_of(self, signature: str) -> dict[str, str]:
        """A signature's inputs: name -> DataType name (HttpRestApiHandler::GetInfoMap)."""
        from tensorflow.core.framework import types_pb2

        name = signature or DEFAULT_SIGNATURE
        if name not in self.signature_defs:
            raise invalid_argument(f'Serving signature name: "{name}" not found in signature def')
        inputs = self.signature_defs[name].inputs
        return {key: types_pb2.DataType.Name(info.dtype) for key, info in inputs.items()}

    def predict(self, signature: str, inputs: Mapping[str, Tensor]) -> dict[str, np.ndarray]:
        """Run a signature on `inputs`; its outputs by name (RunPredict). An error TensorFlow
        raises running the graph keeps its code: a bad argument is INVALID_ARGUMENT."""
        import tensorflow as tf

        name = signature or DEFAULT_SIGNATURE
        if name not in self.signature_defs or name not in self.functions:
            raise ServingError(
                Code.FAILED_PRECONDITION, f'Serving signature key "{name}" not found.'
            )
        feeds = {key: _as_tf(tensor) for key, tensor in inputs.items()}
        try:
            outputs = self.functions[name](**feeds)
        except tf.errors.OpError as err:
            raise ServingError(Code(err.error_code), tf_message(err)) from None
        return {key: value.numpy() for key, value in outputs.items()}

    def signature_def_map(self) -> dict[str, Any]:
        """The SignatureDefMap as TF Serving's metadata endpoint prints it (http_rest_api_util.cc,
        ToJsonString: proto field names, fields at their defaults too)."""
        from google.protobuf import json_format

        return {
            "signature_def": {
                name: json_format.MessageToDict(
                    sig, preserving_proto_field_name=True, including_default_value_fields=True
                )
                for name, sig in self.signature_defs.items()
            }
        }


def load(name: str, version: int, uri: str) -> Servable:
    """Load the SavedModel at `uri` (a local folder or gs://) as `version` of model `name`."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 -- registers the in-graph SentencePiece ops

    with storage.local_copy(uri) as local:
        saved_model = tf.saved_model.load(str(local), tags=[SERVE_TAG])
        signature_defs = read_signature_defs(Path(local) / SAVED_MODEL_FILE)
    return Servable(name, version, signature_defs, dict(saved_model.signatures), saved_model)


def read_signature_defs(saved_model_pb: Path) -> dict[str, Any]:
    """The signature defs of the MetaGraphDef tagged "serve" in a saved_model.pb."""
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString(saved_model_pb.read_bytes())
    for meta_graph in proto.meta_graphs:
        if SERVE_TAG in meta_graph.meta_info_def.tags:
            return dict(meta_graph.signature_def)
    raise ValueError(f"{saved_model_pb} has no MetaGraphDef tagged {SERVE_TAG!r}")


def _as_tf(tensor: Tensor) -> Any:
    import tensorflow as tf

    dtype = tf.as_dtype(tensor.dtype.removeprefix("DT_").lower())
    array = np.array(tensor.values, dtype=object if dtype == tf.string else dtype.as_numpy_dtype)
    return tf.constant(array.reshape(tensor.shape), dtype=dtype)


def tf_message(err: BaseException) -> str:
    """A TensorFlow error's message as TF Serving sends it, on one line: without what Python's
    eager runtime adds around it ("Graph execution error:", "Detected at node ...", a Python
    stack, "[Op:__inference_...]") or a `{{function_node ...}}` prefix."""
    text = str(getattr(err, "message", "") or err)
    if text.startswith("Graph execution error:"):
        lines = text.splitlines()
        ends = [i for i, line in enumerate(lines) if _STACK_LINE.match(line)]
        text = "\n".join(lines[ends[-1] + 1 :] if ends else lines[1:])
    text = re.sub(r"\s*\[Op:[^\]]*\]\s*$", "", text)
    text = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", text.strip())
    return (
        " ".join(line.strip() for line in text.splitlines() if line.strip()) or type(err).__name__
    )


# The lines of the Python stack TensorFlow prints before the message itself.
_STACK_LINE = re.compile(r"^(<stack traces unavailable>|\s*File \"|Detected at node|  )")
