"""skl2onnx, for the scikit-learn converter: running the conversion (ZipMap off, scalers that feed
trees computed in float64 as scikit-learn does), and naming every estimator in a pipeline or
meta-estimator that skl2onnx cannot convert.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from ferry.converters._base import first_line, list_ops
from ferry.converters._sklearn_inputs import _Input, _Inputs
from ferry.errors import ConversionError, UnsupportedOpError

__all__: list[str] = []

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
_MISSING_TYPE = re.compile(r"type '<class '([\w.]+)'>'")


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
