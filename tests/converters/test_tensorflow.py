"""The TensorFlow/Keras converter: Keras models (in memory, .keras, .h5), SavedModels, tf.functions.

Every conversion is run on ONNX Runtime and compared with Keras/TensorFlow itself on the same
inputs, independently of the converter's own reference function (which is checked too).
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
import pytest

import ferry
from ferry.converters import ConvertOptions, TensorFlowConverter
from ferry.errors import InvalidInputError, ModelLoadError, UnsupportedOpError

pytestmark = pytest.mark.tensorflow

tf = pytest.importorskip("tensorflow")
pytest.importorskip("tf2onnx")
keras = pytest.importorskip("keras")

ATOL, RTOL = 1e-5, 1e-4


# --- models ----------------------------------------------------------------------------------


def _cnn() -> Any:
    """A small image classifier touching the layers whose layouts and modes matter: Conv2D with
    same and valid padding, BatchNorm with non-trivial statistics, pooling, Dense, softmax."""
    keras.utils.set_random_seed(0)
    image = keras.Input((16, 16, 3), name="image")
    x = keras.layers.Conv2D(8, 3, padding="same", name="conv_same")(image)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.MaxPooling2D(2)(x)
    x = keras.layers.Conv2D(12, 3, strides=2, padding="valid", activation="relu")(x)
    x = keras.layers.AveragePooling2D(2, padding="same")(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(16, activation="relu")(x)
    probs = keras.layers.Dense(10, activation="softmax", name="probs")(x)
    model = keras.Model(image, probs, name="cnn")
    # Fresh BatchNorm statistics (mean 0, variance 1) would hide a train/inference mix-up.
    bn = model.get_layer("bn")
    rng = np.random.default_rng(1)
    bn.set_weights(
        [
            rng.uniform(0.5, 1.5, 8).astype(np.float32),  # gamma
            rng.normal(0, 0.5, 8).astype(np.float32),  # beta
            rng.normal(0, 0.5, 8).astype(np.float32),  # moving mean
            rng.uniform(0.5, 2.0, 8).astype(np.float32),  # moving variance
        ]
    )
    return model


@pytest.fixture(scope="module")
def cnn() -> Any:
    return _cnn()


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return np.random.default_rng(2).standard_normal((3, 16, 16, 3)).astype(np.float32)


@pytest.fixture(scope="module")
def cnn_files(cnn: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("keras")
    paths = {
        "keras": folder / "cnn.keras",
        "h5": folder / "cnn.h5",
        "saved_model": folder / "saved_model",
    }
    cnn.save(paths["keras"])
    cnn.save(paths["h5"])  # legacy, still written by Keras 3 (with a warning)
    cnn.export(paths["saved_model"], verbose=False)
    return paths


def _keras_out(model: Any, *inputs: np.ndarray) -> np.ndarray:
    x = inputs[0] if len(inputs) == 1 else list(inputs)
    return np.asarray(model(x, training=False))


def _run(model: ir.Model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return ferry.load(model).run(feeds)


def _digest(path: Path) -> str:
    if path.is_dir():
        return "".join(_digest(p) for p in sorted(path.rglob("*")) if p.is_file())
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- Keras CNN from every source -------------------------------------------------------------


def test_keras_cnn_in_memory_matches_keras(cnn: Any, images: np.ndarray) -> None:
    converted = TensorFlowConverter().convert(cnn, ConvertOptions())
    graph = converted.model.graph
    (inp,) = graph.inputs
    (out,) = graph.outputs
    # TensorFlow's name (no ':0'), NHWC kept, the batch dim symbolic and called batch.
    assert inp.name == "image" and out.name == "probs"
    assert inp.shape == ir.Shape(["batch", 16, 16, 3]) and inp.dtype == ir.DataType.FLOAT
    assert converted.model.opset_imports[""] == 17
    ops = {node.op_type for node in graph}
    assert {"Conv", "MaxPool", "AveragePool", "Softmax"} <= ops and "Transpose" in ops

    want = _keras_out(cnn, images)
    got = _run(converted.model, {"image": images})["probs"]
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL)
    assert want.shape == (3, 10) and np.allclose(want.sum(axis=1), 1.0, atol=1e-5)
    # The batch dim really is dynamic.
    one = _run(converted.model, {"image": images[:1]})["probs"]
    np.testing.assert_allclose(one, want[:1], atol=ATOL, rtol=RTOL)
    # And the reference the parity check uses is Keras in inference mode.
    assert converted.reference is not None
    ref = converted.reference({"image": images})
    assert isinstance(ref, dict)
    np.testing.assert_allclose(ref["probs"], want, atol=1e-6, rtol=1e-6)


def test_ferry_convert_in_memory_keras_passes_parity(cnn: Any, images: np.ndarray) -> None:
    result = ferry.convert(cnn, example_inputs={"image": images})
    assert result.converter == "tensorflow"
    assert result.parity.passed, result.parity.summary()
    (out,) = result.parity.outputs
    assert out.name == "probs" and out.shape == (3, 10) and out.max_abs_error < 1e-5
    # Shape inference names the output's batch dim after the input's.
    assert result.model.graph.outputs[0].shape == ir.Shape(["batch", 10])


@pytest.mark.parametrize("kind", ["keras", "h5", "saved_model"])
def test_keras_cnn_files_match_keras(
    kind: str, cnn: Any, cnn_files: dict[str, Path], images: np.ndarray
) -> None:
    path = cnn_files[kind]
    before = _digest(path)
    assert TensorFlowConverter().sniff(path)
    result = ferry.convert(path)
    assert result.converter == "tensorflow" and result.parity.passed, result.parity.summary()
    (inp,) = result.model.graph.inputs
    assert inp.name == "image" and inp.shape == ir.Shape(["batch", 16, 16, 3])
    # A SavedModel's outputs are its signature's keys; Keras files keep the layer's name.
    (out,) = result.model.graph.outputs
    assert out.name == ("output_0" if kind == "saved_model" else "probs")
    got = _run(result.model, {"image": images})[out.name]
    np.testing.assert_allclose(got, _keras_out(cnn, images), atol=ATOL, rtol=RTOL)
    assert _digest(path) == before, "the source model was modified"


def test_keras_archive_with_another_suffix_is_read(
    cnn_files: dict[str, Path], tmp_path: Path, cnn: Any, images: np.ndarray
) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(cnn_files["keras"].read_bytes())
    converter = TensorFlowConverter()
    assert converter.sniff(path)
    converted = converter.convert(path, ConvertOptions())
    got = _run(converted.model, {"image": images})["probs"]
    np.testing.assert_allclose(got, _keras_out(cnn, images), atol=ATOL, rtol=RTOL)


# --- interface: names, orders, shapes, opsets ------------------------------------------------


def test_two_inputs_two_named_outputs_keep_names_and_order() -> None:
    keras.utils.set_random_seed(3)
    a = keras.Input((5,), name="features")
    b = keras.Input((4, 2), name="sequence")
    h = keras.layers.Concatenate()([a, keras.layers.Flatten()(b)])
    h = keras.layers.Dense(8, activation="tanh")(h)
    score = keras.layers.Dense(1, name="score")(h)
    label = keras.layers.Dense(3, activation="softmax", name="label")(h)
    model = keras.Model([a, b], [score, label])

    converted = TensorFlowConverter().convert(model, ConvertOptions())
    graph = converted.model.graph
    assert [v.name for v in graph.inputs] == ["features", "sequence"]
    assert [v.name for v in graph.outputs] == ["score", "label"]
    rng = np.random.default_rng(4)
    feeds = {
        "features": rng.standard_normal((2, 5)).astype(np.float32),
        "sequence": rng.standard_normal((2, 4, 2)).astype(np.float32),
    }
    got = _run(converted.model, feeds)
    want = model([feeds["features"], feeds["sequence"]], training=False)
    np.testing.assert_allclose(got["score"], np.asarray(want[0]), atol=ATOL, rtol=RTOL)
    np.testing.assert_allclose(got["label"], np.asarray(want[1]), atol=ATOL, rtol=RTOL)
    assert ferry.convert(model).parity.passed


def test_gelu_and_constant_holding_layers() -> None:
    # Keras' exact GELU computes erfc, which tf2onnx has no handler of (ferry adds one); a
    # Normalization layer captures its mean and variance as constants, which tf2onnx's
    # from_function would take for model inputs.
    keras.utils.set_random_seed(12)
    tokens = keras.Input((6, 8), name="tokens")
    x = keras.layers.Normalization(mean=0.25, variance=4.0)(tokens)
    x = keras.layers.Dense(16, activation="gelu")(x)
    x = keras.layers.LayerNormalization()(keras.layers.Dense(8)(x) + x[..., :8])
    model = keras.Model(tokens, x)
    converted = TensorFlowConverter().convert(model, ConvertOptions())
    assert [v.name for v in converted.model.graph.inputs] == ["tokens"]
    # Wide inputs reach both tails of erf.
    feeds = {"tokens": np.random.default_rng(13).normal(0, 8, (3, 6, 8)).astype(np.float32)}
    got = next(iter(_run(converted.model, feeds).values()))
    np.testing.assert_allclose(got, _keras_out(model, feeds["tokens"]), atol=ATOL, rtol=RTOL)


def test_input_shapes_fill_open_dims() -> None:
    keras.utils.set_random_seed(5)
    image = keras.Input((None, None, 3), name="image")
    x = keras.layers.Conv2D(4, 3, padding="same")(image)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(image, keras.layers.Dense(2)(x))
    converter = TensorFlowConverter()

    open_dims = converter.convert(model, ConvertOptions()).model.graph.inputs[0].shape
    assert open_dims == ir.Shape(["batch", "image_1", "image_2", 3])

    options = ConvertOptions(input_shapes={"image": ("n", 24, 20, 3)})
    converted = converter.convert(model, options)
    assert converted.model.graph.inputs[0].shape == ir.Shape(["n", 24, 20, 3])
    x_in = np.random.default_rng(6).standard_normal((2, 24, 20, 3)).astype(np.float32)
    got = _run(converted.model, {"image": x_in})
    np.testing.assert_allclose(
        next(iter(got.values())), _keras_out(model, x_in), atol=ATOL, rtol=RTOL
    )
    assert ferry.convert(model, input_shapes={"image": ("n", 24, 20, 3)}).parity.passed


def test_dynamic_axes_name_dims(cnn: Any, images: np.ndarray) -> None:
    options = ConvertOptions(dynamic_axes={"image": {0: "N"}})
    converted = TensorFlowConverter().convert(cnn, options)
    assert converted.model.graph.inputs[0].shape == ir.Shape(["N", 16, 16, 3])
    got = _run(converted.model, {"image": images})["probs"]
    np.testing.assert_allclose(got, _keras_out(cnn, images), atol=ATOL, rtol=RTOL)


def test_bad_shapes_and_names_are_input_errors(cnn: Any) -> None:
    converter = TensorFlowConverter()
    with pytest.raises(InvalidInputError, match=r"'nope'.*inputs are: image"):
        converter.convert(cnn, ConvertOptions(input_shapes={"nope": (1, 16, 16, 3)}))
    with pytest.raises(InvalidInputError, match="rank 3"):
        converter.convert(cnn, ConvertOptions(input_shapes={"image": (1, 16, 16)}))
    with pytest.raises(InvalidInputError, match="fixes it at 16"):
        converter.convert(cnn, ConvertOptions(input_shapes={"image": (1, 32, 32, 3)}))
    with pytest.raises(InvalidInputError, match="shape"):
        converter.convert(cnn, ConvertOptions(example_inputs=np.zeros((2, 8, 8, 3), np.float32)))


def test_opset_is_passed_to_tf2onnx(cnn: Any, images: np.ndarray) -> None:
    result = ferry.convert(cnn, opset=13)
    assert result.model.opset_imports[""] == 13 and result.parity.passed
    np.testing.assert_allclose(
        _run(result.model, {"image": images})["probs"],
        _keras_out(cnn, images),
        atol=ATOL,
        rtol=RTOL,
    )


def test_subclassed_model_takes_its_inputs_from_the_examples() -> None:
    class TwoLayers(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.hidden = keras.layers.Dense(6, activation="relu")
            self.out = keras.layers.Dense(2)

        def call(self, x: Any) -> Any:
            return self.out(self.hidden(x))

    keras.utils.set_random_seed(7)
    model = TwoLayers()
    x = np.random.default_rng(8).standard_normal((4, 3))  # float64: Keras computes in float32
    with pytest.raises(InvalidInputError, match="does not declare its inputs"):
        TensorFlowConverter().convert(model, ConvertOptions())
    converted = TensorFlowConverter().convert(model, ConvertOptions(example_inputs=x))
    (inp,) = converted.model.graph.inputs
    assert inp.shape == ir.Shape(["batch", 3]) and inp.dtype == ir.DataType.FLOAT
    assert (
        converted.sample_inputs is not None and converted.sample_inputs["input"].dtype == np.float32
    )
    got = _run(converted.model, converted.sample_inputs)["output"]
    np.testing.assert_allclose(got, _keras_out(model, x.astype(np.float32)), atol=ATOL, rtol=RTOL)
    assert ferry.convert(model, example_inputs=x).parity.passed


def test_legacy_tf_keras_model_and_its_h5(tmp_path: Path) -> None:
    """A Keras 2 model (tf_keras, what TF_USE_LEGACY_KERAS users have) in memory, and the .h5
    Keras 2 writes, read back by Keras 3. Keras 3 cannot stand in: the objects are tf_keras's
    own classes. (The kit's emotion_keras, a Keras 2.0.5 .h5, is the real tier's case.)"""
    tf_keras = pytest.importorskip(
        "tf_keras", reason="tf_keras (Keras 2) is not installed: pip install 'tf-keras>=2.20,<2.22'"
    )
    tf_keras.utils.set_random_seed(14)
    image = tf_keras.Input((12, 12, 3), name="img")
    x = tf_keras.layers.Conv2D(4, 3, padding="same")(image)
    x = tf_keras.layers.BatchNormalization()(x)
    x = tf_keras.layers.Flatten()(tf_keras.layers.MaxPooling2D()(x))
    model = tf_keras.Model(image, tf_keras.layers.Dense(5, activation="softmax", name="cls")(x))
    model.layers[2].set_weights([np.full(4, v, np.float32) for v in (1.5, 0.2, 0.3, 2.0)])
    model.save(tmp_path / "keras2.h5")
    x_in = np.random.default_rng(15).standard_normal((2, 12, 12, 3)).astype(np.float32)
    want = np.asarray(model(x_in, training=False))
    for source in (model, tmp_path / "keras2.h5"):  # the .h5 is read by Keras 3
        result = ferry.convert(source)
        assert result.parity.passed, source
        np.testing.assert_allclose(
            _run(result.model, {"img": x_in})["cls"], want, atol=ATOL, rtol=RTOL
        )


# --- TensorFlow functions and SavedModels ----------------------------------------------------


class _Scorer(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(9)
        self.w = tf.Variable(rng.standard_normal((4, 3)).astype(np.float32))
        self.b = tf.Variable(rng.standard_normal(3).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec((None, 4), tf.float32, name="feat")])
    def __call__(self, feat: Any) -> dict[str, Any]:
        logits = tf.matmul(feat, self.w) + self.b
        return {"logits": logits, "total": tf.reduce_sum(tf.nn.relu(logits), axis=1)}


def test_saved_model_of_a_tf_module(tmp_path: Path) -> None:
    module = _Scorer()
    tf.saved_model.save(module, str(tmp_path / "scorer"))
    feat = np.random.default_rng(10).standard_normal((5, 4)).astype(np.float32)
    result = ferry.convert(tmp_path / "scorer")
    assert result.parity.passed
    graph = result.model.graph
    assert [v.name for v in graph.inputs] == ["feat"]
    assert sorted(v.name for v in graph.outputs) == ["logits", "total"]
    got = _run(result.model, {"feat": feat})
    want = module(tf.constant(feat))
    for name in ("logits", "total"):
        np.testing.assert_allclose(got[name], np.asarray(want[name]), atol=ATOL, rtol=RTOL)


def test_tf_function_and_module_in_memory() -> None:
    module = _Scorer()
    feat = np.random.default_rng(11).standard_normal((2, 4)).astype(np.float32)
    want = module(tf.constant(feat))
    for source in (module, module.__call__, module.__call__.get_concrete_function()):
        converter = TensorFlowConverter()
        assert converter.accepts(source)
        converted = converter.convert(source, ConvertOptions())
        got = _run(converted.model, {"feat": feat})
        np.testing.assert_allclose(got["logits"], np.asarray(want["logits"]), atol=ATOL, rtol=RTOL)
        np.testing.assert_allclose(got["total"], np.asarray(want["total"]), atol=ATOL, rtol=RTOL)


def test_signature_is_chosen_by_name(tmp_path: Path) -> None:
    module = _Scorer()
    function = module.__call__.get_concrete_function()
    signatures = {"serving_default": function, "scores": function}
    tf.saved_model.save(module, str(tmp_path / "two"), signatures=signatures)
    feat = np.ones((1, 4), np.float32)
    converted = TensorFlowConverter(signature="scores").convert(tmp_path / "two", ConvertOptions())
    got = _run(converted.model, {"feat": feat})["logits"]
    np.testing.assert_allclose(got, np.asarray(module(feat)["logits"]), atol=ATOL, rtol=RTOL)
    with pytest.raises(
        ModelLoadError, match=r"no signature 'predict'.*\['scores', 'serving_default'\]"
    ):
        TensorFlowConverter(signature="predict").convert(tmp_path / "two", ConvertOptions())


# --- SavedModels TensorFlow 2 cannot restore: the TF1 loader ----------------------------------


def _tf2_cannot_restore(monkeypatch: pytest.MonkeyPatch) -> None:
    """tf.saved_model.load fails as it does on a Keras model saved by TF 2.4 (the kit's
    pitch_savedmodel): its saved objects no longer revive."""

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AttributeError("'_UserObject' object has no attribute 'add_slot'")

    monkeypatch.setattr(tf.saved_model, "load", fail)


class _Vocabulary(tf.Module):
    """Words -> ids (a hash table) -> embeddings (a variable read by ResourceGather)."""

    def __init__(self) -> None:
        super().__init__()
        keys, ids = tf.constant(["the", "cat", "sat"]), tf.constant([1, 2, 3], tf.int64)
        self.table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(keys, ids), default_value=0
        )
        self.embedding = tf.Variable(np.arange(8, dtype=np.float32).reshape(4, 2))

    @tf.function(input_signature=[tf.TensorSpec((None,), tf.string, name="words")])
    def __call__(self, words: Any) -> dict[str, Any]:
        return {"vectors": tf.gather(self.embedding, self.table.lookup(words))}


def test_saved_model_tf2_cannot_restore_is_read_as_a_tf1_graph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _Scorer()
    tf.saved_model.save(module, str(tmp_path / "scorer"))
    feat = np.random.default_rng(17).standard_normal((3, 4)).astype(np.float32)
    want = module(tf.constant(feat))
    _tf2_cannot_restore(monkeypatch)
    result = ferry.convert(tmp_path / "scorer", example_inputs={"feat": feat})
    assert result.parity.passed, result.parity.summary()
    assert any("TF1 loader" in note and "add_slot" in note for note in result.notes)
    graph = result.model.graph
    assert [v.name for v in graph.inputs] == ["feat"]
    assert [v.name for v in graph.outputs] == ["logits", "total"]
    assert graph.inputs[0].shape == ir.Shape(["batch", 4])
    got = _run(result.model, {"feat": feat})
    for name in ("logits", "total"):
        np.testing.assert_allclose(got[name], np.asarray(want[name]), atol=ATOL, rtol=RTOL)
    # input_shapes fix or name the signature's open dims, as for any SavedModel.
    fixed = TensorFlowConverter().convert(
        tmp_path / "scorer", ConvertOptions(input_shapes={"feat": ("rows", 4)})
    )
    assert fixed.model.graph.inputs[0].shape == ir.Shape(["rows", 4])
    assert fixed.reference is not None
    reference = fixed.reference({"feat": feat})
    assert isinstance(reference, dict)
    np.testing.assert_allclose(reference["logits"], np.asarray(want["logits"]), atol=ATOL)


def test_tf1_graph_with_a_table_and_gathered_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hash tables (exported from the session) and variables read inside the signature's
    function body by ResourceGather (frozen after inlining) convert too."""
    module = _Vocabulary()
    tf.saved_model.save(module, str(tmp_path / "vocab"))
    _tf2_cannot_restore(monkeypatch)
    words = np.array(["sat", "dog", "the"], dtype=object)
    result = ferry.convert(tmp_path / "vocab", example_inputs={"words": words})
    assert result.parity.passed, result.parity.summary()
    got = _run(result.model, {"words": np.array(["cat", "the", "?"], dtype=object)})
    np.testing.assert_array_equal(got["vectors"], [[4.0, 5.0], [2.0, 3.0], [0.0, 1.0]])


