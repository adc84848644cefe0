"""One output of a case against its expected value, through :func:`ferry.parity.compare_outputs`.

The room's comparisons all go through ``ferry.parity`` with ``strict=True`` (ONNX's backend test
runner: shapes and dtypes exact, NaN equal to NaN, strings equal, bfloat16 with two ULPs) and an
explicit tolerance: the case's own, or a generator's floors. This module only adds the room's
words for a failure and the error a report records.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ferry.parity import OutputParity, compare_outputs

__all__ = ["compare_output", "error_of", "mismatch_text"]


def compare_output(
    name: str, got: Any, want: Any, *, atol: float, rtol: float, strict: bool = True
) -> OutputParity:
    """Compare one output with its expected value: ``|got - want| <= atol + rtol * |want|``.

    Args:
        name: the output's name, for the result.
        got / want: the value under test and the expected one (arrays, or lists for sequences).
        atol / rtol: the tolerance, applied to every numeric dtype (``0, 0`` for exact).
        strict: shapes and dtypes must match exactly.
    """
    return compare_outputs({name: got}, [want], tolerance=(atol, rtol), strict=strict).outputs[0]


def mismatch_text(result: OutputParity) -> str:
    """Why an output failed: ``N of M elements differ (max abs err X, rtol R, atol A); first at ...``,
    or the reason it could not be compared element by element (shape, dtype, strings)."""
    if result.problem is not None:
        return result.problem
    size = math.prod(result.shape)
    text = (
        f"{result.mismatched} of {size} elements differ (max abs err {result.max_abs_error}, "
        f"rtol {result.rtol}, atol {result.atol})"
    )
    return f"{text}; {result.first_mismatch}" if result.first_mismatch else text


def error_of(result: OutputParity, want: Any) -> float | None:
    """The largest absolute error a report records for an output, or None when there is none to
    speak of: nothing compared by value (a shape or dtype problem, strings, an empty tensor) or no
    finite difference (every expected element an infinity or NaN, or one off by those)."""
    if result.problem is not None or math.prod(result.shape) == 0 or _is_text(result.dtype):
        return None
    if not math.isfinite(result.max_abs_error):
        return None
    if result.passed and not isinstance(want, (list, tuple)):
        values = np.asarray(want)
        if values.dtype.kind not in "biufc":  # ml_dtypes' bfloat16, float8, int4
            values = values.astype(np.float32)
        if not np.isfinite(values).any():
            return None
    return result.max_abs_error


def _is_text(dtype: str) -> bool:
    try:
        return np.dtype(dtype).kind in "OUS"
    except TypeError:  # "sequence", or an ml_dtypes name numpy does not know by name
        return False
