"""ferry: convert, optimize, partition, run, serve and benchmark models across inference engines.

The embedding API::

    import ferry
    session = ferry.load("model.onnx")
    outputs = session.run({"input": array})

Importing ``ferry`` is cheap: engines and heavy modules load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
    import os

    import onnx
    import onnx_ir

    from ferry.converters import ConversionResult, convert
    from ferry.optimizer import CompressResult, OptimizeResult, compress, optimize
    from ferry.optimizer.distill import DistillResult, distill
    from ferry.optimizer.prune import PruneResult, prune
    from ferry.optimizer.quantize import QuantizeResult, quantize
    from ferry.plan import Plan
    from ferry.runtime import Session, TensorSpec

__all__ = [
    "BackendUnavailableError",
    "CompressResult",
    "ConversionError",
    "ConversionResult",
    "DistillResult",
    "ExecutionError",
    "FerryError",
    "InvalidInputError",
    "ModelLoadError",
    "OptimizeResult",
    "Plan",
    "PlanError",
    "PruneResult",
    "QuantizeResult",
    "Session",
    "TensorSpec",
    "UnsupportedOpError",
    "__version__",
    "compress",
    "convert",
    "distill",
    "load",
    "optimize",
    "prune",
    "quantize",
]

__getattr__ = lazy_getattr(
    __name__,
    [
        "Session",
        "TensorSpec",
        "Plan",
        "convert",
        "ConversionResult",
        "optimize",
        "OptimizeResult",
        "quantize",
        "QuantizeResult",
        "prune",
        "PruneResult",
        "distill",
        "DistillResult",
        "compress",
        "CompressResult",
    ],
    [
        "ferry.runtime",
        "ferry.plan",
        "ferry.converters",
        "ferry.optimizer",
        "ferry.optimizer.quantize",
        "ferry.optimizer.prune",
        "ferry.optimizer.distill",
    ],
)


def load(
    source: str | os.PathLike[str] | onnx_ir.Model | onnx.ModelProto,
    *,
    optimize: bool | str = False,
    **options: Any,
) -> Session:
    """Load a model and make it ready to run: :func:`ferry.runtime.load`, whose arguments
    (``backends``, ``threads``, ``precision``, ``plan``, ``cache_dir``, ``options``, ``shapes``,
    ``example_inputs``, ``accuracy``, ``check_pays``) it takes, after an optional optimization.

    Args:
        source: an ``.onnx`` file, a ferry artifact folder, an ``onnx_ir.Model`` or an
            ``onnx.ModelProto``; never modified.
        optimize: run :func:`ferry.optimize` before placement (``True`` or ``"basic"``,
            ``"extended"``) for the first engine named, verified against the model on
            ``example_inputs`` (else random inputs at ``shapes``) and timed; when the result
            computes something else or runs slower, the model runs as given, with a warning.
    """
    from ferry.runtime import load as load_session

    if optimize is not False:
        from ferry.optimizer import optimized_for_load

        source = optimized_for_load(
            source,
            optimize,
            backends=options.get("backends"),
            shapes=options.get("shapes"),
            example_inputs=options.get("example_inputs"),
        )
    return load_session(source, **options)