def test_saved_model_neither_loader_reads_is_one_clean_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tf.saved_model.save(_Scorer(), str(tmp_path / "scorer"))
    for item in (tmp_path / "scorer" / "variables").iterdir():
        item.unlink()  # the graph is there, the weights are not
    _tf2_cannot_restore(monkeypatch)
    with pytest.raises(ModelLoadError) as info:
        ferry.convert(tmp_path / "scorer")
    message = str(info.value)
    assert message.startswith(f"cannot load the SavedModel {tmp_path / 'scorer'}")
    assert "add_slot" in message and "nor with the TF1 loader" in message
    assert "\n" not in message and "Traceback" not in message


# --- unsupported ops and bad files -----------------------------------------------------------


def _special_functions_model() -> Any:
    class SpecialFunctions(keras.layers.Layer):
        # lgamma and digamma have no tf2onnx handler (and no ONNX op).
        def call(self, x: Any) -> Any:
            return tf.math.lgamma(x) + tf.math.digamma(x) + tf.math.lgamma(2.0 * x)

    x = keras.Input((4,), name="x")
    h = keras.layers.Dense(4, activation="softplus")(x)
    return keras.Model(x, keras.layers.Dense(2)(SpecialFunctions()(h)))


def test_unsupported_ops_are_all_listed() -> None:
    model = _special_functions_model()
    with pytest.raises(UnsupportedOpError) as info:
        TensorFlowConverter().convert(model, ConvertOptions())
    ops = sorted(op for op, _ in info.value.ops)
    assert ops == ["Digamma", "Lgamma", "Lgamma"], info.value.ops
    assert all(node for _, node in info.value.ops)
    message = str(info.value)
    assert "Lgamma x2" in message and "Digamma x1" in message and "3 TensorFlow node" in message
    # ferry.convert lets it through as it is.
    with pytest.raises(UnsupportedOpError, match="Lgamma x2"):
        ferry.convert(model)


