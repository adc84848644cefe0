"""Comparing outputs: the one tolerance contract.

Every numeric comparison ferry makes (a conversion against its source framework, a plan against
ONNX Runtime, an engine against ONNX's node test cases, ``auto``'s candidates) goes through
:func:`compare_outputs`. An element passes when::

    |got - want| <= atol + rtol * |want|

with NaN equal to NaN and an infinity equal to itself; strings, booleans and integers compare
exactly unless a tolerance is given. ``(atol, rtol)`` comes from the output's dtype
(:func:`default_tolerance`) unless the caller gives one. Two modes:

- lenient (the default): frameworks disagree on keeping size-1 dims (``[N]`` vs ``[N, 1]``) and
  on dtypes (a float64 reference for a float32 model); values still count.
- ``strict=True``: shapes and dtypes must match exactly, as ONNX's backend test runner demands.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "OutputParity",
    "ParityReport",
    "Tolerance",
    "compare_outputs",
    "default_tolerance",
]

#: ``(atol, rtol)``.
Tolerance = tuple[float, float]

# (atol, rtol) by float size in bytes. Frameworks sum in different orders; float32 nets of a few
# dozen layers differ by ~1e-5 relative. Integer and boolean outputs (labels, masks) must be equal.
_FLOAT_TOLERANCE = {2: (1e-2, 1e-2), 4: (1e-4, 1e-3), 8: (1e-7, 1e-6)}
# bfloat16 keeps 8 bits of mantissa: two of its ULPs, as ONNX's backend test runner allows.
_BFLOAT16_RTOL = 2.0**-6


def default_tolerance(dtype: np.dtype[Any]) -> Tolerance:
    """``(atol, rtol)`` for an output of ``dtype``: by float size; exact for everything else."""
    if dtype.kind == "f" or dtype.name == "bfloat16":
        return _FLOAT_TOLERANCE.get(dtype.itemsize, (1e-4, 1e-3))
    if dtype.kind == "c":
        return _FLOAT_TOLERANCE.get(dtype.itemsize // 2, (1e-4, 1e-3))
    return (0.0, 0.0)


@dataclasses.dataclass(frozen=True)
class OutputParity:
    """How one output compares.

    Attributes:
        name: the output's name.
        shape / dtype: of the output under test.
        max_abs_error / max_rel_error: the largest finite differences (inf when an element
            mismatches by a NaN or an infinity; 0 for exact types that match).
        mismatched: how many elements fail the contract.
        atol / rtol: the tolerance applied.
        passed: whether every element passes.
        problem: why the output could not be compared elementwise (shape, dtype, missing).
        first_mismatch: where the first element that fails is, and its two values.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    max_abs_error: float
    max_rel_error: float
    mismatched: int
    atol: float
    rtol: float
    passed: bool
    problem: str | None = None
    first_mismatch: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["shape"] = list(self.shape)
        return d

    def describe(self) -> str:
        """One line for a failing output."""
        if self.passed:
            return f"output {self.name!r}: ok, max abs error {self.max_abs_error:.3g}"
        if self.problem:
            return f"output {self.name!r}: {self.problem}"
        text = (
            f"output {self.name!r}: {self.mismatched} element(s) off, max abs error "
            f"{self.max_abs_error:.3g} (tolerance atol={self.atol:g}, rtol={self.rtol:g})"
        )
        return f"{text}; {self.first_mismatch}" if self.first_mismatch else text


@dataclasses.dataclass(frozen=True)
class ParityReport:
    """The outcome of a comparison; ``skipped`` says why none was done, when none was."""

    outputs: tuple[OutputParity, ...] = ()
    inputs: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    skipped: str | None = None

    @property
    def passed(self) -> bool:
        return self.skipped is None and all(o.passed for o in self.outputs)

    @property
    def max_abs_error(self) -> float:
        """The worst output's largest difference (0 when there are none)."""
        return max((o.max_abs_error for o in self.outputs), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "skipped": self.skipped,
            "inputs": {k: list(v) for k, v in self.inputs.items()},
            "outputs": [o.to_dict() for o in self.outputs],
        }

    def summary(self) -> str:
        """One line that names the judge (elementwise: the same numbers within tolerance)."""
        if self.skipped is not None:
            return f"parity not checked: {self.skipped}"
        failed = [o for o in self.outputs if not o.passed]
        if not failed:
            return (
                f"parity ok (elementwise): {len(self.outputs)} output(s), max abs error "
                f"{self.max_abs_error:.3g}"
            )
        return "parity FAILED (elementwise): " + "; ".join(o.describe() for o in failed)


