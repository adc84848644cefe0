"""scikit-learn -> ONNX through skl2onnx: parity with scikit-learn on its own datasets, pickles,
unsupported steps, and the converter's protocol methods."""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("sklearn")
pytest.importorskip("skl2onnx")

import joblib
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.cluster import KMeans
from sklearn.compose import ColumnTransformer
from sklearn.datasets import load_diabetes, load_digits, load_iris
from sklearn.decomposition import PCA
from sklearn.ensemble import (
    GradientBoostingRegressor,
    HistGradientBoostingClassifier,
    RandomForestClassifier,
)
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.pipeline import FeatureUnion, Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.tree import DecisionTreeClassifier

import ferry
from ferry.converters import Converted, ConvertOptions, SklearnConverter, convert_onnx
from ferry.converters._sklearn import DEFAULT_OPSET
from ferry.errors import (
    ConversionError,
    InvalidInputError,
    ModelLoadError,
    UnsupportedOpError,
)

pytestmark = pytest.mark.sklearn

CONVERTER = SklearnConverter()


class Clip(TransformerMixin, BaseEstimator):
    """A stateless custom step: skl2onnx has no converter for it."""

    def fit(self, X: Any, y: Any = None) -> Clip:
        return self

    def transform(self, X: Any) -> Any:
        return np.clip(X, 0.0, 8.0)


class Square(TransformerMixin, BaseEstimator):
    """Another one, with fitted state, so that only the converter can object to it."""

    def fit(self, X: Any, y: Any = None) -> Square:
        self.n_features_in_ = np.asarray(X).shape[1]
        return self

    def transform(self, X: Any) -> Any:
        return np.asarray(X) ** 2


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """8x8 handwritten digits: 1500 to fit on, 297 held out (float32, as the model is fed)."""
    X, y = load_digits(return_X_y=True)
    return X[:1500], y[:1500], X[1500:].astype(np.float32), y[1500:]


@pytest.fixture(scope="module")
def diabetes() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    X, y = load_diabetes(return_X_y=True)
    return X[:400], y[:400], X[400:].astype(np.float32)


@pytest.fixture(scope="module")
def scaler_logreg(digits: Any) -> Pipeline:
    X, y, _, _ = digits
    return Pipeline(
        [("scaler", StandardScaler()), ("logreg", LogisticRegression(max_iter=2000))]
    ).fit(X, y)


def _convert(model: object, **options: Any) -> Converted:
    return CONVERTER.convert(model, ConvertOptions(**options))


def _run(converted: Converted, X: np.ndarray) -> dict[str, np.ndarray]:
    """Check the model as ferry.convert would, then run it on ONNX Runtime through ferry."""
    convert_onnx(converted.model.clone())
    return ferry.load(converted.model).run({"input": X})


def _assert_classifier_parity(converted: Converted, model: Any, X: np.ndarray) -> None:
    """ONNX Runtime on float32 X against scikit-learn on the same values (in float64, the dtype
    it was fitted in): every label equal, probabilities to float32 precision."""
    out = _run(converted, X)
    assert list(out) == ["label", "probabilities"]
    assert out["label"].dtype == np.int64
    assert out["probabilities"].dtype == np.float32
    X64 = X.astype(np.float64)
    np.testing.assert_array_equal(out["label"], model.predict(X64))
    np.testing.assert_allclose(out["probabilities"], model.predict_proba(X64), atol=1e-5)
    # The reference the parity check uses agrees as well, in names, shapes and dtypes.
    ref = converted.reference({"input": X})  # type: ignore[misc]
    assert set(ref) == set(out)
    np.testing.assert_array_equal(ref["label"], out["label"])
    assert ref["probabilities"].dtype == np.float32
    np.testing.assert_allclose(ref["probabilities"], out["probabilities"], atol=1e-5)


# --- the cases: classifiers and regressors on real data -------------------------------


def test_scaler_logistic_regression_pipeline(digits: Any, scaler_logreg: Pipeline) -> None:
    _, _, X_test, y_test = digits
    converted = _convert(scaler_logreg)
    inp = converted.model.graph.inputs[0]
    assert (inp.name, str(inp.shape)) == ("input", "[batch,64]")
    # skl2onnx declares the newest opset its ops need, up to the one asked for.
    assert converted.model.opset_imports[""] <= DEFAULT_OPSET
    assert [str(v.shape) for v in converted.model.graph.outputs] == ["[batch]", "[batch,10]"]
    # No example given: 64 random rows (ferry's own random feeds are one row).
    assert converted.sample_inputs is not None
    assert converted.sample_inputs["input"].shape == (64, 64)
    assert converted.sample_inputs["input"].dtype == np.float32
    _assert_classifier_parity(converted, scaler_logreg, X_test)
    assert (scaler_logreg.predict(X_test) == y_test).mean() > 0.9  # a model worth checking


