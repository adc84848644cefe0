"""scikit-learn -> the unified graph, through skl2onnx.

Before -> After::

    fitted estimator or Pipeline (in memory, or a trusted .pkl/.joblib file)
        -> ir.Model with one input ``input`` [batch, n_features] and plain tensor outputs:
           classifiers  ``label`` int64[batch], ``probabilities`` float32[batch, n_classes]
           regressors   ``variable`` float32[batch, n_targets]
           transformers ``variable`` [batch, n_out]; clusterers and outlier detectors
           ``label`` and ``scores``

The input type comes from ``options.example_inputs`` (float32, also for float64 examples; int64;
strings), else ``options.input_shapes`` (float32), else the estimator's ``n_features_in_``
(float32). A pandas DataFrame as example gives one ``[batch, 1]`` input per column, named after it,
which is what a ColumnTransformer selecting columns by name (mixed numeric and string columns)
needs. Classifiers are converted without ZipMap so that their probabilities are a tensor, not a
sequence of maps.

The reference runs the scikit-learn model on the very values ONNX Runtime gets: float32 inputs,
upcast exactly to float64. That matters for tree ensembles, whose split decisions flip for samples
within an ulp of a threshold: scikit-learn compares float32 features to float64 thresholds (skl2onnx
rounds each threshold to the float32 that keeps every such comparison), so feeding scikit-learn
the float64 data that ONNX Runtime sees rounded would compare different numbers. Scalers that
feed trees are converted to compute in float64 as scikit-learn does, for the same reason.

Verification data: the example inputs, else 64 random rows (standard normal floats, ints in
[0, 10)). Rows where a classifier's top two class scores tie are left out (with a note): there
scikit-learn takes the first class and ONNX Runtime whichever its float32 sums favour, and both
are right.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ferry.converters._base import (
    DEFAULT_BATCH,
    Converted,
    ConvertOptions,
    ReferenceFn,
    as_array,
    example_items,
    exporter_opset,
    first_line,
    list_ops,
    type_modules,
)
from ferry.errors import (
    BackendUnavailableError,
    ConversionError,
    InvalidInputError,
    ModelLoadError,
    UnsupportedOpError,
)

__all__ = ["DEFAULT_OPSET", "SklearnConverter"]

logger = logging.getLogger(__name__)

#: The default-domain opset skl2onnx is asked for when the user names none: every ONNX Runtime
#: from 1.14 on, onnxruntime-web and the mobile builds run it.
DEFAULT_OPSET = 18
DEFAULT_INPUT = "input"

_INSTALL = "pip install 'ferry[sklearn]'"
# Pickle protocols 2 and later open with PROTO (0x80) and the protocol number.
_PICKLE_MAGIC = 0x80
_SNIFF_BYTES = 1 << 16
# Steps that are not estimators: ColumnTransformer/FeatureUnion/Pipeline placeholders.
_PLACEHOLDERS = ("passthrough", "drop")
# Attributes through which fitted meta-estimators (search, stacking, voting, one-vs-rest, bagging,
# calibration, target transforms) hold the estimators that skl2onnx converts one by one.
_CHILD_ATTRS = (
    "best_estimator_",
    "estimator_",
    "estimators_",
    "final_estimator_",
    "regressor_",
    "transformer_",
    "calibrated_classifiers_",
)
#: Rows of generated verification data when the user gives no example.
SAMPLE_ROWS = 64
#: Class scores closer than this (relative to the top one, at least absolute) count as a tie.
_TIE = 1e-5
# What skl2onnx names the outputs of classifiers, regressors, transformers, clusterers.
_OUTPUT_NAMES = frozenset({"label", "probabilities", "variable", "scores"})
_MISSING_TYPE = re.compile(r"type '<class '([\w.]+)'>'")


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


class SklearnConverter:
    """Fitted scikit-learn estimators and pipelines (in memory, or trusted pickle/joblib files)."""

    name = "sklearn"
    extra = "sklearn"
    suffixes = (".pkl", ".pickle", ".joblib")

    def sniff(self, path: Path) -> bool:
        """A file with one of :attr:`suffixes`, or a pickle that names a scikit-learn class.

        Only the header is read, and nothing is unpickled: the opcodes of a pickled estimator name
        its class (``sklearn.pipeline``...) near the start, so a byte search is enough to tell a
        scikit-learn pickle from, say, a legacy ``torch.save`` file.
        """
        path = Path(path)
        if not path.is_file():
            return False
        if path.suffix.lower() in self.suffixes:
            return True
        try:
            with path.open("rb") as f:
                head = f.read(_SNIFF_BYTES)
        except OSError:
            return False
        return len(head) > 2 and head[0] == _PICKLE_MAGIC and b"sklearn." in head

    def accepts(self, obj: object) -> bool:
        """A scikit-learn estimator (or a subclass of one): something defined on sklearn's bases
        that can be fitted and then predicts or transforms. Imports nothing."""
        if isinstance(obj, (str, os.PathLike)) or "sklearn" not in type_modules(obj):
            return False
        return hasattr(obj, "fit") and (hasattr(obj, "predict") or hasattr(obj, "transform"))

    def convert(self, source: Path | object, options: ConvertOptions) -> Converted:
        """Convert a fitted estimator, or a pickle/joblib file when ``options.trust_pickle``.

        Raises:
            BackendUnavailableError: scikit-learn or skl2onnx is not installed.
            InvalidInputError: a pickle file without ``trust_pickle``; example inputs or shapes
                that do not fit the estimator.
            ModelLoadError: the file cannot be unpickled or holds no scikit-learn estimator.
            ConversionError: the estimator is not fitted, or skl2onnx fails.
            UnsupportedOpError: steps skl2onnx has no converter for, every one of them.
        """
        _import_backend()
        notes: list[str] = []
        if isinstance(source, (str, os.PathLike)):
            path = Path(source)
            estimator = _load_pickle(path, trust=options.trust_pickle, notes=notes)
            what = f"{path} (a {type(estimator).__name__})"
        else:
            estimator = source
            what = f"the {type(estimator).__name__}"
        if not self.accepts(estimator):
            raise ModelLoadError(
                f"{what} is not a scikit-learn estimator: ferry converts fitted scikit-learn "
                "estimators and pipelines"
            )
        unsupported = _unsupported(estimator)
        if unsupported:
            raise UnsupportedOpError(_unsupported_message(unsupported, what), unsupported)
        _check_fitted(estimator, what)
        plan = _plan_inputs(estimator, options, notes)
        opset = _opset(options.opset, notes)
        proto = _run_skl2onnx(estimator, plan, opset, what, notes)

        import onnx_ir as ir

        model = ir.from_proto(proto)
        _name_batch_dims(model, plan)
        reference = _make_reference(estimator, model, plan, notes)
        logger.debug("converted %s: %d nodes", what, len(model.graph))
        sample = plan.sample if plan.sample is not None else _random_sample(plan)
        if sample is not None and reference is not None:
            sample = _without_ties(estimator, model, plan, sample, notes)
        return Converted(model=model, reference=reference, sample_inputs=sample, notes=notes)


# --- loading ---------------------------------------------------------------------------------


def _import_backend() -> None:
    try:
        import skl2onnx  # noqa: F401
        import sklearn  # noqa: F401
    except ImportError as e:
        raise BackendUnavailableError(
            f"converting scikit-learn models needs scikit-learn and skl2onnx ({e.name} is "
            f"missing): {_INSTALL}"
        ) from e


def _load_pickle(path: Path, *, trust: bool, notes: list[str]) -> object:
    if not path.is_file():
        raise ModelLoadError(f"model file not found: {path}")
    if not trust:
        raise InvalidInputError(
            f"{path} is a pickle file, and unpickling can run arbitrary code: ferry loads it only "
            "when told to. Pass --trust-pickle (CLI) or trust_pickle=True, and only for a file "
            "you trust"
        )
    import joblib

    # joblib.load reads plain pickles as well as joblib's own (possibly compressed) files.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            obj = joblib.load(path)
        except Exception as e:  # pickle raises anything the pickled classes raise
            raise ModelLoadError(
                f"cannot unpickle {path}: {type(e).__name__}: {first_line(e)}. The classes it holds "
                "must be importable here (the same scikit-learn, your own modules on sys.path)"
            ) from e
    for w in caught:
        # sklearn's InconsistentVersionWarning: pickled with one version, loaded with another.
        if "version" in str(w.message).lower():
            notes.append(f"{path}: {first_line(w.message)}")
    return obj


def _check_fitted(estimator: Any, what: str) -> None:
    from sklearn.exceptions import NotFittedError
    from sklearn.utils.validation import check_is_fitted

    # A custom member of a meta-estimator may keep no fitted state (check_is_fitted then calls
    # it unfitted); report it as unsupported, after the conversion attempt, instead.
    if _unsupported(estimator, deep=True):
        return
    try:
        check_is_fitted(estimator)
    except NotFittedError as e:
        raise ConversionError(
            f"{what} is not fitted: call .fit(X, y) on it before converting"
        ) from e


# --- inputs ----------------------------------------------------------------------------------


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


# --- conversion ------------------------------------------------------------------------------


def _opset(requested: int | None, notes: list[str]) -> int:
    from skl2onnx import get_latest_tested_opset_version

    newest = int(get_latest_tested_opset_version())
    if requested is None:
        return min(DEFAULT_OPSET, newest)
    return exporter_opset(requested, notes, exporter="skl2onnx", newest=newest)


def _ml_opset(opset: int) -> int:
    # ai.onnx.ml 3 shipped with opset 15 (ONNX 1.10), 2 with opset 12; pair them as ONNX did.
    if opset >= 15:
        return 3
    return 2 if opset >= 12 else 1


def _skl2onnx_type(spec: _Input) -> Any:
    from skl2onnx.common.data_types import (
        DoubleTensorType,
        FloatTensorType,
        Int64TensorType,
        StringTensorType,
    )

    # skl2onnx takes None for an unknown dim; the symbolic name is set on the result.
    shape = [spec.batch if isinstance(spec.batch, int) else None, spec.n_features]
    if spec.dtype == np.float64:
        return DoubleTensorType(shape)
    if spec.dtype == np.int64:
        return Int64TensorType(shape)
    if spec.dtype.kind == "O":
        return StringTensorType(shape)
    return FloatTensorType(shape)


def _run_skl2onnx(estimator: Any, plan: _Inputs, opset: int, what: str, notes: list[str]) -> Any:
    from skl2onnx import convert_sklearn
    from sklearn.base import is_classifier

    initial_types = [(spec.name, _skl2onnx_type(spec)) for spec in plan.inputs]
    conv_options: dict[int, dict[str, Any]] = {}
    if is_classifier(estimator):
        # Without ZipMap a classifier's probabilities are a [N, C] tensor instead of a sequence
        # of maps, which ferry's runtime and every engine but ONNX Runtime cannot carry.
        conv_options[id(estimator)] = {"zipmap": False}
    scalers = _scalers_feeding_trees(estimator)
    custom = {type(scaler): _float64_scaler for scaler in scalers}
    if scalers:
        notes.append(
            f"{len(scalers)} scaler(s) before a tree model compute in float64 as scikit-learn "
            "does (Cast, the scaling, Cast), so that split decisions match it"
        )
    try:
        proto = convert_sklearn(
            estimator,
            name=type(estimator).__name__,
            initial_types=initial_types,
            target_opset={"": opset, "ai.onnx.ml": _ml_opset(opset)},
            options=conv_options or None,
            custom_conversion_functions=custom or None,
        )
    except Exception as e:  # skl2onnx raises RuntimeError, ValueError, TypeError, NameError...
        unsupported = _unsupported(estimator, deep=True)
        if not unsupported:
            match = _MISSING_TYPE.search(str(e))
            if match:
                unsupported = [(match.group(1).rsplit(".", 1)[-1], _root_path(estimator))]
        if unsupported:
            raise UnsupportedOpError(_unsupported_message(unsupported, what), unsupported) from e
        hint = ""
        if getattr(estimator, "feature_names_in_", None) is not None and not plan.frame:
            hint = (
                "; it was fitted on a DataFrame: if it selects columns by name, pass a DataFrame "
                "as example_inputs"
            )
        raise ConversionError(
            f"skl2onnx {_versions()} cannot convert {what}: {_skl2onnx_reason(e)}{hint}"
        ) from e
    return proto


def _scalers_feeding_trees(estimator: Any) -> list[Any]:
    """The Standard/Robust/MaxAbs/MinMax scalers of a model that also holds decision trees.

    scikit-learn scales in float64 (its models are fitted on float64) and casts to float32 for
    the trees; skl2onnx scales in float32 with rounded statistics (and multiplies by a reciprocal
    where scikit-learn divides). On discrete data the two differ exactly where it matters: an
    affine scaling maps the midpoint of two values (a split threshold) onto a third value (the 1
    between pixel values 0 and 2), so samples sit within an ulp of thresholds and take the other
    branch. These scalers get :func:`_float64_scaler`; before linear models, which do not care,
    skl2onnx's cheaper float32 ops stay. (skl2onnx's own ``div_cast`` option rounds the mean to
    float32 first, which defeats it.)
    """
    from sklearn.preprocessing import MaxAbsScaler, MinMaxScaler, RobustScaler, StandardScaler

    nodes = [obj for obj, _ in _walk(estimator, deep=True)]
    if not any(type(obj).__module__.startswith("sklearn.tree") for obj in nodes) and not any(
        hasattr(obj, "_predictors")
        for obj in nodes  # HistGradientBoosting keeps no tree_
    ):
        return []
    kinds = (StandardScaler, RobustScaler, MaxAbsScaler, MinMaxScaler)
    return [obj for obj in nodes if type(obj) in kinds]


def _float64_scaler(scope: Any, operator: Any, container: Any) -> None:
    """skl2onnx converter for Standard/Robust/MaxAbs/MinMax scalers that computes as their
    ``transform`` does on float64 data: the same operations, in the same order, on the float64
    statistics, then one rounding to the output type.

    Before -> After::

        Scaler(offset=f32(mean), scale=f32(1/std))  -> Cast(f64), Sub(mean), Div(std), Cast(f32)
        Mul(f32(scale)), Add(f32(min)) [, Clip]      -> Cast(f64), Mul, Add [, Max, Min], Cast
    """
    from onnx import TensorProto
    from skl2onnx.common.data_types import guess_proto_type
    from skl2onnx.operator_converters.common import concatenate_variables
    from sklearn.preprocessing import MinMaxScaler, RobustScaler, StandardScaler

    op = operator.raw_operator
    if len(operator.inputs) > 1:
        x = concatenate_variables(scope, operator.inputs, container)
    else:
        x = operator.inputs[0].full_name
    out_type = guess_proto_type(operator.outputs[0].type)
    if out_type != TensorProto.DOUBLE:
        out_type = TensorProto.FLOAT

    def node(op_type: str, inputs: list[str], **attrs: Any) -> str:
        out = scope.get_unique_variable_name(op_type.lower())
        name = scope.get_unique_operator_name(op_type)
        container.add_node(op_type, inputs, [out], name=name, **attrs)
        return out

    def const(values: Any) -> str:
        arr = np.asarray(values, dtype=np.float64)
        name = scope.get_unique_variable_name("scaler_const")
        container.add_initializer(name, TensorProto.DOUBLE, list(arr.shape), arr.ravel().tolist())
        return name

    y = node("Cast", [x], to=TensorProto.DOUBLE)
    if isinstance(op, MinMaxScaler):
        # X *= scale_; X += min_; np.clip(X, *feature_range) if clip
        y = node("Add", [node("Mul", [y, const(op.scale_)]), const(op.min_)])
        if getattr(op, "clip", False):
            low, high = op.feature_range
            y = node("Min", [node("Max", [y, const(low)]), const(high)])
    else:
        # StandardScaler: X -= mean_ if with_mean; X /= scale_ if with_std (mean_ is fitted even
        # without with_mean). RobustScaler: center_ and scale_, None when switched off.
        offset = None
        if isinstance(op, StandardScaler) and op.with_mean:
            offset = op.mean_
        elif isinstance(op, RobustScaler):
            offset = op.center_
        if offset is not None:
            y = node("Sub", [y, const(offset)])
        if op.scale_ is not None and getattr(op, "with_std", True):
            y = node("Div", [y, const(op.scale_)])
    container.add_node(
        "Cast",
        [y],
        [operator.outputs[0].full_name],
        name=scope.get_unique_operator_name("Cast"),
        to=out_type,
    )


def _versions() -> str:
    import skl2onnx
    import sklearn

    return f"{skl2onnx.__version__} (scikit-learn {sklearn.__version__})"


_BAD_NODE = re.compile(r"Unable to create node '(\w+)'")


def _skl2onnx_reason(e: Exception) -> str:
    # onnx refusing a node's attributes comes with every attribute's value (megabytes for a
    # forest); the op is what matters, and that this release pair does not fit together.
    match = _BAD_NODE.search(str(e))
    if match:
        return (
            f"it builds a {match.group(1)} node that onnx rejects (this skl2onnx does not handle "
            "the model as this scikit-learn stores it); try another skl2onnx or scikit-learn "
            "release"
        )
    return first_line(e)


def _known_to_skl2onnx(obj: Any) -> bool:
    from skl2onnx._parse import sklearn_parsers_map
    from skl2onnx._supported_operators import sklearn_operator_name_map

    return type(obj) in sklearn_operator_name_map or type(obj) in sklearn_parsers_map


def _root_path(estimator: Any) -> str:
    return type(estimator).__name__.lower()


def _children(obj: Any, *, deep: bool) -> Iterator[tuple[str, Any]]:
    """(relative path, sub-estimator) for the steps of a Pipeline, FeatureUnion or
    ColumnTransformer, and with ``deep`` the estimators a meta-estimator holds."""
    from sklearn.compose import ColumnTransformer
    from sklearn.pipeline import FeatureUnion, Pipeline

    if isinstance(obj, Pipeline):
        yield from obj.steps
    elif isinstance(obj, FeatureUnion):
        yield from obj.transformer_list
    elif isinstance(obj, ColumnTransformer):
        fitted = getattr(obj, "transformers_", None)
        for name, step, _columns in fitted if fitted is not None else obj.transformers:
            yield name, step
    elif deep and not hasattr(obj, "get_support"):
        # Feature selectors (SelectFromModel, RFE) convert to a column mask: their estimator_
        # never reaches skl2onnx.
        for attr in _CHILD_ATTRS:
            value = getattr(obj, attr, None)
            if value is None:
                continue
            if isinstance(value, (list, tuple, np.ndarray)):
                for i, child in enumerate(np.asarray(value, dtype=object).ravel()):
                    # CalibratedClassifierCV keeps _CalibratedClassifier wrappers of the estimator.
                    inner = (
                        getattr(child, "estimator", child) if attr.startswith("calib") else child
                    )
                    yield f"{attr}[{i}]", inner
            else:
                yield attr, value


def _walk(estimator: Any, *, deep: bool) -> Iterator[tuple[Any, str]]:
    """(estimator, step path) for the model and every step in it, stopping at steps skl2onnx
    does not know (their insides never reach it)."""

    def visit(obj: Any, path: str) -> Iterator[tuple[Any, str]]:
        if obj is None or (isinstance(obj, str) and obj in _PLACEHOLDERS):
            return
        if not hasattr(obj, "fit"):
            return  # fitted attributes that are not estimators (arrays of scores...)
        yield obj, path
        if _known_to_skl2onnx(obj):
            for name, child in _children(obj, deep=deep):
                yield from visit(child, f"{path}/{name}")

    yield from visit(estimator, _root_path(estimator))


def _unsupported(estimator: Any, *, deep: bool = False) -> list[tuple[str, str]]:
    """(class name, step path) of every step skl2onnx has no converter for, in pipeline order.

    Every step of a container goes through skl2onnx's registry, so the shallow walk is exact and
    runs before converting. The deep one also looks inside meta-estimators (search, stacking,
    voting, bagging...), whose converters may handle their members in their own ways; it runs
    only to explain a failed conversion.
    """
    return [
        (type(obj).__name__, path)
        for obj, path in _walk(estimator, deep=deep)
        if not _known_to_skl2onnx(obj)
    ]


def _unsupported_message(ops: list[tuple[str, str]], what: str) -> str:
    return (
        f"skl2onnx has no converter for {len({op for op, _ in ops})} step type(s) in {what}: "
        f"{list_ops(ops)}. Replace them with supported scikit-learn steps, or register a "
        "converter for each with skl2onnx.update_registered_converter (for xgboost/lightgbm "
        "models, onnxmltools provides them)"
    )


# --- the converted model ---------------------------------------------------------------------


def _name_batch_dims(model: Any, plan: _Inputs) -> None:
    """Make the batch dim of inputs and outputs the symbolic name asked for (skl2onnx leaves it
    unnamed); every scikit-learn output has one row per input row."""
    import onnx_ir as ir

    by_name = {spec.name: spec for spec in plan.inputs}
    batch: str | int = plan.inputs[0].batch
    for value in model.graph.inputs:
        spec = by_name.get(value.name)
        if spec is not None and value.shape is not None and isinstance(spec.batch, str):
            value.shape = ir.Shape([spec.batch, *list(value.shape)[1:]])
    for value in model.graph.outputs:
        shape = value.shape
        if shape is None or len(shape) == 0:
            continue
        first = shape[0]
        if isinstance(first, ir.SymbolicDim) and first.value is None:
            value.shape = ir.Shape([batch, *list(shape)[1:]])


def _method_for(estimator: Any, output: str) -> str | None:
    """The scikit-learn method computing skl2onnx's output ``output``."""
    from sklearn.base import is_outlier_detector, is_regressor

    if output == "label":
        return "predict"
    if output == "probabilities":
        # SVC(probability=False) and friends: skl2onnx puts the decision function there.
        return "predict_proba" if hasattr(estimator, "predict_proba") else "decision_function"
    if output == "variable":
        if is_regressor(estimator) or not hasattr(estimator, "transform"):
            return "predict"
        return "transform"
    if output == "scores":
        if is_outlier_detector(estimator) or not hasattr(estimator, "transform"):
            return "decision_function"
        return "transform"  # KMeans: distances to the centroids
    return None


