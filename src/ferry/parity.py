"""Comparing outputs: the one tolerance contract, and task-level judges.

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

A judge answers a different question: does the *task* come out the same? Reduced precision and
quantization change numbers but should not change a classifier's answer, a mask or a decoded
sequence. :func:`judge` builds one from a spec (``{"kind": "top1"}``, the kit's ``judge`` entries);
each takes the outputs of the model under test and of the reference and returns a
:class:`Judgement`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ferry._state_names import STATE_OUTPUT_PREFIX
from ferry.errors import InvalidInputError

__all__ = [
    "DEFAULT_BUDGET",
    "JUDGE_KINDS",
    "Budget",
    "BudgetVerdict",
    "Judge",
    "Judgement",
    "OutputParity",
    "ParityReport",
    "compare_outputs",
    "default_tolerance",
    "judge",
    "parse_budget",
    "within_budget",
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
        if self.skipped is not None:
            return f"parity not checked: {self.skipped}"
        failed = [o for o in self.outputs if not o.passed]
        if not failed:
            return (
                f"parity ok: {len(self.outputs)} output(s), max abs error {self.max_abs_error:.3g}"
            )
        return "parity FAILED: " + "; ".join(o.describe() for o in failed)


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


# ---------------------------------------------------------------------------------------------
# Task-level judges


@dataclasses.dataclass(frozen=True)
class Judgement:
    """A judge's verdict on one output.

    Attributes:
        kind: the judge (``top1``, ``cosine``, ``mask``, ``argmax_seq``, ``custom``).
        output: the output judged.
        score: the measured agreement (a fraction, or a cosine similarity).
        threshold: the least score that passes.
        passed: ``score >= threshold`` (and the IoU condition, for masks).
        detail: what was measured, in words.
    """

    kind: str
    output: str
    score: float
    threshold: float
    passed: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: A judge: ``(outputs under test, reference outputs) -> one Judgement per output judged``.
Judge = Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray]], list["Judgement"]]

#: What each kind measures (the kit's ``judge_kinds``).
JUDGE_KINDS = {
    "top1": "the argmax of each sample (over all but the first axis) agrees on min_agreement "
    "of the samples (default all); entries within 0.1% of the largest magnitude are ties",
    "cosine": "the cosine similarity of each output, flattened, is >= min (default 0.999)",
    "mask": "(output > threshold) agrees on >= min_agreement of the elements; with min_iou, "
    "the masks' intersection over union is >= min_iou",
    "argmax_seq": "the argmax over the last axis agrees at >= min_agreement of the positions "
    "(entries within 0.1% of the largest magnitude are ties)",
    "custom": "a function (got, want) -> bool or a score in [0, 1] (passes at >= min, default 1)",
}

_JUDGE_KEYS = {
    "top1": {"min_agreement"},
    "cosine": {"min"},
    "mask": {"threshold", "min_agreement", "min_iou"},
    "argmax_seq": {"min_agreement"},
    "custom": {"function", "min"},
}


def judge(
    spec: Mapping[str, Any] | str,
    *,
    dequantize: Mapping[str, tuple[float, int]] | None = None,
) -> Judge:
    """A judge from its spec.

    Args:
        spec: ``{"kind": "top1" | "cosine" | "mask" | "argmax_seq" | "custom", ...}`` with the
            kind's settings (see :data:`JUDGE_KINDS`) and optionally ``"output"`` (judge that
            output only; otherwise every output); a bare kind name takes the defaults.
            ``"custom"`` takes ``"function"``: a callable ``(got, want) -> bool | float``.
        dequantize: ``{output: (scale, zero_point)}`` for quantized outputs, which are judged as
            ``(q - zero_point) * scale``.

    Raises:
        InvalidInputError: an unknown kind, an unknown or missing setting.
    """
    if isinstance(spec, str):
        spec = {"kind": spec}
    settings = dict(spec)
    kind = settings.pop("kind", None)
    if kind not in _JUDGE_KEYS:
        raise InvalidInputError(
            f"unknown judge kind {kind!r}; choose one of {', '.join(_JUDGE_KEYS)}"
        )
    output = settings.pop("output", None)
    unknown = sorted(set(settings) - _JUDGE_KEYS[kind])
    if unknown:
        raise InvalidInputError(
            f"judge {kind!r} has no setting {', '.join(map(repr, unknown))}; it takes "
            f"{', '.join(sorted(_JUDGE_KEYS[kind] | {'output'}))}"
        )
    if kind == "mask" and "threshold" not in settings:
        raise InvalidInputError("judge 'mask' needs a threshold (the value above which it is set)")
    if kind == "custom" and not callable(settings.get("function")):
        raise InvalidInputError("judge 'custom' needs a function (got, want) -> bool or float")
    measure = _MEASURES[kind]
    scales = dict(dequantize or {})

    def run(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> list[Judgement]:
        names = [output] if output is not None else list(got)
        verdicts = []
        for name in names:
            if name not in got or name not in want:
                raise InvalidInputError(
                    f"judge {kind!r}: output {name!r} is missing; outputs are {sorted(got)}"
                )
            g, w = _judged(got[name], scales.get(name)), _judged(want[name], scales.get(name))
            verdicts.append(measure(kind, name, g, w, settings))
        return verdicts

    return run


def _judged(array: Any, quantization: tuple[float, int] | None) -> np.ndarray:
    a = np.asarray(array)
    if quantization is not None:
        scale, zero_point = quantization
        return (a.astype(np.float64) - zero_point) * scale
    return _as_float64(a) if a.dtype.kind != "b" else a.astype(np.float64)


def _agreement(kind: str, name: str, agree: np.ndarray, least: float, what: str) -> Judgement:
    score = float(np.mean(agree)) if agree.size else 1.0
    detail = f"{what} agree on {score:.2%} (needs {least:.2%})"
    return Judgement(kind, name, score, least, score >= least, detail)


#: Two scores closer than this fraction of the reference's largest magnitude are a tie: picking
#: either is agreement (a probability map's background rows are all ~0, a saturated sigmoid's
#: text rows all ~1, and which of the tied entries wins is rounding, not a different answer).
#: Quantized integers tie within one step (their last bit rounds either way across engines).
_TIE = 1e-3


def _argmax_agreement(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Per row of the last axis: does the argmax of ``got`` pick a (near-)best entry of ``want``?"""
    want = want.astype(np.float64)
    picked = np.take_along_axis(want, got.argmax(-1)[..., None], axis=-1)[..., 0]
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    margin = max(_TIE * scale, 1.0 if got.dtype.kind in "iu" else 0.0)
    return np.asarray(picked >= want.max(-1) - margin)


