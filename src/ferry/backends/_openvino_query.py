"""Asking OpenVINO which ONNX nodes it takes: its ONNX frontend converts the model (partially,
unconvertible nodes becoming placeholders) and its CPU plugin's ``query_model`` says which ops it
supports; each OpenVINO op is mapped back to the ONNX node(s) it came from.

Names. OpenVINO's ONNX frontend turns an ONNX node into one or more OpenVINO ops. The op that
produces an ONNX output carries that output as its tensor name and is called after the ONNX node
(after the output when the node has no name or produces a graph output; ``node_output`` when a
node's outputs come from different ops); ops in the middle of a decomposition get generated names
(``Multiply_48``). :class:`_OwnerMap` therefore maps OpenVINO ops back to ONNX nodes through tensor
names, then node names, and attributes a nameless op to the ONNX node(s) its results flow into.

Before -> After::

    model, nodes ["ln", "loop"] -> {"loop": "OpenVINO's ONNX frontend cannot convert ..."}
"""

from __future__ import annotations

import io
import logging
import re
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from ferry.backends._base import model_source
from ferry.errors import PlanError
from ferry.plan import cut

__all__ = ["DEVICE", "candidate_model", "engine_rejects", "first_line", "ov_core"]

logger = logging.getLogger(__name__)

#: The OpenVINO device ferry compiles for.
DEVICE = "CPU"
# OpenVINO ops that hold no computation of their own; they never decide whether a node runs.
_STRUCTURAL = frozenset({"Parameter", "Result", "Constant"})
# How many times validate() cuts out what the CPU plugin choked on and asks again.
_QUERY_RETRIES = 4

_core: Any = None
_frontend: Any = None
_sdk_lock = threading.Lock()
# OpenVINO's ONNX frontend is not documented as thread-safe; validate() converts under this lock.
_frontend_lock = threading.Lock()


def ov_core() -> Any:
    """The process's one ``openvino.Core`` (plugins load once; compile_model is thread-safe)."""
    global _core
    with _sdk_lock:
        if _core is None:
            import openvino

            _core = openvino.Core()
        return _core


def _onnx_frontend() -> Any:
    global _frontend
    with _sdk_lock:
        if _frontend is None:
            from openvino.frontend import FrontEndManager

            _frontend = FrontEndManager().load_by_framework("onnx")
        return _frontend


def engine_rejects(model: ir.Model, nodes: Sequence[str]) -> dict[str, str]:
    """Which of ``nodes`` OpenVINO rejects: its ONNX frontend cannot convert them, or its CPU
    plugin's ``query_model`` does not report them as supported.

    Algorithm: convert ``model`` partially (unconvertible nodes become placeholder ops) and
    reject the placeholders' nodes; replace each placeholder's outputs by fresh inputs and ask
    ``query_model``; reject the nodes owning any op it leaves out. When ``query_model`` itself
    fails, reject the nodes its message names and ask again, or, when it names none, all of
    ``nodes`` with its message.
    """
    wanted = set(nodes)
    if not wanted:
        return {}
    rejected: dict[str, str] = {}
    with _frontend_lock:
        try:
            ov_model, unconverted = _convert_partially(model)
        except Exception as e:  # the frontend could not even parse the model
            reason = f"OpenVINO's ONNX frontend cannot read the model: {first_line(e)}"
            return dict.fromkeys(nodes, reason)
    owners = _OwnerMap(model, ov_model)
    for node, reason in _rank_disagreements(model, ov_model, owners).items():
        rejected.setdefault(node, reason)
    for op, reason in unconverted:
        for node in owners.of(op):
            rejected.setdefault(node, reason)
    if unconverted:
        ov_model = _cut_out([op for op, _ in unconverted], model, ov_model)
    core = ov_core()
    for _ in range(_QUERY_RETRIES):
        try:
            supported = core.query_model(ov_model, DEVICE)
        except Exception as e:  # the plugin's transformations threw on some op
            culprits = owners.named_in(str(e))
            if not culprits:
                reason = f"OpenVINO's CPU plugin failed to check the model: {first_line(e)}"
                return {n: rejected.get(n, reason) for n in nodes}
            reason = f"OpenVINO's CPU plugin failed on it: {first_line(e)}"
            for op in culprits:
                for node in owners.of(op):
                    rejected.setdefault(node, reason)
            ov_model = _cut_out(culprits, model, ov_model)
            continue
        for op in ov_model.get_ordered_ops():
            if op.get_type_name() in _STRUCTURAL or op.get_friendly_name() in supported:
                continue
            for node in owners.of(op):
                rejected.setdefault(
                    node, f"OpenVINO's CPU plugin does not support its {op.get_type_name()} op"
                )
        break
    else:
        reason = "OpenVINO's CPU plugin kept failing to check the model"
        for n in nodes:
            rejected.setdefault(n, reason)
    # A partial conversion validates less than reading the model for real (a Loop whose body
    # reads outer values passes one and fails the other): read it for real, and refuse the
    # nodes the frontend names.
    for node, why in _full_conversion_failures(model).items():
        rejected.setdefault(node, why)
    return {n: r for n, r in rejected.items() if n in wanted}


