"""Engine adapters: what each engine runs, how it compiles and runs a partition, and placement.

Backend authors import everything from here: the adapter API (:class:`Backend`, :class:`CompileSpec`,
:class:`CompiledPartition`, :class:`BackendBase`, :class:`DeviceInfo`, :class:`OptionSpec`,
:func:`trial_capability`), op rules (:class:`OpRule`, :class:`RuleTable` and
the helpers rule checks are written with), and the registry. Backends are found by name: the
built-in ``onnxruntime``, ``openvino`` and ``tensorrt``, imported on first use, and third-party ones
registered in the ``ferry.backends`` entry-point group.

Placement (:func:`place`, :func:`explain`) decides which backend runs which nodes, and
:meth:`PlacementReport.cost` counts what the split costs per run; placement only decides:
lowering and compiling belong to ``ferry.runtime``.

For code beyond the backends that runs ONNX Runtime itself (the ORT Mobile export):
:func:`ort_error_message` (what ONNX Runtime said, for a user), :func:`unknown_ops` (the ops it
does not implement) and :data:`ORT_SILENT`, imported from the ``onnxruntime`` backend on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ferry._lazy import lazy_getattr
from ferry.backends._api import Backend, CompiledPartition, CompileSpec
from ferry.backends._base import COMMON_OPTIONS, BackendBase, check_options, require_base
from ferry.backends._capability import rule_table
from ferry.backends._kv import CopyingKVRunner, KVLayout, KVPool, KVRunner, PerRowKVPool
from ferry.backends._lifecycle import DeviceInfo, OptionSpec
from ferry.backends._placement import (
    DEFAULT_MIN_PARTITION_SIZE,
    SHAPE_INPUTS,
    UNCOUNTED_OPS,
    explain,
    place,
)
from ferry.backends._placement_cost import (
    LARGE_BOUNDARY_BYTES,
    LARGE_BOUNDARY_RATIO,
    MANY_PARTITIONS,
    BoundaryTensor,
    EngineUse,
    PlacementCost,
)
from ferry.backends._placement_report import NodeVerdict, PlacementReport
from ferry.backends._registry import (
    AUTO,
    DEFAULT_BACKENDS,
    ENTRY_POINT_GROUP,
    FALLBACK,
    get_backend,
    known_backends,
    parse_backends,
)
from ferry.backends._rules import (
    FLOAT_TYPES,
    NodeCheck,
    OpRule,
    RuleTable,
    all_checks,
    attr,
    constant_array,
    is_constant,
    node_opsets,
    output_used,
    subgraphs_supported,
    supports,
)
from ferry.backends._trial import trial_capability

if TYPE_CHECKING:
    from ferry.backends._onnxruntime import ORT_SILENT, ort_error_message, unknown_ops

__all__ = [
    "AUTO",
    "COMMON_OPTIONS",
    "DEFAULT_BACKENDS",
    "DEFAULT_MIN_PARTITION_SIZE",
    "ENTRY_POINT_GROUP",
    "FALLBACK",
    "FLOAT_TYPES",
    "LARGE_BOUNDARY_BYTES",
    "LARGE_BOUNDARY_RATIO",
    "MANY_PARTITIONS",
    "ORT_SILENT",
    "SHAPE_INPUTS",
    "UNCOUNTED_OPS",
    "Backend",
    "BackendBase",
    "BoundaryTensor",
    "CompileSpec",
    "CompiledPartition",
    "CopyingKVRunner",
    "DeviceInfo",
    "EngineUse",
    "KVLayout",
    "KVPool",
    "KVRunner",
    "NodeCheck",
    "NodeVerdict",
    "OpRule",
    "OptionSpec",
    "PerRowKVPool",
    "PlacementCost",
    "PlacementReport",
    "RuleTable",
    "all_checks",
    "attr",
    "check_options",
    "constant_array",
    "explain",
    "get_backend",
    "is_constant",
    "known_backends",
    "node_opsets",
    "ort_error_message",
    "output_used",
    "parse_backends",
    "place",
    "require_base",
    "rule_table",
    "subgraphs_supported",
    "supports",
    "trial_capability",
    "unknown_ops",
]

# The onnxruntime backend's module (and its op table) is loaded only when one of its names is used.
__getattr__ = lazy_getattr(
    __name__, [name for name in __all__ if name not in globals()], ["_onnxruntime"]
)