def _make_reference(
    estimator: Any, model: Any, plan: _Inputs, notes: list[str]
) -> ReferenceFn | None:
    """Run ``estimator`` on the converted model's feeds; outputs named, shaped and typed as the
    converted model's."""
    outputs: list[tuple[str, str, np.dtype[Any] | None, int | None]] = []
    for value in model.graph.outputs:
        name = value.name or ""
        method = _method_for(estimator, name)
        if method is None or not hasattr(estimator, method):
            notes.append(
                f"no scikit-learn method matches output {name!r}; the conversion is not "
                "checked against scikit-learn"
            )
            return None
        dtype = _numpy_dtype(value)
        rank = len(value.shape) if value.shape is not None else None
        outputs.append((name, method, dtype, rank))

    specs = list(plan.inputs)
    frame = plan.frame

    def reference(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results: dict[str, np.ndarray] = {}
        computed: dict[str, np.ndarray] = {}
        with warnings.catch_warnings():
            # Fitted on a DataFrame, fed an array: the warning says nothing about the values.
            warnings.filterwarnings("ignore", message=".*valid feature names.*")
            for name, method, dtype, rank in outputs:
                if method not in computed:
                    computed[method] = _call(estimator, method, feeds, specs, frame)
                results[name] = _conform(computed[method], dtype, rank)
        return results

    return reference


def _call(
    estimator: Any, method: str, feeds: dict[str, np.ndarray], specs: list[_Input], frame: bool
) -> np.ndarray:
    """``estimator.<method>(X)`` on the values ONNX Runtime got, upcast exactly to float64.

    float64 is what scikit-learn models are fitted in, and what the converted graph's scalers
    reproduce before trees (see :func:`_scalers_feeding_trees`); some estimators (KMeans fitted
    on float64) reject float32 outright.
    """

    def get(name: str) -> np.ndarray:
        arr = np.asarray(feeds[name])
        return arr.astype(np.float64) if arr.dtype == np.float32 else arr

    x: Any
    if frame:
        import pandas as pd

        x = pd.DataFrame(
            {spec.column: get(spec.name).reshape(-1) for spec in specs},
            columns=[spec.column for spec in specs],
        )
    else:
        x = get(specs[0].name)
    return np.asarray(getattr(estimator, method)(x))


def _random_sample(plan: _Inputs) -> dict[str, np.ndarray] | None:
    """Verification rows like ferry's own random feeds (standard normal floats, ints in [0, 10)),
    but :data:`SAMPLE_ROWS` of them: one row says little about a model of many branches."""
    rng = np.random.default_rng(0)
    sample: dict[str, np.ndarray] = {}
    for spec in plan.inputs:
        rows = spec.batch if isinstance(spec.batch, int) else SAMPLE_ROWS
        shape = (rows, spec.n_features)
        if spec.dtype == np.int64:
            sample[spec.name] = rng.integers(0, 10, size=shape).astype(np.int64)
        elif spec.dtype.kind == "f":
            sample[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
        else:
            return None  # strings come with the user's example
    return sample


def _without_ties(
    estimator: Any, model: Any, plan: _Inputs, sample: dict[str, np.ndarray], notes: list[str]
) -> dict[str, np.ndarray]:
    """Drop the rows where a classifier's top two class scores tie.

    There scikit-learn picks the first class and ONNX Runtime whichever its float32 sums, added
    in another order, make larger by an ulp: either label is right, and comparing labels exactly
    would fail a correct conversion (random inputs hit 20-tree votes of 10 against 10 often).
    """
    names = [v.name for v in model.graph.outputs]
    if "label" not in names or "probabilities" not in names:
        return sample
    method = _method_for(estimator, "probabilities")
    if method is None or not hasattr(estimator, method):
        return sample
    try:
        scores = _call(estimator, method, sample, plan.inputs, plan.frame).astype(np.float64)
    except Exception:  # the parity check runs it again and reports the failure properly
        return sample
    if scores.ndim == 1:  # binary decision_function: the sign decides
        top, gap = np.abs(scores), np.abs(scores)
    elif scores.ndim == 2 and scores.shape[1] >= 2:
        ordered = np.sort(scores, axis=1)
        top, gap = np.abs(ordered[:, -1]), ordered[:, -1] - ordered[:, -2]
    else:
        return sample
    keep = gap > _TIE * np.maximum(top, 1.0)
    if keep.all() or not keep.any():
        return sample
    dropped = int((~keep).sum())
    notes.append(
        f"{dropped} of {len(keep)} verification rows left out: the top two class scores tie "
        "there, and scikit-learn and ONNX Runtime may each pick either label"
    )
    return {name: np.asarray(arr)[keep] for name, arr in sample.items()}


def _numpy_dtype(value: Any) -> np.dtype[Any] | None:
    dtype = value.dtype
    if dtype is None:
        return None
    try:
        return np.dtype(dtype.numpy())
    except Exception:  # STRING and types numpy lacks
        return None


def _conform(y: np.ndarray, dtype: np.dtype[Any] | None, rank: int | None) -> np.ndarray:
    """Shape scikit-learn's result like the ONNX output ([N] vs [N, 1]) and give it its dtype."""
    if rank is not None and y.ndim != rank:
        if y.ndim == 1 and rank == 2:
            y = y.reshape(-1, 1)
        elif y.ndim == 2 and rank == 1 and y.shape[1] == 1:
            y = y[:, 0]
    if dtype is not None and y.dtype.kind in "biuf" and dtype.kind in "biuf":
        y = y.astype(dtype, copy=False)
    return y
