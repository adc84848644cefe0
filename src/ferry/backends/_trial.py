"""Capability asked of the engine by trial: each node compiled alone, answers remembered.

An engine that cannot be asked about a whole model (no ``query_model``, no ``GetCapability``)
can still be asked about one node at a time: build it alone into a small model and let the
engine import and compile it (``Backend.trial``). The op table is the prefilter (a node its
rules refuse is never tried); each answer is kept per node signature, so a model with fifty
identical Convs costs one trial.

Before -> After::

    model + node names -> {node: True | "Softmax: opset 9 outside supported range 13..28"
                                     | "<the engine's first line>"}
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import LiftConstantsToInitializersPass

from ferry.backends._capability import rule_table, rule_verdicts
from ferry.errors import FerryError
from ferry.plan import cut, is_constant

if TYPE_CHECKING:
    from ferry.backends._api import Backend

__all__ = ["node_signature", "trial_capability"]

logger = logging.getLogger(__name__)

#: A constant input this small is part of a node's signature by value: a shape, axes or scales
#: decide whether an engine takes the node; weights (larger) only by dtype and rank.
_SMALL_CONSTANT = 64

#: How much of the engine's message a reason keeps.
_REASON_CHARS = 300

# Answers per backend instance, per node signature; the lock keeps two threads placing at once
# from losing each other's answers (a duplicate trial is harmless).
_memo: weakref.WeakKeyDictionary[object, dict[Hashable, bool | str]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def trial_capability(
    backend: Backend, model: ir.Model, nodes: Sequence[str]
) -> dict[str, bool | str]:
    """Whether ``backend`` takes each of ``nodes``, asked of its engine one node at a time.

    A node its rules refuse gets the rule's reason (without ``rules()`` every node is tried);
    each other node is cut out alone (its inputs as typed graph inputs, constant inputs carried
    as weights, its outputs as graph outputs, the model's opsets) and handed to
    ``backend.trial``: True when it returns, else the first line of the engine's message. Answers are remembered per backend and node signature
    (:func:`node_signature`) for the life of the process. An adapter whose engine is asked this
    way returns ``trial_capability(self, model, nodes)`` from its ``capability()``.

    Args:
        backend: the adapter; its ``rules()`` prefilter, its ``trial()`` answers.
        model: the model, named and typed (``ferry.graph.prepare``).
        nodes: the nodes to ask about.

    Returns:
        For each of ``nodes``, True or why not. Where ``trial`` raises NotImplementedError the
        engine cannot be asked this way, and the rules' answer stands.
    """
    if rule_table(backend) is None:  # no table to prefilter with: the engine answers alone
        verdicts: dict[str, bool | str] = dict.fromkeys(nodes, True)
    else:
        verdicts = rule_verdicts(backend, model, nodes)
    by_name = {node.name: node for node in model.graph}
    with _lock:
        memo = _memo.setdefault(backend, {})
    for name in nodes:
        if verdicts[name] is not True:
            continue
        node = by_name[name]
        key = node_signature(node)
        answer = memo.get(key)
        if answer is None:
            try:
                answer = _try(backend, model, node)
            except NotImplementedError:
                logger.debug("%s cannot be asked by trial; its rules answer", backend.name)
                return rule_verdicts(backend, model, nodes)
            with _lock:
                memo[key] = answer
        verdicts[name] = answer
    return verdicts


def node_signature(node: ir.Node) -> Hashable:
    """What decides whether an engine compiles ``node`` alone: its op type and domain, its
    attributes, each input's dtype and rank and whether it is a constant (a small constant's
    value too: a Reshape's shape), and its output count."""
    inputs: list[Hashable] = []
    for value in node.inputs:
        if value is None:
            inputs.append(None)
            continue
        shape = value.shape
        constant: Hashable = is_constant(value)
        tensor = value.const_value
        if tensor is not None and tensor.size <= _SMALL_CONSTANT:
            array = np.asarray(tensor.numpy())
            constant = (array.dtype.str, array.shape, array.tobytes())
        inputs.append((str(value.dtype), None if shape is None else len(shape), constant))
    attributes = tuple(sorted((name, str(attr)) for name, attr in node.attributes.items()))
    return (node.domain, node.op_type, attributes, tuple(inputs), len(node.outputs))


def _try(backend: Backend, model: ir.Model, node: ir.Node) -> bool | str:
    """Cut ``node`` out alone and hand it to the engine: True, or its reason.

    Raises:
        NotImplementedError: the backend has no ``trial``.
    """
    outputs = [value.name for value in node.outputs if value is not None and value.name]
    try:
        alone = cut(model, [node.name or ""], outputs=outputs)
    except FerryError as e:
        return f"cannot be tried alone: {_first_line(e)}"
    # Constant nodes the cut copied in for its inputs become weights: the engine sees one node.
    LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(alone)
    try:
        backend.trial(alone)
    except NotImplementedError:
        raise
    except Exception as e:  # the engine's own exception types: its message is the reason
        logger.debug("%s refused %s %r: %s", backend.name, node.op_type, node.name, e)
        return _first_line(e)
    return True


def _first_line(error: BaseException) -> str:
    """The first non-blank line of ``error``'s message, trimmed; its type when it says nothing."""
    for line in str(error).splitlines():
        if line.strip():
            text = line.strip()
            return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."
    return type(error).__name__
