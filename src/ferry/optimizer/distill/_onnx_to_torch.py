"""ONNX -> a trainable ``torch.nn.Module``, and the trained weights written back into the ONNX graph.

Before -> After::

    ir.Model (weights in initializers or Constant nodes)
        -> OnnxModule: every float weight an ``nn.Parameter``, the nodes evaluated in topological
           order with torch ops (eagerly: shapes are concrete ints at run time)
    OnnxModule (trained) + the ir.Model it came from
        -> a copy of the ir.Model with the parameters' values in place of the old weights

Writing the values back into a copy of the original graph keeps its structure, names and opset
exactly (no exporter in between), so the result runs wherever the student did.

Choices:

* **Which constants train.** A float tensor of two or more elements, held in an initializer or a
  Constant node's ``value`` (Paddle exports use those), is a parameter unless every use of it is a
  slot that is not a weight: BatchNormalization's running mean and variance, Resize's roi and
  scales, Pad's pads, Clip's bounds, shape inputs. Scalars stay frozen: they are epsilons, bounds
  and shape arithmetic, not learned weights.
* **BatchNormalization stays in inference form** (``F.batch_norm(training=False)``): its running
  mean and variance are frozen, its scale and bias train. Distillation data is small and unlabeled
  and batches are small; re-estimating the statistics from them would move the model away from
  the data it was trained on, and freezing them keeps the exported node exactly as it was.
* **Precision.** The module computes floats in float32 (a ``Cast`` to float16 or bfloat16 becomes
  float32); weights are written back in their own dtype.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx_ir as ir
from torch import nn

from ferry.errors import InvalidInputError, UnsupportedOpError
from ferry.graph import constant as constant_of
from ferry.optimizer.distill._torch_ops import (
    MULTI_OUTPUT,
    OPS,
    TORCH_DTYPES,
    Attrs,
    OpFn,
    Tensor,
    as_tensor,
    split,
)

__all__ = ["OnnxModule", "supported_ops", "to_torch", "write_back"]

#: Input slots that are not weights (a constant used only in these stays frozen).
_FROZEN_SLOTS: dict[str, set[int]] = {
    "BatchNormalization": {3, 4},
    "Resize": {1, 2, 3},
    "Upsample": {1},
    "Pad": {1, 2, 3},
    "Clip": {1, 2},
    "Reshape": {1},
    "Expand": {1},
    "Tile": {1},
    "Slice": {1, 2, 3, 4},
    "Squeeze": {1},
    "Unsqueeze": {1},
    "Split": {1},
    "ConstantOfShape": {0},
    "Range": {0, 1, 2},
    "ReduceMean": {1},
    "ReduceSum": {1},
    "ReduceMax": {1},
    "ReduceMin": {1},
}

_FLOATS = {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE}


def supported_ops() -> list[str]:
    """The ONNX ops (default domain) the module evaluates."""
    return sorted([*OPS, *MULTI_OUTPUT, "Constant"])


def _unsupported_reason(node: ir.Node, opset: int) -> str | None:
    """Why this node cannot be evaluated (None: it can)."""
    if node.domain not in ("", "ai.onnx"):
        return f"custom domain {node.domain!r}"
    op = node.op_type
    if op not in OPS and op not in MULTI_OUTPUT and op != "Constant":
        return "op not supported"
    a = {k: v.value for k, v in node.attributes.items()}
    if op == "Resize" or op == "Upsample":
        if a.get("mode", "nearest") not in ("nearest", "linear", "bilinear"):
            return f"mode {a.get('mode')!r} (only nearest and linear)"
        if a.get("coordinate_transformation_mode") == "tf_crop_and_resize":
            return "coordinate_transformation_mode tf_crop_and_resize"
        if a.get("antialias", 0):
            return "antialias"
        if a.get("keep_aspect_ratio_policy", "stretch") != "stretch":
            return "keep_aspect_ratio_policy other than stretch"
    if op == "Pad" and a.get("mode", "constant") not in ("constant", "reflect", "edge"):
        return f"mode {a.get('mode')!r}"
    if op == "MaxPool" and len(node.outputs) > 1 and node.outputs[1].uses():
        return "its Indices output is used"
    if op == "BatchNormalization" and a.get("training_mode", 0):
        return "training_mode=1"
    if op == "Constant" and (
        not any(k in a for k in _CONSTANT_KEYS) or constant_of(node.outputs[0]) is None
    ):
        return "Constant without a tensor, float(s) or int(s) value"
    if op == "Cast" and ir.DataType(int(a.get("to", 1))) not in TORCH_DTYPES:
        return f"Cast to {ir.DataType(int(a.get('to', 1))).name}"
    return None


_CONSTANT_KEYS = ("value", "value_float", "value_floats", "value_int", "value_ints")


# ----------------------------------------------------------------------------------------------
# the module


class OnnxModule(nn.Module):
    """An ONNX graph as a trainable torch module.

    Attributes:
        input_names / output_names: the graph's inputs (without initializers) and outputs.
        trainable: names of the ONNX values held as parameters, in ``parameters()`` order.
        sources: per trainable value, where its weight lives (``"initializer"`` or
            ``"constant"``: a Constant node's ``value``) and its ONNX dtype.

    ``forward(*inputs)`` takes tensors in ``input_names`` order and returns a tuple in
    ``output_names`` order; :meth:`run` takes a dict and can return intermediate values too.
    """

    def __init__(self, model: ir.Model) -> None:
        super().__init__()
        graph = model.graph
        self.opset = int(model.opset_imports.get("", model.opset_imports.get("ai.onnx", 13)))
        initializers = graph.initializers
        self.input_names = [v.name or "" for v in graph.inputs if v.name not in initializers]
        self.output_names = [v.name or "" for v in graph.outputs]

        unsupported = [
            (node.op_type, node.name or "", reason)
            for node in graph
            if (reason := _unsupported_reason(node, self.opset)) is not None
        ]
        if unsupported:
            listed = "; ".join(f"{name or '?'} ({op}: {why})" for op, name, why in unsupported)
            raise UnsupportedOpError(
                f"the student cannot be turned into a torch module: {len(unsupported)} node(s) "
                f"use what ferry's ONNX -> torch conversion does not cover: {listed}. Supported "
                f"ops: {', '.join(supported_ops())}",
                ops=[(op, name) for op, name, _ in unsupported],
            )

        constants: dict[str, tuple[np.ndarray, str, ir.DataType]] = {}
        for name, value in initializers.items():
            # An initializer that is also an input is not fed to the module: it holds its default.
            array = constant_of(value, input_defaults=True)
            if array is not None and value.dtype is not None:
                constants[name] = (array, "initializer", value.dtype)
        self._plan: list[tuple[str, OpFn | None, list[str], list[str], Attrs, str]] = []
        for node in graph:
            if node.op_type == "Constant":
                array = constant_of(node.outputs[0])
                if array is None:  # unreachable: _unsupported_reason refused such nodes above
                    continue
                out = node.outputs[0]
                dtype = out.dtype or ir.DataType.from_numpy(array.dtype)
                kind = "constant" if "value" in node.attributes else "constant-literal"
                constants[out.name or ""] = (array, kind, dtype)
                continue
            attrs = {k: v.value for k, v in node.attributes.items()}
            self._plan.append(
                (
                    node.op_type,
                    OPS.get(node.op_type),
                    [v.name or "" if v is not None else "" for v in node.inputs],
                    [v.name or "" for v in node.outputs],
                    attrs,
                    node.name or "",
                )
            )

        trainable = {name for name in constants if self._is_weight(graph, name, constants[name])}
        self.trainable: list[str] = []
        self.sources: dict[str, tuple[str, ir.DataType]] = {}
        self.weights = nn.ParameterList()
        self._slots: dict[str, tuple[str, int]] = {}
        frozen = 0
        for name, (array, kind, dtype) in constants.items():
            tensor = as_tensor(array)
            if name in trainable:
                self._slots[name] = ("p", len(self.trainable))
                self.trainable.append(name)
                self.sources[name] = (kind, dtype)
                self.weights.append(nn.Parameter(tensor.float()))
            else:
                self.register_buffer(f"frozen_{frozen}", tensor, persistent=True)
                self._slots[name] = ("b", frozen)
                frozen += 1

        # Where each value is read last, so that forward drops what it no longer needs.
        self._last_use: dict[str, int] = {}
        for i, (_, _, inputs, _, _, _) in enumerate(self._plan):
            for name in inputs:
                self._last_use[name] = i

    @staticmethod
    def _is_weight(
        graph: ir.Graph, name: str, constant: tuple[np.ndarray, str, ir.DataType]
    ) -> bool:
        array, kind, dtype = constant
        if kind == "constant-literal" or dtype not in _FLOATS or array.size < 2:
            return False
        uses = [
            (node.op_type, i)
            for node in graph
            for i, v in enumerate(node.inputs)
            if v is not None and v.name == name
        ]
        return any(i not in _FROZEN_SLOTS.get(op, set()) for op, i in uses) or any(
            v.name == name for v in graph.outputs
        )

    def _constant(self, name: str) -> Tensor:
        kind, index = self._slots[name]
        if kind == "p":
            return self.weights[index]
        tensor: Tensor = getattr(self, f"frozen_{index}")
        return tensor

    def run(
        self, feeds: Mapping[str, Tensor], outputs: Sequence[str] | None = None
    ) -> dict[str, Tensor]:
        """The values named ``outputs`` (default: the graph outputs) for ``feeds``.

        Raises:
            InvalidInputError: an input is missing, or an output name is not in the graph.
        """
        wanted = list(outputs or self.output_names)
        env: dict[str, Tensor] = {}
        for name in self.input_names:
            if name not in feeds:
                raise InvalidInputError(
                    f"the module needs input {name!r}; it takes {self.input_names}"
                )
            env[name] = feeds[name]
        keep = set(wanted)
        for i, (op, fn, inputs, outs, attrs, node_name) in enumerate(self._plan):
            args: list[Tensor | None] = []
            for name in inputs:
                if not name:
                    args.append(None)
                elif name in env:
                    args.append(env[name])
                elif name in self._slots:
                    args.append(self._constant(name))
                else:
                    raise InvalidInputError(
                        f"node {node_name!r} ({op}) reads unknown value {name!r}"
                    )
            try:
                if op == "Split":
                    results = split(args, attrs, self.opset, len(outs))
                else:
                    assert fn is not None
                    results = fn(args, attrs, self.opset)
            except (RuntimeError, ValueError, IndexError, TypeError) as e:
                raise InvalidInputError(
                    f"node {node_name!r} ({op}) failed in the torch module: {e}"
                ) from e
            for name, result in zip(outs, results, strict=False):
                if name:
                    env[name] = result
            for name in inputs:
                if self._last_use.get(name) == i and name not in keep:
                    env.pop(name, None)
        missing = [n for n in wanted if n not in env and n not in self._slots]
        if missing:
            raise InvalidInputError(
                f"no value named {', '.join(map(repr, missing))} in the graph: name a node output"
            )
        return {n: env[n] if n in env else self._constant(n) for n in wanted}

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        values = self.run(dict(zip(self.input_names, inputs, strict=True)))
        return tuple(values[n] for n in self.output_names)


def to_torch(model: ir.Model) -> OnnxModule:
    """``model`` as a trainable torch module (see :class:`OnnxModule`).

    Raises:
        UnsupportedOpError: some nodes cannot be evaluated; every one is listed at once.
    """
    return OnnxModule(model)


def write_back(model: ir.Model, module: OnnxModule) -> ir.Model:
    """A copy of ``model`` with ``module``'s parameter values as its weights (``model`` is kept).

    Initializers get new tensors; Constant nodes get a new ``value``; every weight keeps its
    name and its ONNX dtype.
    """
    out = model.clone()
    constants = {node.outputs[0].name: node for node in out.graph if node.op_type == "Constant"}
    for name, parameter in zip(module.trainable, module.weights, strict=True):
        kind, dtype = module.sources[name]
        array = parameter.detach().cpu().numpy().astype(dtype.numpy(), copy=False)
        tensor = ir.tensor(array, dtype=dtype, name=name)
        if kind == "initializer":
            out.graph.initializers[name].const_value = tensor
        else:
            constants[name].attributes["value"] = ir.AttrTensor("value", tensor)
    return out
