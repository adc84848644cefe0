"""Random ops fixed at their expected value, so that two runs of a model can be compared.

A model with random ops (a VITS voice's noise, a stochastic duration predictor) gives another
answer at every run and on every engine: comparing a transformed copy with the original run for
run compares two draws, and fails however right the transform is. ONNX Runtime's unseeded ops even
repeat their first draw across sessions and then drift, so a comparison passes or fails by how
many warm-up runs preceded it. Both copies, fixed the same way, compare everything else exactly.

``RandomNormal[Like]`` -> its mean, ``RandomUniform[Like]`` -> the middle of its range (both as
``ConstantOfShape`` of the shape the op would draw), ``Bernoulli`` -> ``p >= 0.5``,
``Multinomial`` -> the most likely class, repeated ``sample_size`` times.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ferry.graph._walk import subgraphs

__all__ = ["RANDOM_OPS", "random_nodes", "without_randomness"]

#: Standard ONNX ops whose output is a random draw.
RANDOM_OPS = frozenset(
    {
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Bernoulli",
        "Multinomial",
    }
)


def random_nodes(model: ir.Model) -> list[str]:
    """Names of ``model``'s random nodes (subgraphs included), in graph order."""
    return [node.name or node.op_type for node in _all_nodes(model.graph) if _is_random(node)]


def without_randomness(model: ir.Model) -> tuple[ir.Model, list[str]]:
    """``Before -> After``: random draws -> their expected value (see the module's docstring).

    Returns a copy (``model`` is left as it is: it is the one the user runs) and the names of the
    nodes fixed; when there are none, ``model`` itself and an empty list.
    """
    if not random_nodes(model):
        return model, []
    copy = ir.from_proto(ir.to_proto(model))  # any node order, weights shared by the proto
    fixed: list[str] = []
    for graph in _graphs(copy.graph):
        for node in [n for n in graph if _is_random(n)]:
            _replace(graph, node)
            fixed.append(node.name or node.op_type)
    return copy, fixed


def _is_random(node: ir.Node) -> bool:
    return node.domain in ("", "ai.onnx") and node.op_type in RANDOM_OPS


def _graphs(graph: ir.Graph) -> list[ir.Graph]:
    found = [graph]
    for node in graph:
        for body in subgraphs(node):
            found.extend(_graphs(body))
    return found


def _all_nodes(graph: ir.Graph) -> list[ir.Node]:
    return [node for g in _graphs(graph) for node in g]


def _replace(graph: ir.Graph, node: ir.Node) -> None:
    op = node.op_type
    (out,) = node.outputs
    made: list[ir.Node] = []
    if op == "Bernoulli":
        half = _const(made, "half", np.array(0.5, _dtype_of(node.inputs[0], np.float32)))
        ge = _node(made, "GreaterOrEqual", [node.inputs[0], half])
        result = _node(made, "Cast", [ge], to=_attr_int(node, "dtype", _onnx_type(node.inputs[0])))
    elif op == "Multinomial":
        best = _node(made, "ArgMax", [node.inputs[0]], axis=1, keepdims=1)
        size = _attr_int(node, "sample_size", 1)
        repeats = _const(made, "repeats", np.array([1, size], np.int64))
        tiled = _node(made, "Tile", [best, repeats])
        result = _node(made, "Cast", [tiled], to=_attr_int(node, "dtype", ir.DataType.INT32.value))
    else:
        normal = op.startswith("RandomNormal")
        if normal:
            value = _attr_float(node, "mean", 0.0)
        else:
            value = (_attr_float(node, "low", 0.0) + _attr_float(node, "high", 1.0)) / 2
        if op.endswith("Like"):
            source = node.inputs[0]
            dtype_code = _attr_int(node, "dtype", _onnx_type(source))
            shape = _node(made, "Shape", [source])
        else:
            dtype_code = _attr_int(node, "dtype", ir.DataType.FLOAT.value)
            dims = node.attributes["shape"].as_ints()
            shape = _const(made, "shape", np.array(list(dims), np.int64))
        fill = ir.tensor(np.array([value], ir.DataType(dtype_code).numpy()))
        result = _node(made, "ConstantOfShape", [shape], value=fill)
    for new in made:
        graph.insert_before(node, new)
    name = out.name
    result.type, result.shape = out.type, out.shape
    out.replace_all_uses_with(result, replace_graph_outputs=True)
    graph.remove(node, safe=True)
    result.name = name  # a graph output keeps the name its callers read


def _node(
    made: list[ir.Node], op: str, inputs: list[ir.Value | None], **attributes: object
) -> ir.Value:
    node = ir.node(op, inputs, attributes=attributes)  # type: ignore[arg-type]
    made.append(node)
    return node.outputs[0]


def _const(made: list[ir.Node], name: str, array: np.ndarray) -> ir.Value:
    return _node(made, "Constant", [], value=ir.tensor(array, name=name))


def _attr_int(node: ir.Node, name: str, default: int) -> int:
    attr = node.attributes.get(name)
    return default if attr is None else attr.as_int()


def _attr_float(node: ir.Node, name: str, default: float) -> float:
    attr = node.attributes.get(name)
    return default if attr is None else attr.as_float()


def _onnx_type(value: ir.Value | None) -> int:
    if value is None or value.dtype is None:
        return ir.DataType.FLOAT.value
    return value.dtype.value


def _dtype_of(value: ir.Value | None, default: type) -> np.dtype:
    if value is None or value.dtype is None:
        return np.dtype(default)
    return np.dtype(value.dtype.numpy())