def _top1(kind: str, name: str, g: np.ndarray, w: np.ndarray, s: dict[str, Any]) -> Judgement:
    least = float(s.get("min_agreement", 1.0))
    if g.shape != w.shape or g.ndim == 0:
        return Judgement(kind, name, 0.0, least, False, f"shape {g.shape} vs {w.shape}")
    rows = max(g.shape[0], 1) if g.ndim > 1 else 1
    agree = _argmax_agreement(g.reshape(rows, -1), w.reshape(rows, -1))
    return _agreement(kind, name, agree, least, f"top-1 classes of {rows} sample(s)")


def _argmax_seq(kind: str, name: str, g: np.ndarray, w: np.ndarray, s: dict[str, Any]) -> Judgement:
    least = float(s.get("min_agreement", 1.0))
    if g.shape != w.shape or g.ndim == 0:
        return Judgement(kind, name, 0.0, least, False, f"shape {g.shape} vs {w.shape}")
    agree = _argmax_agreement(g, w)
    return _agreement(kind, name, agree, least, "argmax positions")


def _cosine(kind: str, name: str, g: np.ndarray, w: np.ndarray, s: dict[str, Any]) -> Judgement:
    least = float(s.get("min", 0.999))
    if g.size != w.size:
        return Judgement(kind, name, 0.0, least, False, f"shape {g.shape} vs {w.shape}")
    a, b = g.reshape(-1), w.reshape(-1)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        same = bool(np.array_equal(a, b, equal_nan=True))
        score = 1.0 if same else 0.0
        return Judgement(
            kind, name, score, least, same, "non-finite values " + ("agree" if same else "differ")
        )
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if np.array_equal(a, b):
        score = 1.0  # rounding in a @ b would give 0.9999999999999999 for identical outputs
    else:
        score = float(a @ b) / (na * nb) if na and nb else 0.0
        score = min(score, 1.0)
    return Judgement(
        kind, name, score, least, score >= least, f"cosine similarity {score:.6f} (needs {least})"
    )


