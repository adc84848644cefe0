"""The inputs of a scikit-learn model, for the scikit-learn converter: their names, types and batch
dims, planned from the example (arrays, or a DataFrame's columns), ``input_shapes`` or the
estimator's ``n_features_in_``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ferry.converters._base import DEFAULT_BATCH, ConvertOptions, as_array, example_items
from ferry.errors import InvalidInputError

__all__: list[str] = []

#: The name of the one input an estimator without per-column inputs gets.
DEFAULT_INPUT = "input"
# What skl2onnx names the outputs of classifiers, regressors, transformers, clusterers.
_OUTPUT_NAMES = frozenset({"label", "probabilities", "variable", "scores"})


@dataclass(frozen=True)
class _Input:
    """One input of the converted model."""

    name: str
    dtype: np.dtype[Any]
    n_features: int
    #: The batch dim: a symbolic name, or a fixed size.
    batch: str | int
    #: The DataFrame column the input carries (per-column inputs only).
    column: Any = None


@dataclass(frozen=True)
class _Inputs:
    inputs: list[_Input]
    sample: dict[str, np.ndarray] | None
    #: Rebuild a DataFrame from per-column inputs for the reference.
    frame: bool = False


def _plan_inputs(estimator: Any, options: ConvertOptions, notes: list[str]) -> _Inputs:
    expected = getattr(estimator, "n_features_in_", None)
    batch: str | int
    if options.example_inputs is not None:
        name, value = _unwrap_example(options.example_inputs)
        if _is_frame(value):
            return _frame_inputs(value, options, expected, notes)
        arr = _as_2d(value, name)
        arr = _normalize_dtype(arr, name, notes)
        n, batch = int(arr.shape[1]), _batch_name(name, options, DEFAULT_BATCH)
        sample: dict[str, np.ndarray] | None = {name: arr}
        dtype = arr.dtype
    elif options.input_shapes:
        if len(options.input_shapes) != 1:
            raise InvalidInputError(
                "a scikit-learn estimator takes one input X; input_shapes names "
                f"{sorted(options.input_shapes)}: give one shape, e.g. {{'input': ('batch', 8)}}"
            )
        ((name, shape),) = options.input_shapes.items()
        dims = tuple(shape)
        if len(dims) != 2 or not isinstance(dims[1], int) or isinstance(dims[1], bool):
            raise InvalidInputError(
                f"input_shapes[{name!r}] is {dims}; scikit-learn takes [batch, n_features] with "
                "a fixed number of features, e.g. ('batch', 8)"
            )
        n = dims[1]
        first = dims[0]
        batch = first if isinstance(first, int) and first > 0 else _batch_name(name, options, first)
        sample, dtype = None, np.dtype(np.float32)
    else:
        if expected is None:
            raise InvalidInputError(
                f"cannot tell how many features the {type(estimator).__name__} takes (it has no "
                "n_features_in_): pass example_inputs (an array [n_samples, n_features]) or "
                "input_shapes={'input': ('batch', n_features)}"
            )
        name, n, sample, dtype = DEFAULT_INPUT, int(expected), None, np.dtype(np.float32)
        batch = _batch_name(name, options, DEFAULT_BATCH)
    if expected is not None and n != int(expected):
        raise InvalidInputError(
            f"input {name!r} has {n} features but the {type(estimator).__name__} was fitted on "
            f"{int(expected)}"
        )
    _check_dynamic_axes(options, [name], notes)
    return _Inputs([_Input(name, dtype, n, batch)], sample)


def _unwrap_example(example: Any) -> tuple[str, Any]:
    """(input name, X) from a dict by name, a one-element tuple, or X itself."""
    items = example_items(example)
    if len(items) != 1:
        names = [k for k, _ in items if k is not None]
        raise InvalidInputError(
            f"{len(items)} example inputs given{f' ({names})' if names else ''}, but a "
            "scikit-learn estimator takes one input X: pass one array (or a pandas DataFrame, "
            "for one input per column)"
        )
    ((name, value),) = items
    return name or DEFAULT_INPUT, value


def _is_frame(value: Any) -> bool:
    # Duck-typed so that pandas is never imported unless the user handed us a DataFrame.
    return all(hasattr(value, a) for a in ("columns", "dtypes", "iloc", "to_numpy"))


def _as_2d(value: Any, name: str) -> np.ndarray:
    arr = as_array(value, name)
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise InvalidInputError(
            f"example input {name!r} has shape {arr.shape}; scikit-learn takes a 2-D array "
            "[n_samples, n_features] with at least one sample (use x.reshape(1, -1) for one)"
        )
    return arr


def _normalize_dtype(arr: np.ndarray, name: str, notes: list[str]) -> np.ndarray:
    """Bring ``arr`` to a dtype skl2onnx has a tensor type for: float32/64, int64 or strings."""
    kind = arr.dtype.kind
    if arr.dtype in (np.float32, np.int64) or kind in "OU":
        return arr.astype(object) if kind == "U" else arr
    if kind in "iu" or kind == "b":
        notes.append(f"input {name!r}: {arr.dtype} example cast to int64")
        return arr.astype(np.int64)
    if kind == "f":
        # float64 too: skl2onnx's double graphs for tree ensembles declare double outputs that
        # ONNX Runtime's tree kernels do not produce (the model fails to load), and float32 is
        # what every deployment engine runs.
        notes.append(f"input {name!r}: {arr.dtype} example fed as float32 (the model's input type)")
        return arr.astype(np.float32)
    raise InvalidInputError(
        f"example input {name!r} has dtype {arr.dtype}; pass float32, float64, int64 or strings"
    )


def _frame_inputs(
    frame: Any, options: ConvertOptions, expected: int | None, notes: list[str]
) -> _Inputs:
    """One ``[batch, 1]`` input per DataFrame column, as skl2onnx's ColumnTransformer expects."""
    if len(frame) == 0 or len(frame.columns) == 0:
        raise InvalidInputError("the example DataFrame is empty; pass at least one row")
    if expected is not None and len(frame.columns) != int(expected):
        raise InvalidInputError(
            f"the example DataFrame has {len(frame.columns)} columns but the estimator was "
            f"fitted on {int(expected)}"
        )
    inputs: list[_Input] = []
    sample: dict[str, np.ndarray] = {}
    cast: list[str] = []
    for column in frame.columns:
        name = str(column)
        values = np.asarray(frame[column].to_numpy()).reshape(-1, 1)
        if values.dtype.kind in "OUS":
            # Strings go in as objects; a column of other objects (mixed types) cannot.
            if not all(isinstance(v, str) for v in values.ravel()):
                raise InvalidInputError(
                    f"DataFrame column {name!r} holds non-string objects; give it one type "
                    "(numbers or strings)"
                )
            values = values.astype(object)
        elif values.dtype.kind == "f" and values.dtype != np.float32:
            # As for arrays (see _normalize_dtype); besides, skl2onnx concatenates per-column
            # results, and float64 next to float32 (what its encoders emit) does not type-check.
            values = values.astype(np.float32)
            cast.append(name)
        elif values.dtype.kind in "iub":
            values = values.astype(np.int64)
        elif values.dtype != np.float32:
            raise InvalidInputError(
                f"DataFrame column {name!r} has dtype {values.dtype}; use numbers or strings"
            )
        batch = _batch_name(name, options, DEFAULT_BATCH)
        inputs.append(_Input(name, values.dtype, 1, batch, column=column))
        sample[name] = values
    if len({i.name for i in inputs}) != len(inputs):
        raise InvalidInputError("the example DataFrame has duplicate column names")
    if cast:
        notes.append(f"float64 DataFrame columns fed as float32: {', '.join(cast)}")
    _check_dynamic_axes(options, [i.name for i in inputs], notes)
    return _Inputs(inputs, sample, frame=True)


def _batch_name(name: str, options: ConvertOptions, default: Any) -> str:
    axes = (options.dynamic_axes or {}).get(name, {})
    chosen = axes.get(0)
    if chosen:
        return str(chosen)
    return default if isinstance(default, str) and default else DEFAULT_BATCH


def _check_dynamic_axes(options: ConvertOptions, names: list[str], notes: list[str]) -> None:
    for name, axes in (options.dynamic_axes or {}).items():
        if name in _OUTPUT_NAMES:
            continue  # outputs take the input's batch dim (one row out per row in)
        if name not in names:
            raise InvalidInputError(
                f"dynamic_axes names input {name!r}, but the converted model's inputs are {names}"
            )
        if any(axis != 0 for axis in axes):
            notes.append(
                f"input {name!r}: only the batch dim (0) can be dynamic for scikit-learn; the "
                "feature dim stays fixed"
            )