def test_random_forest_classifier(digits: Any) -> None:
    X, y, X_test, _ = digits
    forest = RandomForestClassifier(n_estimators=30, random_state=0).fit(X, y)
    _assert_classifier_parity(_convert(forest), forest, X_test)


def test_scaler_forest_pipeline(digits: Any) -> None:
    X, y, X_test, _ = digits
    model = Pipeline(
        [("scaler", StandardScaler()), ("forest", RandomForestClassifier(20, random_state=0))]
    ).fit(X, y)
    converted = _convert(model)
    # Digits are integers: after scaling, a split between pixel values 0 and 2 lies on the
    # scaled 1, and only scaling exactly as scikit-learn does keeps those samples on its side.
    assert any("float64" in note for note in converted.notes)
    _assert_classifier_parity(converted, model, X_test)


def test_string_class_labels() -> None:
    X, y = load_iris(return_X_y=True)
    names = np.array(["setosa", "versicolor", "virginica"])[y]
    model = LogisticRegression(max_iter=1000).fit(X, names)
    X32 = X.astype(np.float32)
    out = _run(_convert(model), X32)
    np.testing.assert_array_equal(out["label"].astype(str), model.predict(X32))


@pytest.mark.parametrize(
    "regressor",
    [Ridge(alpha=0.5), GradientBoostingRegressor(n_estimators=50, random_state=0)],
    ids=["ridge", "gradient_boosting"],
)
def test_regressors(diabetes: Any, regressor: Any) -> None:
    X, y, X_test = diabetes
    regressor.fit(X, y)
    converted = _convert(regressor)
    out = _run(converted, X_test)
    assert list(out) == ["variable"]
    assert out["variable"].shape == (len(X_test), 1)
    expected = regressor.predict(X_test.astype(np.float64))
    np.testing.assert_allclose(out["variable"][:, 0], expected, rtol=1e-5, atol=1e-3)
    ref = converted.reference({"input": X_test})  # type: ignore[misc]
    np.testing.assert_allclose(ref["variable"], out["variable"], rtol=1e-5, atol=1e-3)


def test_transformers_and_clusterers(digits: Any) -> None:
    X, _, X_test, _ = digits
    pca = Pipeline([("scaler", StandardScaler()), ("pca", PCA(8))]).fit(X)
    converted = _convert(pca)
    out = _run(converted, X_test)
    np.testing.assert_allclose(out["variable"], pca.transform(X_test.astype(np.float64)), atol=1e-4)
    ref = converted.reference({"input": X_test})  # type: ignore[misc]
    np.testing.assert_allclose(ref["variable"], out["variable"], atol=1e-4)

    kmeans = KMeans(5, n_init=1, random_state=0).fit(X)
    converted = _convert(kmeans)
    out = _run(converted, X_test)
    X64 = X_test.astype(np.float64)  # KMeans fitted on float64 rejects float32
    np.testing.assert_array_equal(out["label"], kmeans.predict(X64))
    np.testing.assert_allclose(out["scores"], kmeans.transform(X64), rtol=1e-5, atol=1e-3)
    ref = converted.reference({"input": X_test})  # type: ignore[misc]
    np.testing.assert_array_equal(ref["label"], out["label"])


def test_ferry_convert_verifies_a_forest_on_random_rows(digits: Any) -> None:
    """Through ferry.convert: random rows where a forest's votes tie are left out of the check
    (either label is right there); every other label must be equal."""
    X, y, _, _ = digits
    # With these 30 trees, 3 of the 64 random rows tie and ONNX Runtime picks the other label.
    forest = RandomForestClassifier(n_estimators=30, random_state=0).fit(X, y)
    result = ferry.convert(forest)
    assert result.converter == "sklearn"
    assert result.parity.passed, result.parity.summary()
    rows = result.parity.inputs["input"][0]
    assert 32 <= rows < 64
    assert any("tie" in note for note in result.notes)


# --- inputs ---------------------------------------------------------------------------------


def test_example_inputs_name_the_input_and_become_samples(
    digits: Any, scaler_logreg: Pipeline
) -> None:
    X, _, _, _ = digits
    converted = _convert(
        scaler_logreg, example_inputs={"pixels": X[:16]}, dynamic_axes={"pixels": {0: "n"}}
    )
    inp = converted.model.graph.inputs[0]
    assert (inp.name, str(inp.shape), inp.dtype.name) == ("pixels", "[n,64]", "FLOAT")
    assert converted.sample_inputs is not None
    sample = converted.sample_inputs["pixels"]
    assert sample.dtype == np.float32 and sample.shape == (16, 64)
    assert any("float32" in note for note in converted.notes)
    out = ferry.load(converted.model).run(converted.sample_inputs)
    np.testing.assert_array_equal(out["label"], scaler_logreg.predict(sample))