def compare_outputs(
    got: Mapping[str, Any],
    want: Mapping[str, Any] | Sequence[Any],
    *,
    tolerance: Tolerance | None = None,
    strict: bool = False,
    inputs: Mapping[str, np.ndarray] | None = None,
) -> ParityReport:
    """Compare outputs under test with reference outputs.

    Args:
        got: the outputs under test by name, in the model's output order. A value may be a list
            of arrays (a sequence output): it is compared element by element.
        want: the reference outputs by the same names, or in the same order (a sequence, or a
            mapping with other names but as many entries). A missing one fails its output.
        tolerance: ``(atol, rtol)`` for every output; None picks one per dtype.
        strict: shapes and dtypes must match exactly (ONNX's backend test runner).
        inputs: the inputs used, recorded in the report.
    """
    names = list(got)
    if isinstance(want, Mapping) and any(n not in want for n in names) and len(want) == len(got):
        want = list(want.values())  # same count, other names (e.g. a framework's "output_0")
    if not isinstance(want, Mapping):
        want = dict(zip(names, want))
    results = []
    for name in names:
        if name not in want:
            results.append(_failed(name, np.asarray(got[name]), "missing from the reference"))
            continue
        results.append(_compare(name, got[name], want[name], tolerance, strict))
    shapes = {k: tuple(np.shape(v)) for k, v in (inputs or {}).items()}
    return ParityReport(outputs=tuple(results), inputs=shapes)


def _compare(
    name: str, got: Any, want: Any, tolerance: Tolerance | None, strict: bool
) -> OutputParity:
    if isinstance(got, (list, tuple)) or isinstance(want, (list, tuple)):
        return _compare_sequence(name, got, want, tolerance, strict)
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        if strict or _squeezed(got.shape) != _squeezed(want.shape):
            return _failed(name, got, f"shape {list(got.shape)}, expected {list(want.shape)}")
        want = want.reshape(got.shape)
    if got.dtype.kind in "OUS" or want.dtype.kind in "OUS":
        mismatched = int(np.sum(got.astype(str) != want.astype(str)))
        return OutputParity(
            name, got.shape, str(got.dtype), float(mismatched > 0), float(mismatched > 0),
            mismatched, 0.0, 0.0, mismatched == 0,
            None if not mismatched else f"{mismatched} of {got.size} strings differ",
        )  # fmt: skip
    if strict and got.dtype != want.dtype:
        return _failed(name, got, f"dtype {got.dtype}, expected {want.dtype}")
    atol, rtol = tolerance if tolerance is not None else default_tolerance(want.dtype)
    if "bfloat16" in (got.dtype.name, want.dtype.name):
        rtol = max(rtol, _BFLOAT16_RTOL)
    g, w = _as_float64(got), _as_float64(want)
    close = np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diff = np.abs(g - w)
        rel = diff / np.maximum(np.abs(w), 1e-12)
    finite = np.isfinite(diff)
    max_abs = float(diff[finite].max()) if finite.any() else 0.0
    max_rel = float(rel[finite].max()) if finite.any() else 0.0
    mismatched = int(close.size - np.count_nonzero(close))
    first = None
    if mismatched:
        if not finite[~close].all():
            max_abs = max_rel = float("inf")  # off by a NaN or an infinity
        where = np.unravel_index(int(np.argmin(close)), close.shape) if close.ndim else ()
        index = tuple(int(i) for i in where)
        first = f"first at {index}: {got[where]!r} vs {want[where]!r}"
    return OutputParity(
        name, got.shape, str(got.dtype), max_abs, max_rel, mismatched, atol, rtol,
        mismatched == 0, first_mismatch=first,
    )  # fmt: skip


def _compare_sequence(
    name: str, got: Any, want: Any, tolerance: Tolerance | None, strict: bool
) -> OutputParity:
    if not isinstance(got, (list, tuple)) or not isinstance(want, (list, tuple)):
        return _failed(name, np.asarray(0), "a sequence compared with a tensor")
    if len(got) != len(want):
        return _failed(name, np.asarray(0), f"a sequence of {len(got)}, expected {len(want)}")
    parts = [
        _compare(f"{name}[{i}]", g, w, tolerance, strict) for i, (g, w) in enumerate(zip(got, want))
    ]
    bad = next((p for p in parts if not p.passed), None)
    return OutputParity(
        name, (len(got),), "sequence",
        max((p.max_abs_error for p in parts), default=0.0),
        max((p.max_rel_error for p in parts), default=0.0),
        sum(p.mismatched for p in parts),
        parts[0].atol if parts else 0.0, parts[0].rtol if parts else 0.0,
        bad is None, None if bad is None else bad.describe(),
    )  # fmt: skip


def _as_float64(array: np.ndarray) -> np.ndarray:
    if array.dtype.kind not in "biufc":
        # ml_dtypes' bfloat16/float8/int4: numpy cannot mix them with float64 directly.
        array = array.astype(np.float32)
    if array.dtype.kind == "c":
        return array.astype(np.complex128)
    return array.astype(np.float64)


def _failed(name: str, got: np.ndarray, problem: str) -> OutputParity:
    inf = float("inf")
    return OutputParity(
        name, tuple(got.shape), str(got.dtype), inf, inf, int(got.size), 0.0, 0.0, False, problem
    )


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)
