"""The parity check: does the converted model compute what the source computed?

Both run on the same inputs: the source in its own framework (the converter's ``reference``), the
converted model on ONNX Runtime through a ferry Session. Each output is compared elementwise as
``|converted - source| <= atol + rtol * |source|`` with a tolerance that fits its dtype.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ferry.errors import ConversionError

__all__ = ["OutputParity", "ParityError", "ParityReport", "compare_outputs", "default_tolerance"]

# (atol, rtol) by dtype kind and size. Frameworks sum in different orders; float32 nets of a few
# dozen layers differ by ~1e-5 relative. Integer and boolean outputs (labels, masks) must be equal.
_FLOAT_TOLERANCE = {2: (1e-2, 1e-2), 4: (1e-4, 1e-3), 8: (1e-7, 1e-6)}


def default_tolerance(dtype: np.dtype[Any]) -> tuple[float, float]:
    """(atol, rtol) for an output of ``dtype``."""
    if dtype.kind == "f" or dtype.name == "bfloat16":
        return _FLOAT_TOLERANCE.get(dtype.itemsize, (1e-4, 1e-3))
    if dtype.kind == "c":
        return _FLOAT_TOLERANCE.get(dtype.itemsize // 2, (1e-4, 1e-3))
    return (0.0, 0.0)


@dataclasses.dataclass(frozen=True)
class OutputParity:
    """How one output compares."""

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

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["shape"] = list(self.shape)
        return d


@dataclasses.dataclass(frozen=True)
class ParityReport:
    """The outcome of a parity check; ``skipped`` says why none was done, when none was."""

    outputs: tuple[OutputParity, ...] = ()
    inputs: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    skipped: str | None = None

    @property
    def passed(self) -> bool:
        return self.skipped is None and all(o.passed for o in self.outputs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "skipped": self.skipped,
            "inputs": {k: list(v) for k, v in self.inputs.items()},
            "outputs": [o.to_dict() for o in self.outputs],
        }

    def summary(self) -> str:
        if self.skipped is not None:
            return f"parity not checked: {self.skipped}"
        failed = [o for o in self.outputs if not o.passed]
        if not failed:
            worst = max((o.max_abs_error for o in self.outputs), default=0.0)
            return f"parity ok: {len(self.outputs)} output(s), max abs error {worst:.3g}"
        return "parity FAILED: " + "; ".join(_describe_failure(o) for o in failed)


def _describe_failure(o: OutputParity) -> str:
    if o.problem:
        return f"output {o.name!r}: {o.problem}"
    return (
        f"output {o.name!r}: {o.mismatched} element(s) off, max abs error {o.max_abs_error:.3g} "
        f"(tolerance atol={o.atol:g}, rtol={o.rtol:g})"
    )


class ParityError(ConversionError):
    """The converted model does not compute what the source does."""

    def __init__(self, report: ParityReport) -> None:
        super().__init__(
            f"{report.summary()}. The converted model was not written; if the difference is "
            "expected (reduced precision), loosen it with --tolerance ATOL[,RTOL]"
        )
        self.report = report


def compare_outputs(
    converted: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray] | Sequence[np.ndarray],
    *,
    inputs: Mapping[str, np.ndarray] | None = None,
    tolerance: tuple[float, float] | None = None,
) -> ParityReport:
    """Compare the converted model's outputs with the source framework's.

    Args:
        converted: outputs of the converted model by name, in the model's output order.
        reference: the source's outputs by the same names, or a sequence in that order.
        inputs: the inputs used, recorded in the report.
        tolerance: (atol, rtol) for every output; None picks one per dtype.
    """
    names = list(converted)
    if isinstance(reference, Mapping):
        missing = [n for n in names if n not in reference]
        if missing and len(reference) == len(names):
            # Same count, other names (e.g. a framework's "output_0"): compare in order.
            reference = list(reference.values())
        elif missing:
            raise ConversionError(
                f"the source gives outputs {sorted(reference)} but the converted model gives "
                f"{names}; the converter mapped them wrongly (a bug: please report it)"
            )
    if not isinstance(reference, Mapping):
        ref_list = [np.asarray(r) for r in reference]
        if len(ref_list) != len(names):
            raise ConversionError(
                f"the source gives {len(ref_list)} outputs but the converted model gives "
                f"{len(names)} ({', '.join(names)})"
            )
        reference = dict(zip(names, ref_list))
    results = tuple(
        _compare_one(name, np.asarray(converted[name]), np.asarray(reference[name]), tolerance)
        for name in names
    )
    shapes = {k: tuple(v.shape) for k, v in (inputs or {}).items()}
    return ParityReport(outputs=results, inputs=shapes)


def _compare_one(
    name: str, got: np.ndarray, want: np.ndarray, tolerance: tuple[float, float] | None
) -> OutputParity:
    atol, rtol = tolerance if tolerance is not None else default_tolerance(got.dtype)

    def fail(problem: str) -> OutputParity:
        return OutputParity(
            name,
            tuple(got.shape),
            str(got.dtype),
            float("inf"),
            float("inf"),
            int(got.size),
            atol,
            rtol,
            False,
            problem,
        )

    if got.shape != want.shape:
        if _squeezed(got.shape) == _squeezed(want.shape):
            # Frameworks disagree on keeping size-1 dims (e.g. [N] vs [N, 1]); values still count.
            want = want.reshape(got.shape)
        else:
            return fail(f"shape {list(got.shape)} but the source gives {list(want.shape)}")
    if got.dtype.kind in "OUS" or want.dtype.kind in "OUS":
        mismatched = int(np.sum(got.astype(str) != want.astype(str)))
        return OutputParity(
            name,
            tuple(got.shape),
            str(got.dtype),
            float(mismatched > 0),
            float(mismatched > 0),
            mismatched,
            0.0,
            0.0,
            mismatched == 0,
        )
    g = got.astype(np.float64)
    w = want.astype(np.float64)
    nan_mismatch = np.isnan(g) != np.isnan(w)
    g = np.where(np.isnan(g), 0.0, g)
    w = np.where(np.isnan(w), 0.0, w)
    diff = np.abs(g - w)
    bad = (diff > atol + rtol * np.abs(w)) | nan_mismatch
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = float((diff / np.maximum(np.abs(w), 1e-12)).max()) if diff.size else 0.0
    mismatched = int(bad.sum())
    return OutputParity(
        name,
        tuple(got.shape),
        str(got.dtype),
        max_abs,
        max_rel,
        mismatched,
        atol,
        rtol,
        mismatched == 0,
    )


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)
