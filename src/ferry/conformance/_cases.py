"""ONNX's node test cases (``onnx.backend.test.case.node``), collected once and tied to their op.

Every user in the room takes its cases from here: the conformance runner and both rule
generators. A case is a :class:`ConformanceCase`: ONNX's model, its data sets as numpy arrays,
its tolerance, and the op it tests: its single node's op, or for an ``*_expanded`` case (the op's
function body, inlined by ONNX) the op whose body it is.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import re
import sys
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx

__all__ = [
    "DEFAULT_ATOL",
    "DEFAULT_RTOL",
    "ConformanceCase",
    "collect_cases",
    "normal_domain",
    "op_name",
    "sample_cases",
]

#: ONNX's backend test runner uses these when a case sets none.
DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-7

_EXPANDED = re.compile(r"^(?P<base>.+)_expanded(?:_ver\d+)?$")


def normal_domain(domain: str) -> str:
    """``""`` for ONNX's own domain, however it is spelt (``""`` or ``"ai.onnx"``)."""
    return "" if domain in ("", "ai.onnx") else domain


def op_name(domain: str, op_type: str) -> str:
    """How reports name an op: ``Conv`` in the ONNX domain, ``ai.onnx.ml::LabelEncoder`` elsewhere."""
    domain = normal_domain(domain)
    return op_type if not domain else f"{domain}::{op_type}"


@dataclasses.dataclass(frozen=True)
class ConformanceCase:
    """One ONNX node test case, tied to the op it tests.

    Attributes:
        name: ONNX's name for it (``test_relu``, ``test_layer_normalization_2d_axis0_expanded``).
        domain / op_type: the op it tests.
        expanded: whether the model is the op's function body rather than the op itself.
        model: the test model, exactly as ONNX builds it (shared: copy it before changing it).
        data_sets: ``(inputs, expected outputs)`` pairs in graph input and output order; tensors are
            numpy arrays, sequences lists, absent optionals None.
        rtol / atol: the tolerance ONNX gives the case.
    """

    name: str
    domain: str
    op_type: str
    expanded: bool
    model: onnx.ModelProto
    data_sets: tuple[tuple[tuple[Any, ...], tuple[Any, ...]], ...]
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL

    @property
    def op(self) -> str:
        """The op it tests, as reports name it (:func:`op_name`)."""
        return op_name(self.domain, self.op_type)

    @property
    def key(self) -> tuple[str, str]:
        """``(domain, op_type)`` of the op it tests, ONNX's domain as ``""``."""
        return (normal_domain(self.domain), self.op_type)


def _normalize(value: Any) -> Any:
    """A data set entry as a backend receives and returns it: numpy arrays (scalars included)."""
    if value is None:
        return None
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, (list, tuple)):
        return [_normalize(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _normalize(v) for k, v in value.items()}
    return np.asarray(value)


@functools.lru_cache(maxsize=1)
def _onnx_test_cases() -> tuple[Any, ...]:
    """Every node test case ONNX defines (``onnx.backend.test.case.TestCase``), collected once.

    ``collect_testcases`` fills a module-level list as a side effect of importing the case modules,
    filtered by the ``op_type`` of the *first* call in the process: a later call returns whatever
    that first call kept. When another caller got there first, the case modules are reloaded so
    that the list is complete.
    """
    import onnx.backend.test.case.node as node_cases
    from onnx.backend.test.case.utils import import_recursive

    prefix = node_cases.__name__ + "."
    with warnings.catch_warnings():
        # The generators overflow and divide by zero on purpose (inf and NaN cases).
        warnings.simplefilter("ignore")
        stale = sorted(name for name in sys.modules if name.startswith(prefix))
        if not stale:
            return tuple(node_cases.collect_testcases())
        node_cases._NodeTestCases.clear()
        node_cases._existing_names.clear()
        node_cases._TargetOpType = None
        for name in stale:
            importlib.reload(sys.modules[name])
        import_recursive(node_cases)
        return tuple(node_cases._NodeTestCases)


@functools.lru_cache(maxsize=1)
def _all_cases() -> tuple[ConformanceCase, ...]:
    raw = _onnx_test_cases()
    tested: dict[str, tuple[str, str]] = {}
    for case in raw:
        if not _EXPANDED.match(case.name) and len(case.model.graph.node) == 1:
            node = case.model.graph.node[0]
            tested[case.name] = (normal_domain(node.domain), node.op_type)
    cases = []
    for case in raw:
        match = _EXPANDED.match(case.name)
        if match is not None and match["base"] in tested:
            expanded = True
            domain, op_type = tested[match["base"]]
        elif case.name in tested:
            expanded = False
            domain, op_type = tested[case.name]
        else:
            # Not seen in onnx 1.23: a multi-node case that is no function expansion. Name it
            # after its first node rather than drop it.
            expanded = False
            node = case.model.graph.node[0]
            domain, op_type = normal_domain(node.domain), node.op_type
        data_sets = tuple(
            (tuple(_normalize(x) for x in inputs), tuple(_normalize(y) for y in outputs))
            for inputs, outputs in case.data_sets or ()
        )
        cases.append(
            ConformanceCase(
                name=case.name,
                domain=domain,
                op_type=op_type,
                expanded=expanded,
                model=case.model,
                data_sets=data_sets,
                rtol=case.rtol if case.rtol is not None else DEFAULT_RTOL,
                atol=case.atol if case.atol is not None else DEFAULT_ATOL,
            )
        )
    return tuple(cases)


def collect_cases(ops: Iterable[tuple[str, str]] | None = None) -> list[ConformanceCase]:
    """ONNX's node test cases, each tied to the op it tests.

    Args:
        ops: ``(domain, op_type)`` pairs to keep (``""`` or ``"ai.onnx"`` for ONNX's own ops);
            None keeps every case. Function-body (``_expanded``) cases count as their op's.

    Returns:
        The cases in ONNX's order (about 1,900 with onnx 1.23, a quarter of them expanded).
    """
    cases = _all_cases()
    if ops is None:
        return list(cases)
    wanted = {(normal_domain(d), t) for d, t in ops}
    return [case for case in cases if case.key in wanted]


def sample_cases(cases: Sequence[ConformanceCase], per_op: int) -> list[ConformanceCase]:
    """A representative subset of ``cases``, in ONNX's order.

    At most ``per_op`` cases of each op (and of its function body), spread evenly over ONNX's
    cases for it, first and last included. Every op keeps at least one case, so a sample still
    touches every op a backend claims.
    """
    groups: dict[tuple[str, str, bool], list[int]] = {}
    for index, case in enumerate(cases):
        groups.setdefault((*case.key, case.expanded), []).append(index)
    keep: set[int] = set()
    for indices in groups.values():
        n = len(indices)
        if n <= per_op:
            keep.update(indices)
        elif per_op <= 1:
            keep.add(indices[0])
        else:
            keep.update(indices[round(i * (n - 1) / (per_op - 1))] for i in range(per_op))
    return [case for index, case in enumerate(cases) if index in keep]