def _mask(kind: str, name: str, g: np.ndarray, w: np.ndarray, s: dict[str, Any]) -> Judgement:
    least = float(s.get("min_agreement", 1.0))
    threshold = float(s["threshold"])
    if g.shape != w.shape:
        return Judgement(kind, name, 0.0, least, False, f"shape {g.shape} vs {w.shape}")
    a, b = g > threshold, w > threshold
    verdict = _agreement(kind, name, a == b, least, f"mask elements (> {threshold:g})")
    min_iou = s.get("min_iou")
    if min_iou is None:
        return verdict
    union = int(np.count_nonzero(a | b))
    iou = 1.0 if union == 0 else int(np.count_nonzero(a & b)) / union
    passed = verdict.passed and iou >= float(min_iou)
    detail = f"{verdict.detail}; IoU {iou:.4f} (needs {float(min_iou)})"
    return dataclasses.replace(verdict, passed=passed, detail=detail)


def _custom(kind: str, name: str, g: np.ndarray, w: np.ndarray, s: dict[str, Any]) -> Judgement:
    least = float(s.get("min", 1.0))
    result = s["function"](g, w)
    score = float(result)
    detail = f"{getattr(s['function'], '__name__', 'function')} gave {result!r}"
    return Judgement(kind, name, score, least, score >= least, detail)


_MEASURES: dict[str, Callable[[str, str, np.ndarray, np.ndarray, dict[str, Any]], Judgement]] = {
    "top1": _top1,
    "cosine": _cosine,
    "mask": _mask,
    "argmax_seq": _argmax_seq,
    "custom": _custom,
}


# ---------------------------------------------------------------------------------------------
# Accuracy budgets: what a reduced-precision or re-placed configuration may lose


#: The default budget: every output keeps a cosine similarity of at least 0.999 to the reference,
#: and the argmax over its last axis (a classifier's top-1, a sequence's tokens) agrees at 99%
#: of the positions.
DEFAULT_BUDGET: tuple[dict[str, Any], ...] = (
    {"kind": "cosine", "min": 0.999},
    {"kind": "argmax_seq", "min_agreement": 0.99},
)


@dataclasses.dataclass(frozen=True)
class BudgetVerdict:
    """How a configuration's outputs fared against a budget: every judgement, and whether all
    passed. ``worst`` is the lowest score (the figure tables show)."""

    judgements: tuple[Judgement, ...]

    @property
    def passed(self) -> bool:
        return all(j.passed for j in self.judgements)

    @property
    def worst(self) -> float:
        return min((j.score for j in self.judgements), default=1.0)

    def summary(self) -> str:
        failed = [j for j in self.judgements if not j.passed]
        if not failed:
            return f"within budget (worst score {self.worst:.6g})"
        return "outside budget: " + "; ".join(f"{j.output}: {j.detail}" for j in failed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "worst": self.worst,
            "judgements": [j.to_dict() for j in self.judgements],
        }