def test_failed_tf2onnx_handlers_are_listed_with_the_reason() -> None:
    # tf2onnx has a MatrixBandPart handler, but at opset 10 it takes rank-2 inputs only.
    spec = tf.TensorSpec((2, 3, 3), tf.float32, name="x")
    bands = tf.function(
        lambda x: tf.linalg.band_part(x, -1, 0) + tf.linalg.band_part(2.0 * x, 0, -1),
        input_signature=[spec],
    )
    with pytest.raises(UnsupportedOpError, match="only rank 2.*higher opset") as info:
        TensorFlowConverter().convert(bands, ConvertOptions(opset=10))
    assert [op for op, _ in info.value.ops] == ["MatrixBandPart", "MatrixBandPart"]
    assert len({node for _, node in info.value.ops}) == 2
    # At the default opset it converts.
    converted = TensorFlowConverter().convert(bands, ConvertOptions())
    x = np.random.default_rng(16).standard_normal((2, 3, 3)).astype(np.float32)
    np.testing.assert_allclose(
        next(iter(_run(converted.model, {"x": x}).values())), np.asarray(bands(x)), atol=ATOL
    )


def test_unknown_custom_layer_is_named(tmp_path: Path) -> None:
    path = tmp_path / "special.keras"
    _special_functions_model().save(path)
    with pytest.raises(ModelLoadError, match="uses SpecialFunctions.*register_keras_serializable"):
        TensorFlowConverter().convert(path, ConvertOptions())


