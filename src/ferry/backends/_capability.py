"""Capability: which of a model's nodes an engine takes, and why not the others.

Two sources, in order: the backend's rule table (a fast prefilter, and the only answer where the
engine cannot be asked, e.g. TensorRT without a GPU), then the engine itself, which may veto what
its rules over-claimed (``Backend.validate``: OpenVINO's ``query_model``, TensorRT's ONNX parser).

Before -> After::

    model + node names -> {node: True | "Softmax: opset 9 outside supported range 13..28"
                                     | "vetoed by openvino: ..."}
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import onnx_ir as ir

from ferry.backends._rules import RuleTable
from ferry.errors import FerryError

__all__ = ["capability"]

logger = logging.getLogger(__name__)


def capability(
    backend: Any, model: ir.Model, nodes: Sequence[str], *, ask_engine: bool = True
) -> dict[str, bool | str]:
    """Whether ``backend`` takes each of ``nodes`` (names in ``model``), or why not.

    Args:
        backend: the adapter; its ``rules()`` and ``validate()`` are used where it has them.
        model: the model, named and typed (``ferry.graph.prepare``).
        nodes: the nodes to ask about.
        ask_engine: let the engine veto what its rules accept.

    Raises:
        FerryError: the engine failed while being asked.
    """
    by_name = {node.name: node for node in model.graph}
    rules = getattr(backend, "rules", None)
    table = RuleTable(rules()) if callable(rules) else None
    opsets = model.opset_imports
    verdicts: dict[str, bool | str] = {}
    for name in nodes:
        if table is None:
            verdicts[name] = f"{backend.name} declares no op rules"
        else:
            verdicts[name] = table.supports(by_name[name], opsets)
    accepted = [name for name in nodes if verdicts[name] is True]
    check = getattr(backend, "validate", None)
    if not ask_engine or not accepted or not callable(check):
        return verdicts
    try:
        vetoed = check(model, accepted)
    except FerryError:
        raise
    except Exception as e:  # an engine's own exception types; name the backend
        raise FerryError(
            f"backend {backend.name!r} failed while validating {len(accepted)} candidate "
            f"node(s): {e}; partition with validate=False to rely on its rules alone"
        ) from e
    for name, why in dict(vetoed or {}).items():
        if verdicts.get(name) is not True:
            logger.debug("%s vetoed %r, which was not a candidate", backend.name, name)
            continue
        verdicts[name] = f"vetoed by {backend.name}: {why}"
    return verdicts
