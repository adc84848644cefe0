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

This module holds the converter, loading, and the converted model's batch dims and reference;
beside it, ``_sklearn_inputs`` plans the inputs and ``_sklearn_export`` runs skl2onnx.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ferry.converters._base import (
    Converted,
    ConvertOptions,
    ReferenceFn,
    exporter_opset,
    first_line,
    type_modules,
)
from ferry.converters._sklearn_export import _run_skl2onnx, _unsupported, _unsupported_message
from ferry.converters._sklearn_inputs import _Input, _Inputs, _plan_inputs
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

_INSTALL = "pip install 'ferry[sklearn]'"
# Pickle protocols 2 and later open with PROTO (0x80) and the protocol number.
_PICKLE_MAGIC = 0x80
_SNIFF_BYTES = 1 << 16
#: Rows of generated verification data when the user gives no example.
SAMPLE_ROWS = 64
#: Class scores closer than this (relative to the top one, at least absolute) count as a tie.
_TIE = 1e-5


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


# --- conversion ------------------------------------------------------------------------------


def _opset(requested: int | None, notes: list[str]) -> int:
    from skl2onnx import get_latest_tested_opset_version

    newest = int(get_latest_tested_opset_version())
    if requested is None:
        return min(DEFAULT_OPSET, newest)
    return exporter_opset(requested, notes, exporter="skl2onnx", newest=newest)


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