def _rank_disagreements(model: ir.Model, ov_model: Any, owners: _OwnerMap) -> dict[str, str]:
    """ONNX nodes whose output OpenVINO's frontend gives another rank than ONNX's own inference.

    OpenVINO then computes something else there: on a DETR-style head it converts an Unsqueeze of
    a [tiles, 17, 1] tensor to shape [1], computes a single value, and a Concat behind it fails.
    A partition boundary on such a value hands the next engine a wrong tensor, so the node is
    left to another engine. Only ranks are compared (dims may be symbolic on either side).
    """
    # Graph outputs are left out: their shapes are the exporter's declarations, often wrong
    # (a CTC recognizer declares [1, seqlen] and returns [20, 1, 8210]); inner values' are ONNX's.
    outputs = {v.name for v in model.graph.outputs}
    ranks = {
        v.name: len(v.shape)
        for v in _all_values(model)
        if v.name and v.shape is not None and v.name not in outputs
    }
    found: dict[str, str] = {}
    for op in ov_model.get_ordered_ops():
        if op.get_type_name() in _STRUCTURAL:
            continue
        for output in op.outputs():
            rank = output.get_partial_shape().rank
            if rank.is_dynamic:
                continue
            for tensor in output.get_names():
                want = ranks.get(tensor)
                if want is None or want == rank.get_length():
                    continue
                for node in owners.of(op):
                    found.setdefault(
                        node,
                        f"OpenVINO's ONNX frontend makes {tensor!r} rank {rank.get_length()} where "
                        f"ONNX's shape inference gives rank {want}: it would compute another value",
                    )
    return found


# ---------------------------------------------------------------------------------------------
# Reading models


def candidate_model(model: ir.Model, nodes: Sequence[str]) -> ir.Model | None:
    """``nodes`` of ``model`` as a model of their own, as a partition of them would be lowered;
    None when they cannot be cut out: then the whole model is asked."""
    try:
        return cut(model, nodes)
    except PlanError as e:
        logger.debug("openvino: asking about the whole model: %s", e)
        return None


def _convert_partially(model: ir.Model) -> tuple[Any, list[tuple[Any, str]]]:
    """The model as OpenVINO sees it, with a reason for each op its frontend could not convert."""
    frontend = _onnx_frontend()
    with model_source(model) as (data, file):

        def read() -> Any:
            return frontend.load(io.BytesIO(data) if data is not None else str(file))

        ov_model = frontend.convert_partially(read())
        placeholders = [op for op in ov_model.get_ordered_ops() if _is_placeholder(op)]
        if not placeholders:
            return ov_model, []
        why = ""
        try:  # a full conversion raises with the frontend's explanation of every failure
            frontend.convert(read())
        except Exception as e:
            why = str(e)
    found = []
    for op in placeholders:
        attrs = op.get_attributes()
        domain = str(attrs.get("ONNX_META_domain", ""))
        op_type = str(attrs.get("ONNX_META_type", op.get_type_name()))
        found.append((op, _unconverted_reason(domain, op_type, why)))
    return ov_model, found


# "While validating ONNX node '<Node(Loop): name>'": the frontend names the nodes it failed on.
_FAILED_NODE = re.compile(r"<Node\((?P<op>[^)]*)\): (?P<name>[^>]*)>")


def _full_conversion_failures(model: ir.Model) -> dict[str, str]:
    """The nodes OpenVINO's frontend fails on when it converts ``model`` for real, with why."""
    frontend = _onnx_frontend()
    with _frontend_lock, model_source(model) as (data, file):
        try:
            frontend.convert(frontend.load(io.BytesIO(data) if data is not None else str(file)))
        except Exception as e:
            message = str(e)
        else:
            return {}
    producer = {out.name: node.name for node in model.graph for out in node.outputs if node.name}
    names = {node.name for node in model.graph}
    found: dict[str, str] = {}
    for match in _FAILED_NODE.finditer(message):
        label = match.group("name").strip()
        node = label if label in names else producer.get(label)
        if node is not None:
            detail = next(
                (
                    line.strip()
                    for line in message.splitlines()[message[: match.start()].count("\n") + 1 :]
                    if line.strip()
                ),
                "",
            )
            found[node] = (
                f"OpenVINO's ONNX frontend fails to convert its {match.group('op')}: {detail[:300]}"
            )
    return found


def _is_placeholder(op: Any) -> bool:
    # The frontend stands NotSupportedONNXNode (or ONNXFrameworkNode) in for what it cannot convert.
    name = str(op.get_type_name())
    return "NotSupported" in name or "FrameworkNode" in name