def test_input_shapes_and_opset(scaler_logreg: Pipeline) -> None:
    converted = _convert(scaler_logreg, input_shapes={"x": ("rows", 64)}, opset=15)
    inp = converted.model.graph.inputs[0]
    assert (inp.name, str(inp.shape)) == ("x", "[rows,64]")
    assert 13 <= converted.model.opset_imports[""] <= 15


def test_int64_example(digits: Any) -> None:
    X, y, X_test, _ = digits
    forest = RandomForestClassifier(n_estimators=10, random_state=0).fit(X, y)
    ints = X_test.astype(np.int64)  # the digits' pixels are small integers
    converted = _convert(forest, example_inputs=ints)
    assert converted.model.graph.inputs[0].dtype.name == "INT64"
    out = ferry.load(converted.model).run({"input": ints})
    np.testing.assert_array_equal(out["label"], forest.predict(ints))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"example_inputs": np.zeros((4, 10), np.float32)}, "10 features but .* fitted on 64"),
        ({"example_inputs": np.zeros(64, np.float32)}, "2-D array"),
        ({"example_inputs": {"a": np.zeros((1, 64)), "b": np.zeros((1, 64))}}, "one input X"),
        ({"input_shapes": {"input": ("batch", 3, 3)}}, r"\[batch, n_features\]"),
        ({"dynamic_axes": {"x": {0: "n"}}}, "dynamic_axes names input 'x'"),
    ],
)
def test_bad_inputs(scaler_logreg: Pipeline, options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        _convert(scaler_logreg, **options)


# --- pickles --------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["joblib", "pickle"])
def test_pickle_refused_without_trust_converted_with_it(
    tmp_path: Path, digits: Any, scaler_logreg: Pipeline, how: str
) -> None:
    _, _, X_test, _ = digits
    if how == "joblib":
        path = tmp_path / "model.joblib"
        joblib.dump(scaler_logreg, path)
    else:
        path = tmp_path / "model.pkl"
        path.write_bytes(pickle.dumps(scaler_logreg))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()

    with pytest.raises(InvalidInputError, match="arbitrary code.*--trust-pickle"):
        CONVERTER.convert(path, ConvertOptions())
    with pytest.raises(InvalidInputError, match="--trust-pickle"):
        ferry.convert(path)
    converted = CONVERTER.convert(path, ConvertOptions(trust_pickle=True))
    _assert_classifier_parity(converted, scaler_logreg, X_test)
    result = ferry.convert(path, trust_pickle=True)  # the registry picks sklearn by suffix
    assert result.converter == "sklearn" and result.parity.passed
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest  # never modified


def test_pickle_of_something_else(tmp_path: Path) -> None:
    path = tmp_path / "weights.pkl"
    path.write_bytes(pickle.dumps({"w": [1.0, 2.0]}))
    with pytest.raises(ModelLoadError, match="not a scikit-learn estimator"):
        CONVERTER.convert(path, ConvertOptions(trust_pickle=True))
    with pytest.raises(ModelLoadError, match="not found"):
        CONVERTER.convert(tmp_path / "missing.pkl", ConvertOptions(trust_pickle=True))
    (tmp_path / "bad.pkl").write_bytes(b"\x80\x04garbage")
    with pytest.raises(ModelLoadError, match="cannot unpickle"):
        CONVERTER.convert(tmp_path / "bad.pkl", ConvertOptions(trust_pickle=True))


# --- failures -------------------------------------------------------------------------------


def test_unsupported_steps_are_all_reported(digits: Any) -> None:
    X, y, _, _ = digits
    model = Pipeline(
        [
            ("clip", Clip()),
            ("features", FeatureUnion([("square", Square()), ("scaled", StandardScaler())])),
            (
                "columns",
                ColumnTransformer(
                    [("square", Square(), [0, 1, 2]), ("keep", "passthrough", [3, 4])],
                    remainder="drop",
                ),
            ),
            ("tree", DecisionTreeClassifier(max_depth=3)),
        ]
    ).fit(X, y)
    with pytest.raises(UnsupportedOpError) as info:
        _convert(model)
    assert info.value.ops == [
        ("Clip", "pipeline/clip"),
        ("Square", "pipeline/features/square"),
        ("Square", "pipeline/columns/square"),
    ]
    message = str(info.value)
    assert "Clip x1" in message and "Square x2" in message
    assert "Traceback" not in message


def test_unsupported_root() -> None:
    with pytest.raises(UnsupportedOpError) as info:
        _convert(Square().fit(np.ones((3, 2))))
    assert info.value.ops == [("Square", "square")]


def test_skl2onnx_failures_read_cleanly() -> None:
    """skl2onnx 1.20 cannot build HistGradientBoosting's trees as scikit-learn 1.9 stores them
    (onnx rejects the attributes and prints all of them); if a release fixes it, parity holds."""
    X, y = load_iris(return_X_y=True)
    model = HistGradientBoostingClassifier(max_iter=5).fit(X, y)
    try:
        converted = _convert(model)
    except ConversionError as e:
        message = str(e)
        assert "HistGradientBoostingClassifier" in message and "skl2onnx" in message
        assert len(message) < 400 and "\n" not in message
    else:
        _assert_classifier_parity(converted, model, X.astype(np.float32))


def test_unfitted_estimator() -> None:
    model = Pipeline([("scaler", StandardScaler()), ("logreg", LogisticRegression())])
    with pytest.raises(ConversionError, match=r"not fitted.*\.fit\(X, y\)"):
        _convert(model, input_shapes={"input": ("batch", 4)})
    with pytest.raises(ConversionError, match="RandomForestClassifier is not fitted"):
        _convert(RandomForestClassifier())


def test_not_an_estimator() -> None:
    with pytest.raises(ModelLoadError, match="not a scikit-learn estimator"):
        _convert(load_iris())  # a Bunch: defined in sklearn, but no model


# --- protocol -------------------------------------------------------------------------------


def test_accepts(scaler_logreg: Pipeline) -> None:
    assert CONVERTER.accepts(scaler_logreg)
    assert CONVERTER.accepts(RandomForestClassifier())  # unfitted: accepted, then refused
    assert CONVERTER.accepts(Square())  # a user's subclass of sklearn's bases
    assert not CONVERTER.accepts(load_iris())
    assert not CONVERTER.accepts(np.zeros(3))
    assert not CONVERTER.accepts("model.pkl")
    assert not CONVERTER.accepts(object())


def test_sniff(tmp_path: Path, scaler_logreg: Pipeline) -> None:
    joblib.dump(scaler_logreg, tmp_path / "a.joblib")
    (tmp_path / "a.pickle").write_bytes(pickle.dumps(scaler_logreg))
    (tmp_path / "model.bin").write_bytes(pickle.dumps(scaler_logreg))  # by content
    (tmp_path / "other.bin").write_bytes(pickle.dumps({"w": np.zeros(3)}))
    (tmp_path / "model.onnx").write_bytes(b"\x08\x08")
    for name in ("a.joblib", "a.pickle", "model.bin"):
        assert CONVERTER.sniff(tmp_path / name), name
    for name in ("other.bin", "model.onnx", "missing.pkl"):
        assert not CONVERTER.sniff(tmp_path / name), name
    assert not CONVERTER.sniff(tmp_path)
    assert (CONVERTER.name, CONVERTER.extra) == ("sklearn", "sklearn")
    assert CONVERTER.suffixes == (".pkl", ".pickle", ".joblib")


# --- DataFrames (pandas is optional) ----------------------------------------------------------


def test_dataframe_with_string_column_gives_per_column_inputs() -> None:
    pd = pytest.importorskip("pandas")
    from sklearn.preprocessing import OneHotEncoder

    iris = load_iris(as_frame=True)
    frame = iris.frame.drop(columns="target")
    frame.columns = ["sl", "sw", "pl", "pw"]
    frame["colour"] = np.random.default_rng(0).choice(["red", "green", "blue"], len(frame))
    y = iris.target.to_numpy()
    model = Pipeline(
        [
            (
                "prep",
                ColumnTransformer(
                    [
                        ("num", StandardScaler(), ["sl", "sw", "pl", "pw"]),
                        ("cat", OneHotEncoder(handle_unknown="ignore"), ["colour"]),
                    ]
                ),
            ),
            ("logreg", LogisticRegression(max_iter=1000)),
        ]
    ).fit(frame, y)
    converted = _convert(model, example_inputs=frame)
    inputs = [(v.name, str(v.shape), v.dtype.name) for v in converted.model.graph.inputs]
    assert inputs[0] == ("sl", "[batch,1]", "FLOAT")
    assert inputs[-1] == ("colour", "[batch,1]", "STRING")
    assert converted.sample_inputs is not None
    convert_onnx(converted.model.clone())
    out = ferry.load(converted.model).run(converted.sample_inputs)
    as_fed = pd.DataFrame(
        {c: converted.sample_inputs[c].ravel() for c in frame.columns}, columns=frame.columns
    )
    np.testing.assert_array_equal(out["label"], model.predict(as_fed))
    np.testing.assert_allclose(out["probabilities"], model.predict_proba(as_fed), atol=1e-5)
    ref = converted.reference(converted.sample_inputs)  # type: ignore[misc]
    np.testing.assert_array_equal(ref["label"], out["label"])