def test_corrupt_files_are_load_errors(tmp_path: Path, cnn_files: dict[str, Path]) -> None:
    converter = TensorFlowConverter()
    garbage = tmp_path / "garbage.keras"
    garbage.write_bytes(b"this is not a zip archive")
    truncated = tmp_path / "truncated.keras"
    truncated.write_bytes(cnn_files["keras"].read_bytes()[:300])
    bad_h5 = tmp_path / "bad.h5"
    bad_h5.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64)
    for path in (garbage, truncated, bad_h5):
        with pytest.raises(ModelLoadError, match=path.name):
            converter.convert(path, ConvertOptions())
    # A zip that is not a Keras archive.
    other = tmp_path / "other.keras"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("readme.txt", "hello")
    assert not converter.sniff(other)
    with pytest.raises(ModelLoadError, match="other.keras"):
        converter.convert(other, ConvertOptions())
    empty = tmp_path / "empty_folder"
    empty.mkdir()
    assert not converter.sniff(empty)
    with pytest.raises(ModelLoadError, match="saved_model.pb"):
        converter.convert(empty, ConvertOptions())
    broken = tmp_path / "broken_saved_model"
    broken.mkdir()
    (broken / "saved_model.pb").write_bytes(b"\x08\x01garbage")
    with pytest.raises(ModelLoadError, match="cannot load the SavedModel"):
        converter.convert(broken, ConvertOptions())