def _unconverted_reason(domain: str, op_type: str, message: str) -> str:
    full = op_type if domain in ("", "ai.onnx") else f"{domain}.{op_type}"
    rule_line = re.search(r"No conversion rule found for operations:([^\n]*)", message)
    if rule_line and full in rule_line.group(1):
        return f"OpenVINO's ONNX frontend has no conversion for {full}"
    detail = ""
    for line in message.splitlines():
        # "Conversion is failed for: Cast-28" is followed by the translator's message.
        if "Unsupported" in line or "failed" in line.lower():
            detail = line.strip()
    if detail:
        return f"OpenVINO's ONNX frontend failed to convert {full}: {detail[:300]}"
    return f"OpenVINO's ONNX frontend failed to convert {full}"


def _cut_out(ops: Iterable[Any], model: ir.Model, ov_model: Any) -> Any:
    """``ov_model`` with each of ``ops``' results fed by a new Parameter instead (typed from the
    ONNX value where OpenVINO does not know), so that the rest can be queried without them."""
    import openvino as ov
    from openvino import opset13

    values = {v.name: v for v in _all_values(model)}
    new_params = []
    for op in ops:
        for output in op.outputs():
            if not output.get_target_inputs():
                continue
            element_type = output.get_element_type()
            shape = output.get_partial_shape()
            value = next((values[n] for n in output.get_names() if n in values), None)
            if value is not None and value.dtype is not None and element_type.is_dynamic():
                element_type = ov.Type(np.dtype(value.dtype.numpy()))
            if value is not None and value.shape is not None and shape.rank.is_dynamic:
                shape = ov.PartialShape([d if isinstance(d, int) else -1 for d in value.shape])
            param = opset13.parameter(shape, element_type)
            for target in list(output.get_target_inputs()):
                target.replace_source_output(param.output(0))
            new_params.append(param)
    ov_model.add_parameters(new_params)
    ov_model.validate_nodes_and_infer_types()
    return ov_model


def _all_values(model: ir.Model) -> Iterable[ir.Value]:
    yield from model.graph.inputs
    for node in model.graph:
        yield from node.outputs


class _OwnerMap:
    """Maps OpenVINO ops (of a model converted from ``model``) to the ONNX node names they came from."""

    def __init__(self, model: ir.Model, ov_model: Any) -> None:
        self._node_names = {node.name for node in model.graph if node.name}
        self._producer = {
            out.name: node.name for node in model.graph for out in node.outputs if node.name
        }
        self._ops = {op.get_friendly_name(): op for op in ov_model.get_ordered_ops()}
        self._cache: dict[str, frozenset[str]] = {}

    def direct(self, op: Any) -> str | None:
        """The ONNX node whose output ``op`` produces, or that ``op`` is named after."""
        for output in op.outputs():
            for tensor in output.get_names():
                if tensor in self._producer:
                    return self._producer[tensor]
        name = op.get_friendly_name()
        return name if name in self._node_names else None

    def of(self, op: Any) -> frozenset[str]:
        """The ONNX node(s) ``op`` belongs to: its own, or, for an op in the middle of a
        decomposition, the nearest named ops its results reach (breadth first)."""
        key = op.get_friendly_name()
        if key in self._cache:
            return self._cache[key]
        own = self.direct(op)
        found: set[str] = set()
        if own is not None:
            found.add(own)
        else:
            seen = {key}
            frontier = [op]
            while frontier and not found:
                following = []
                for current in frontier:
                    for output in current.outputs():
                        for target in output.get_target_inputs():
                            nxt = target.get_node()
                            name = nxt.get_friendly_name()
                            if name in seen or nxt.get_type_name() == "Result":
                                continue
                            seen.add(name)
                            owner = self.direct(nxt)
                            if owner is not None:
                                found.add(owner)
                            else:
                                following.append(nxt)
                frontier = following
        result = frozenset(found)
        self._cache[key] = result
        return result

    def named_in(self, message: str) -> list[Any]:
        """Ops whose names appear in an OpenVINO error message (delimited, as OpenVINO quotes them)."""
        found = []
        for name, op in self._ops.items():
            if op.get_type_name() in _STRUCTURAL or not name:
                continue
            if re.search(rf"(?<![\w/.-]){re.escape(name)}(?![\w/.-])", message):
                found.append(op)
        return found


# ---------------------------------------------------------------------------------------------
# Ports


def first_line(e: BaseException) -> str:
    """The useful part of an OpenVINO exception: its C++ messages are prefixed with source paths."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    useful = [
        line
        for line in lines
        if not line.startswith(("Exception from", "Check '")) and "src/" not in line[:60]
    ]
    text = (useful or lines or [type(e).__name__])[0]
    return text[:500]