#: A budget: judge specs (see :func:`judge`), one spec, or a function ``(got, want) -> bool |
#: float`` judged per output (a score passes at >= 1 for bools, else at >= its ``min``).
Budget = Sequence[Mapping[str, Any]] | Mapping[str, Any] | Callable[..., Any]


def parse_budget(text: str) -> list[dict[str, Any]]:
    """``--accuracy`` text as judge specs: ``"cosine=0.9995,top1=0.98"``; ``top1`` and ``argmax``
    are the argmax agreement over the last axis, ``cosine`` the similarity, ``mask@0.5=0.99``
    the agreement of the masks at that threshold.

    Raises:
        InvalidInputError: an unknown kind or a value that is not a number in [0, 1].
    """
    specs: list[dict[str, Any]] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        kind, sep, value = item.partition("=")
        try:
            least = float(value) if sep else None
        except ValueError:
            least = -1.0
        if least is not None and not 0.0 <= least <= 1.0:
            raise InvalidInputError(f"--accuracy {item!r}: the value must be a number in [0, 1]")
        kind = kind.strip()
        if kind == "cosine":
            specs.append({"kind": "cosine", "min": 0.999 if least is None else least})
        elif kind in ("top1", "argmax", "argmax_seq"):
            specs.append({"kind": "argmax_seq", "min_agreement": 0.99 if least is None else least})
        elif kind.startswith("mask@"):
            try:
                threshold = float(kind.removeprefix("mask@"))
            except ValueError:
                raise InvalidInputError(
                    f"--accuracy {item!r}: mask@THRESHOLD needs a number"
                ) from None
            specs.append(
                {
                    "kind": "mask",
                    "threshold": threshold,
                    "min_agreement": 0.99 if least is None else least,
                }
            )
        else:
            raise InvalidInputError(
                f"--accuracy {item!r}: unknown measure {kind!r}; use cosine, top1 (or argmax) "
                "and mask@THRESHOLD, each =MIN, e.g. cosine=0.999,top1=0.99"
            )
    if not specs:
        raise InvalidInputError("--accuracy is empty; e.g. cosine=0.999,top1=0.99")
    return specs


def within_budget(
    got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray], budget: Budget | None = None
) -> BudgetVerdict:
    """Judge ``got`` against the reference ``want`` with every judge of ``budget`` (default
    :data:`DEFAULT_BUDGET`). Floats and small integers (8- and 16-bit: quantized values, whose
    last bit may round either way across engines) are judged; wider integers, booleans and
    strings (labels, ids, masks) must be equal. The argmax measures apply only where the last
    axis has two or more entries, and not to recurrent state (``state_out:*`` outputs: the
    values carried to the next call, not scores; their cosine is judged).
    """
    if callable(budget):
        specs: list[Mapping[str, Any]] = [{"kind": "custom", "function": budget}]
    elif budget is None:
        specs = list(DEFAULT_BUDGET)
    elif isinstance(budget, Mapping):
        specs = [budget]
    else:
        specs = list(budget)
    judgements: list[Judgement] = []
    for name in got:
        g, w = np.asarray(got[name]), np.asarray(want[name])
        quantized = g.dtype.kind in "iu" and g.dtype.itemsize <= 2
        if g.dtype.kind not in "fc" and g.dtype.name != "bfloat16" and not quantized:
            report = compare_outputs({name: g}, {name: w}, strict=False)
            (out,) = report.outputs
            score = 1.0 - out.mismatched / max(g.size, 1)
            judgements.append(Judgement("exact", name, score, 1.0, out.passed, out.describe()))
            continue
        for spec in specs:
            argmax = spec.get("kind") in ("argmax_seq", "top1")
            if argmax and (g.ndim == 0 or g.shape[-1] < 2 or name.startswith(STATE_OUTPUT_PREFIX)):
                continue
            judgements.extend(judge({**spec, "output": name})({name: g}, {name: w}))
    return BudgetVerdict(tuple(judgements))