def test_lambda_layers_need_trust(tmp_path: Path) -> None:
    x = keras.Input((3,), name="x")
    model = keras.Model(x, keras.layers.Lambda(lambda t: t * 2.0 + 1.0)(x))
    path = tmp_path / "lambda.keras"
    model.save(path)
    with pytest.raises(ModelLoadError, match="trust"):
        ferry.convert(path)
    result = ferry.convert(path, trust_pickle=True)
    assert result.parity.passed
    got = _run(result.model, {"x": np.ones((1, 3), np.float32)})
    np.testing.assert_allclose(next(iter(got.values())), np.full((1, 3), 3.0, np.float32))


def test_sniff_and_accepts(cnn: Any, cnn_files: dict[str, Path], tmp_path: Path) -> None:
    converter = TensorFlowConverter()
    for path in cnn_files.values():
        assert converter.sniff(path)
    text = tmp_path / "model.h5"
    text.write_text("not hdf5")
    assert not converter.sniff(text)
    assert converter.accepts(cnn) and converter.accepts(_Scorer())
    rejected: list[object] = [np.zeros(3), "model.keras", tf.constant(1.0), tmp_path]
    for obj in rejected:
        assert not converter.accepts(obj), obj


def test_registry_picks_this_converter(cnn: Any, cnn_files: dict[str, Path]) -> None:
    from ferry.converters import resolve_converter

    for source in (cnn, *cnn_files.values()):
        converter, _ = resolve_converter(source)
        assert converter.name == "tensorflow", source
