"""Tensor specs of a model's inputs and outputs, and the check of user inputs against them.

The check runs on every ``Session.run`` call, so it is built once per session into a flat table and
does only attribute reads and comparisons on the happy path; the wordy diagnosis of what is wrong is
done only after something failed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx_ir as ir

from ferry.errors import InvalidInputError
from ferry.graph import Dim, dtype_name, shape_of

__all__ = ["InputChecker", "TensorSpec", "format_shape", "spec_of"]


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """A model input or output.

    Attributes:
        name: the tensor's name in the graph.
        shape: one entry per dim: an int for a fixed size, a str for a symbolic dim (``"batch"``),
            None for an unnamed dynamic dim. ``shape`` itself is None when the rank is unknown.
        dtype: the numpy dtype (``np.dtype(object)`` for strings); None when unknown.
        onnx_type: the ONNX element type name, e.g. ``"FLOAT"``, ``"BFLOAT16"``.
    """

    name: str
    shape: tuple[Dim, ...] | None
    dtype: np.dtype[Any] | None
    onnx_type: str | None

    def describe(self) -> str:
        """``float32 [batch, 3, 224, 224]``."""
        dtype = str(self.dtype) if self.dtype is not None else "?"
        if self.onnx_type == "STRING":
            dtype = "string"
        return f"{dtype} {format_shape(self.shape)}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": None if self.shape is None else list(self.shape),
            "dtype": self.describe().split(" ")[0],
        }


def format_shape(shape: tuple[Dim, ...] | None) -> str:
    """``[batch, 3, 224, 224]``; ``[?]`` for an unknown rank."""
    if shape is None:
        return "[?]"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def spec_of(
    value: ir.Value, inferred: tuple[str | None, tuple[Dim, ...] | None] | None = None
) -> TensorSpec:
    """The spec of a graph value, filling what the graph leaves out from shape inference."""
    shape = shape_of(value)
    if shape is None and inferred is not None:
        shape = inferred[1]
    dtype = value.dtype
    if dtype is None and inferred is not None and inferred[0] is not None:
        dtype = _DTYPES_BY_NAME.get(inferred[0])
    np_dtype: np.dtype[Any] | None = None
    if dtype is not None:
        try:
            np_dtype = np.dtype(dtype.numpy())
        except (TypeError, ValueError):  # types numpy cannot hold (e.g. 4-bit without ml_dtypes)
            np_dtype = None
    return TensorSpec(value.name or "", shape, np_dtype, dtype.name if dtype is not None else None)


_DTYPES_BY_NAME = {dtype_name(t): t for t in ir.DataType if t != ir.DataType.UNDEFINED}


@dataclasses.dataclass(frozen=True)
class _Check:
    name: str
    dtype: np.dtype[Any] | None
    is_string: bool
    rank: int  # -1: unknown rank, anything goes
    fixed: tuple[tuple[int, int], ...]  # (axis, size) for every fixed dim
    symbols: tuple[tuple[int, str], ...]  # (axis, name) for named dims shared with another input


class InputChecker:
    """Checks a dict of inputs against the model's input specs.

    ``required`` inputs must be given; ``optional`` ones (initializers that old models also list as
    inputs) may be given to override their default.
    """

    def __init__(
        self, required: list[TensorSpec], optional: list[TensorSpec] | None = None
    ) -> None:
        self.required = list(required)
        self.optional = list(optional or [])
        # A named dim only constrains anything when two inputs (or two axes) share it.
        seen: dict[str, int] = {}
        for spec in self.required + self.optional:
            for d in spec.shape or ():
                if isinstance(d, str):
                    seen[d] = seen.get(d, 0) + 1
        shared = {name for name, count in seen.items() if count > 1}
        self._checks = [self._compile(s, shared) for s in self.required]
        self._optional_checks = {s.name: self._compile(s, shared) for s in self.optional}
        self._has_symbols = any(c.symbols for c in self._checks)
        self._specs = {s.name: s for s in self.required + self.optional}

    @staticmethod
    def _compile(spec: TensorSpec, shared: set[str]) -> _Check:
        shape = spec.shape
        return _Check(
            name=spec.name,
            dtype=spec.dtype,
            is_string=spec.onnx_type == "STRING",
            rank=-1 if shape is None else len(shape),
            fixed=tuple((i, d) for i, d in enumerate(shape or ()) if isinstance(d, int)),
            symbols=tuple(
                (i, d) for i, d in enumerate(shape or ()) if isinstance(d, str) and d in shared
            ),
        )

    def check(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Return the feeds (numpy arrays by name), or raise InvalidInputError saying what is wrong."""
        if not isinstance(inputs, Mapping):
            raise InvalidInputError(
                f"inputs must be a dict of name -> numpy array, got {type(inputs).__name__}; "
                f"the model takes {self._list_inputs()}"
            )
        if len(inputs) != len(self._checks) or type(inputs) is not dict:
            return self._check_slow(inputs)
        # Same count and every required name present means no unknown names either.
        for c in self._checks:
            arr = inputs.get(c.name)
            if type(arr) is not np.ndarray:
                return self._check_slow(inputs)
            self._check_one(c, arr)
        if self._has_symbols:
            self._check_symbols(inputs)
        return inputs

    def _check_slow(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        unknown = [k for k in inputs if k not in self._specs]
        if unknown:
            raise InvalidInputError(
                f"unknown input {_names(unknown)}; the model takes {self._list_inputs()}"
            )
        missing = [c.name for c in self._checks if c.name not in inputs]
        if missing:
            raise InvalidInputError(
                f"missing input {_names(missing)}; the model takes {self._list_inputs()}"
            )
        feeds: dict[str, np.ndarray] = {}
        for name, value in inputs.items():
            arr = value if isinstance(value, np.ndarray) else _as_array(name, value)
            check = self._optional_checks.get(name)
            if check is None:
                check = next(c for c in self._checks if c.name == name)
            self._check_one(check, arr)
            feeds[name] = arr
        if self._has_symbols:
            self._check_symbols(feeds)
        return feeds

    def _check_one(self, c: _Check, arr: np.ndarray) -> None:
        if (
            c.dtype is not None
            and arr.dtype != c.dtype
            and not (c.is_string and arr.dtype.kind in "OUS")
        ):
            expected = "string (numpy str_ or object)" if c.is_string else str(c.dtype)
            raise InvalidInputError(
                f"input {c.name!r} must be {expected}, got {arr.dtype}; convert it with "
                f"numpy.asarray(x, dtype=numpy.{c.dtype if not c.is_string else 'str_'})"
            )
        if c.rank < 0:
            return
        shape = arr.shape
        if len(shape) != c.rank:
            raise InvalidInputError(
                f"input {c.name!r} must have {c.rank} dims {format_shape(self._specs[c.name].shape)}, "
                f"got shape {list(shape)}"
            )
        for axis, size in c.fixed:
            if shape[axis] != size:
                raise InvalidInputError(
                    f"input {c.name!r} dim {axis} must be {size}, got {shape[axis]} "
                    f"(shape {list(shape)}, expected {format_shape(self._specs[c.name].shape)})"
                )

    def _check_symbols(self, feeds: Mapping[str, np.ndarray]) -> None:
        bound: dict[str, tuple[str, int, int]] = {}
        for c in (*self._checks, *self._optional_checks.values()):
            arr = feeds.get(c.name)
            if arr is None:
                continue
            for axis, sym in c.symbols:
                size = arr.shape[axis]
                if sym in bound and bound[sym][2] != size:
                    other, other_axis, other_size = bound[sym]
                    raise InvalidInputError(
                        f"dim {sym!r} must be the same size everywhere: input {other!r} dim "
                        f"{other_axis} is {other_size} but input {c.name!r} dim {axis} is {size}"
                    )
                bound.setdefault(sym, (c.name, axis, size))

    def _list_inputs(self) -> str:
        parts = [f"{s.name!r} ({s.describe()})" for s in self.required]
        parts += [f"{s.name!r} ({s.describe()}, optional)" for s in self.optional]
        return ", ".join(parts) if parts else "no inputs"


def _names(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names)


def _as_array(name: str, value: Any) -> np.ndarray:
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as e:
        raise InvalidInputError(
            f"input {name!r} is a {type(value).__name__} that cannot be turned into an array: {e}"
        ) from e
