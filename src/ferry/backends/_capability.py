"""Capability: which of a model's nodes an engine takes, and why not the others.

A backend that can be asked about the whole model answers itself (``Backend.capability``:
OpenVINO offers the model to its frontend and ``query_model``, its table only adding what it
knows is wrong). Otherwise two sources, in order: the backend's rule table (the only answer where
the engine cannot be asked, e.g. TensorRT without a GPU), then the engine, which may veto what
its rules over-claimed (``Backend.validate``: TensorRT's ONNX parser).

Before -> After::

    model + node names -> {node: True | "Softmax: opset 9 outside supported range 13..28"
                                     | "vetoed by openvino: ..."}
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import onnx_ir as ir

from ferry.backends._rules import RuleTable
from ferry.errors import FerryError

if TYPE_CHECKING:
    from ferry.backends._api import Backend

__all__ = ["capability", "engine_capability", "engine_vetoes", "rule_table", "rule_verdicts"]

logger = logging.getLogger(__name__)


def capability(
    backend: Backend, model: ir.Model, nodes: Sequence[str], *, ask_engine: bool = True
) -> dict[str, bool | str]:
    """Whether ``backend`` takes each of ``nodes`` (names in ``model``), or why not.

    Args:
        backend: the adapter; its ``capability()``, else its ``rules()`` and ``validate()``.
        model: the model, named and typed (``ferry.graph.prepare``).
        nodes: the nodes to ask about.
        ask_engine: let the engine answer on the whole model, or veto what its rules accept.

    Raises:
        FerryError: the engine failed while being asked.
    """
    if ask_engine:
        answer = engine_capability(backend, model, nodes)
        if answer is not None:
            return answer
    verdicts = rule_verdicts(backend, model, nodes)
    if ask_engine:
        accepted = [name for name in nodes if verdicts[name] is True]
        verdicts.update(engine_vetoes(backend, model, accepted))
    return verdicts


def engine_capability(
    backend: Backend, model: ir.Model, nodes: Sequence[str]
) -> dict[str, bool | str] | None:
    """The backend's own answer on the whole model (``Backend.capability``), errors named; None
    when its engine cannot be asked that way."""
    try:
        answer = backend.capability(model, list(nodes))
    except FerryError:
        raise
    except Exception as e:  # an engine's own exception types; name the backend
        raise FerryError(
            f"backend {backend.name!r} failed while asked which of {len(nodes)} node(s) it "
            f"takes: {e}; partition with validate=False to rely on its rules alone"
        ) from e
    return None if answer is None else dict(answer)


def rule_table(backend: Backend) -> RuleTable | None:
    """The backend's rules as a table, or None when it publishes none (``rules()`` raises
    NotImplementedError)."""
    try:
        return RuleTable(backend.rules())
    except NotImplementedError:
        return None


def rule_verdicts(backend: Backend, model: ir.Model, nodes: Sequence[str]) -> dict[str, bool | str]:
    """The backend's rule table on each of ``nodes``: True, or the reason it is not taken."""
    by_name = {node.name: node for node in model.graph}
    table = rule_table(backend)
    if table is None:
        return dict.fromkeys(nodes, f"{backend.name} declares no op rules")
    return {name: table.supports(by_name[name], model.opset_imports) for name in nodes}


def engine_vetoes(backend: Backend, model: ir.Model, accepted: Sequence[str]) -> dict[str, str]:
    """What the engine itself refuses among the nodes its rules ``accepted``, with reasons."""
    if not accepted:
        return {}
    try:
        vetoed = backend.validate(model, list(accepted))
    except FerryError:
        raise
    except Exception as e:  # an engine's own exception types; name the backend
        raise FerryError(
            f"backend {backend.name!r} failed while validating {len(accepted)} candidate "
            f"node(s): {e}; partition with validate=False to rely on its rules alone"
        ) from e
    wanted = set(accepted)
    found = {}
    for name, why in dict(vetoed or {}).items():
        if name not in wanted:
            logger.debug("%s vetoed %r, which was not a candidate", backend.name, name)
            continue
        found[name] = f"vetoed by {backend.name}: {why}"
    return found
