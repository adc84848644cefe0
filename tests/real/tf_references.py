"""The kit's TensorFlow-family models run by their own runtimes, for the real tier's references.

Each function runs the source file as its users do, independently of ferry's converters: LiteRT's
interpreter for ``.tflite`` (a fresh one per call, so a stateful model starts from its initial
state as on a device), Keras for ``.h5``, and a TF1 session for the SavedModel that TensorFlow 2's
object loader cannot restore (kit note). :class:`LiteRTStream` keeps one interpreter across calls,
as a streaming app does, and reads the values the model assigns to its resource variables.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np


def litert_outputs(path: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's outputs, by tensor name, from a fresh LiteRT interpreter."""
    return LiteRTStream(path, variables=False).step(feeds)[0]


def litert_output_quantization(path: Path) -> dict[str, tuple[float, int]]:
    """``{output: (scale, zero point)}`` of the model's integer outputs."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    found = {}
    for detail in interpreter.get_output_details():
        scale, zero = detail["quantization"]
        if np.issubdtype(detail["dtype"], np.integer) and scale:
            found[detail["name"]] = (float(scale), int(zero))
    return found


class LiteRTStream:
    """One LiteRT interpreter called again and again: its resource variables carry over.

    ``step`` returns the outputs and, for each variable (by ``shared_name``), the value the call
    assigned to it, read from the tensor the last ASSIGN_VARIABLE of the main subgraph writes.
    """

    def __init__(self, path: Path, *, variables: bool = True) -> None:
        from ai_edge_litert.interpreter import Interpreter

        self.assigned = _assigned_tensors(path) if variables else {}
        with warnings.catch_warnings():
            # It warns that keeping every tensor is for debugging: reading them is the point.
            warnings.simplefilter("ignore", UserWarning)
            # Intermediate tensors (what ASSIGN_VARIABLE writes) stay readable after invoke.
            self.interpreter = Interpreter(
                model_path=str(path), experimental_preserve_all_tensors=bool(self.assigned)
            )
        self._shapes: list[tuple[int, ...]] | None = None

    def step(
        self, feeds: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        it = self.interpreter
        inputs = it.get_input_details()
        shapes = [tuple(np.shape(feeds[d["name"]])) for d in inputs]
        if shapes != self._shapes:
            for detail, shape in zip(inputs, shapes):
                it.resize_tensor_input(detail["index"], shape, strict=False)
            it.allocate_tensors()
            self._shapes = shapes
        for detail in inputs:
            it.set_tensor(detail["index"], np.asarray(feeds[detail["name"]], detail["dtype"]))
        it.invoke()
        outputs = {d["name"]: np.array(it.get_tensor(d["index"])) for d in it.get_output_details()}
        variables = {name: np.array(it.get_tensor(t)) for name, t in self.assigned.items()}
        return outputs, variables


def _assigned_tensors(path: Path) -> dict[str, int]:
    """Variable (``shared_name``) -> the tensor of subgraph 0 its last ASSIGN_VARIABLE writes."""
    from ferry.tflite import read_tflite

    main = read_tflite(path.read_bytes(), str(path)).subgraphs[0]
    names: dict[int, str] = {}
    assigned: dict[str, int] = {}
    for op in main.operators:
        if op.opcode == "VAR_HANDLE":
            names[op.outputs[0]] = str(op.options["shared_name"])
        elif op.opcode == "ASSIGN_VARIABLE":
            assigned[names[op.inputs[0]]] = op.inputs[1]
    return assigned


def keras_outputs(path: Path, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The model's outputs, in its output order, from Keras (``load_model``, ``compile=False``)."""
    model = _keras_model(str(path))
    result = model(list(feeds.values()), training=False)  # the kit's inputs: the model's order
    values = result if isinstance(result, (list, tuple)) else [result]
    return [np.asarray(v) for v in values]


@functools.cache
def _keras_model(path: str) -> Any:
    import keras

    return keras.models.load_model(path, compile=False)


def saved_model_outputs(
    path: Path, feeds: Mapping[str, np.ndarray], signature: str = "serving_default"
) -> dict[str, np.ndarray]:
    """The signature's outputs, by key, from the SavedModel loaded in a TF1 session."""
    session, meta_graph = _tf1_session(str(path))
    sig = meta_graph.signature_def[signature]
    fetches = {key: info.name for key, info in sig.outputs.items()}
    feed_dict = {sig.inputs[key].name: value for key, value in feeds.items()}
    return dict(session.run(fetches, feed_dict=feed_dict))


@functools.cache
def _tf1_session(path: str) -> tuple[Any, Any]:
    import tensorflow as tf

    graph = tf.Graph()
    session = tf.compat.v1.Session(graph=graph)
    with graph.as_default():
        meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)
    return session, meta_graph
