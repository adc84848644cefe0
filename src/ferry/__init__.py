"""ferry: convert, optimize, partition, run, serve and benchmark models across inference engines.

The embedding API::

    import ferry
    session = ferry.load("model.onnx")
    outputs = session.run({"input": array})

Importing ``ferry`` is cheap: engines and heavy modules load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ferry._lazy import lazy_getattr
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

__getattr__ = lazy_getattr(
    __name__,
    ["load", "Session", "TensorSpec", "Plan", "convert", "ConversionResult"],
    ["ferry.runtime", "ferry.plan", "ferry.converters"],
)
