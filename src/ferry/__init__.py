"""ferry: convert, optimize, partition, run, serve and benchmark models across inference engines.

The embedding API::

    import ferry
    session = ferry.load("model.onnx")
    outputs = session.run({"input": array})

Importing ``ferry`` is cheap: engines and heavy modules load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ferry._version import __version__
from ferry.errors import (
    BackendUnavailableError,
    ConversionError,
    ExecutionError,
    FerryError,
    InvalidInputError,
    ModelLoadError,
    PlanError,
    UnsupportedOpError,
)

if TYPE_CHECKING:
    from ferry.converters import ConversionResult, convert
    from ferry.plan import Plan
    from ferry.runtime import Session, TensorSpec, load

__all__ = [
    "BackendUnavailableError",
    "ConversionError",
    "ConversionResult",
    "ExecutionError",
    "FerryError",
    "InvalidInputError",
    "ModelLoadError",
    "Plan",
    "PlanError",
    "Session",
    "TensorSpec",
    "UnsupportedOpError",
    "__version__",
    "convert",
    "load",
]

_LAZY = {
    "load": "ferry.runtime",
    "Session": "ferry.runtime",
    "Plan": "ferry.plan",
    "TensorSpec": "ferry.runtime",
    "convert": "ferry.converters",
    "ConversionResult": "ferry.converters",
}


def __getattr__(name: str) -> Any:
    # onnx, onnx_ir and onnxruntime take a while to import; load them only when asked for.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ferry' has no attribute {name!r}")
