"""The PaddlePaddle converter: inference models in both program formats, folders, Layers, failures.

Paddle and paddle2onnx live in a Python of their own (``scripts/setup-paddle.sh``), so the test
models are built there, by a script, and the outputs Paddle computed for them are saved beside
them: every converted model is run on ONNX Runtime and compared with those, independently of the
converter's own reference (which ``ferry.convert`` checks too).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import ferry
from ferry.converters import (
    PADDLE_PYTHON_ENV,
    ConvertOptions,
    PaddleConverter,
    find_paddle_python,
)
from ferry.converters._paddle_fixups import VectorOperandsPass
from ferry.converters._paddle_process import _exit_text
from ferry.errors import (
    BackendUnavailableError,
    ConversionError,
    InvalidInputError,
    ModelLoadError,
    UnsupportedOpError,
)

pytestmark = pytest.mark.paddle

ATOL, RTOL = 1e-5, 1e-4

# Runs in the Paddle Python: builds the models and records what Paddle computes for them.
_BUILD = r"""
import json
import sys
import warnings

warnings.filterwarnings("ignore")
import numpy as np
import paddle

out = sys.argv[1]
paddle.seed(0)
rng = np.random.default_rng(0)


class CNN(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.conv1 = paddle.nn.Conv2D(3, 8, 3, padding=1)
        self.bn1 = paddle.nn.BatchNorm2D(8)
        self.pool1 = paddle.nn.MaxPool2D(2)
        self.conv2 = paddle.nn.Conv2D(8, 16, 3, padding=1)
        self.bn2 = paddle.nn.BatchNorm2D(16)
        self.pool2 = paddle.nn.AvgPool2D(2)
        self.fc1 = paddle.nn.Linear(16 * 4 * 4, 32)
        self.fc2 = paddle.nn.Linear(32, 10)

    def forward(self, image):
        x = self.pool1(paddle.nn.functional.relu(self.bn1(self.conv1(image))))
        x = self.pool2(paddle.nn.functional.relu(self.bn2(self.conv2(x))))
        x = paddle.nn.functional.relu(self.fc1(paddle.flatten(x, 1)))
        return self.fc2(x)


class Upsample(paddle.nn.Layer):
    # Paddle 3.3 writes an interpolation's scale as a float64 list, which paddle2onnx 2.1 cannot
    # read ("the 0th elementwise MUST be ir::FloatAttribute") in either program format.
    def __init__(self):
        super().__init__()
        self.conv = paddle.nn.Conv2D(3, 4, 3, padding=1)

    def forward(self, image):
        x = self.conv(image)
        near = paddle.nn.functional.interpolate(x, scale_factor=2.0, mode="nearest")
        smooth = paddle.nn.functional.interpolate(x, scale_factor=[2.0, 2.0], mode="bilinear")
        return near + smooth


class Unsupported(paddle.nn.Layer):
    # Ops paddle2onnx 2.1 has no mapping for; each must be named in the error.
    def forward(self, x):
        spd = paddle.matmul(x, x, transpose_y=True) + paddle.eye(4)
        return paddle.linalg.cholesky(spd).sum() + paddle.linalg.det(x).sum()


net = CNN()
# Fresh BatchNorm statistics (mean 0, variance 1) would hide a train/inference mix-up.
for bn in (net.bn1, net.bn2):
    n = bn._mean.shape[0]
    bn._mean.set_value(rng.normal(0, 0.5, n).astype("float32"))
    bn._variance.set_value(rng.uniform(0.5, 2.0, n).astype("float32"))
    bn.weight.set_value(rng.uniform(0.5, 1.5, n).astype("float32"))
    bn.bias.set_value(rng.normal(0, 0.5, n).astype("float32"))
net.eval()
spec = [paddle.static.InputSpec([None, 3, 16, 16], "float32", "image")]
paddle.jit.save(net, out + "/pir/inference", input_spec=spec)
with paddle.pir_utils.DygraphOldIrGuard():
    paddle.jit.save(net, out + "/legacy/inference", input_spec=spec)
x = rng.standard_normal((3, 3, 16, 16)).astype("float32")
y = net(paddle.to_tensor(x)).numpy()
up = Upsample()
up.eval()
paddle.jit.save(up, out + "/upsample_pir/inference", input_spec=spec)
with paddle.pir_utils.DygraphOldIrGuard():
    paddle.jit.save(up, out + "/upsample_legacy/inference", input_spec=spec)
np.savez(out + "/expected.npz", x=x, y=y, up=up(paddle.to_tensor(x)).numpy())
# The output names paddle.inference gives each program, which the converted model keeps.
names = {}
for fmt, program in (("pir", "inference.json"), ("legacy", "inference.pdmodel")):
    folder = out + "/" + fmt + "/"
    config = paddle.inference.Config(folder + program, folder + "inference.pdiparams")
    config.disable_gpu()
    names[fmt] = paddle.inference.create_predictor(config).get_output_names()
with open(out + "/output_names.json", "w") as f:
    json.dump(names, f)
paddle.jit.save(
    Unsupported(), out + "/unsupported/inference",
    input_spec=[paddle.static.InputSpec([4, 4], "float32", "x")],
)
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test models, saved by Paddle: pir/, legacy/, upsample_pir/, upsample_legacy/,
    unsupported/, expected.npz, output_names.json."""
    python = find_paddle_python()
    if python is None:
        pytest.skip(
            "no Python with paddlepaddle and paddle2onnx: run scripts/setup-paddle.sh or set "
            f"{PADDLE_PYTHON_ENV}"
        )
    out = tmp_path_factory.mktemp("paddle-models")
    script = out / "build.py"
    script.write_text(_BUILD)
    env = dict(os.environ, GLOG_minloglevel="2")
    proc = subprocess.run(
        [str(python), str(script), str(out)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    # A Paddle Python was found, so failing to build with it is a failure, not a skip.
    assert proc.returncode == 0, f"{python} failed to build the test models:\n{proc.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def expected(models: Path) -> dict[str, np.ndarray]:
    with np.load(models / "expected.npz") as data:
        return {k: data[k] for k in data.files}


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


# --- conversions, checked against Paddle ------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "program"), [("pir", "inference.json"), ("legacy", "inference.pdmodel")]
)
def test_cnn_matches_paddle(
    models: Path, expected: dict[str, np.ndarray], fmt: str, program: str
) -> None:
    before = _digest(models / fmt)
    x, y = expected["x"], expected["y"]
    result = ferry.convert(models / fmt / program, example_inputs=(x,))

    assert result.converter == "paddle"
    assert result.parity.passed
    model = result.model
    (image,) = model.graph.inputs
    assert image.name == "image"
    # Outputs are named as paddle.inference names them (a legacy program's fetch variables).
    names = json.loads((models / "output_names.json").read_text())[fmt]
    assert [v.name for v in model.graph.outputs] == names
    assert image.shape is not None and str(image.shape[0]) == "batch"
    assert list(image.shape.dims[1:]) == [3, 16, 16]
    ops = {n.op_type for n in model.graph}
    assert {"Conv", "MaxPool", "AveragePool"} <= ops

    session = ferry.load(model)
    (got,) = session.run({"image": x}).values()
    np.testing.assert_allclose(got, y, atol=ATOL, rtol=RTOL)
    # The batch dim stays open: one image gives that image's row.
    (one,) = session.run({"image": x[:1]}).values()
    np.testing.assert_allclose(one, y[:1], atol=ATOL, rtol=RTOL)
    assert _digest(models / fmt) == before, "the converter changed the user's files"


@pytest.mark.parametrize("fmt", ["upsample_pir", "upsample_legacy"])
def test_interpolation_scales_paddle_writes_as_float64(
    models: Path, expected: dict[str, np.ndarray], fmt: str
) -> None:
    # paddle2onnx alone fails on both: "the 0th elementwise MUST be ir::FloatAttribute".
    result = ferry.convert(models / fmt, example_inputs=(expected["x"],))
    assert result.parity.passed
    assert sum(n.op_type == "Resize" for n in result.model.graph) == 2
    (got,) = ferry.load(result.model).run({"image": expected["x"]}).values()
    np.testing.assert_allclose(got, expected["up"], atol=ATOL, rtol=RTOL)


def test_folder_opset_shapes_and_reference(
    models: Path, expected: dict[str, np.ndarray], tmp_path: Path
) -> None:
    # A folder holding both formats of one model: the PIR program is the one converted.
    both = _copy(models / "pir", tmp_path / "both")
    for f in (models / "legacy").iterdir():
        shutil.copy(f, both / f.name)
    converter = PaddleConverter()
    assert converter.sniff(both)
    assert converter.sniff(both / "inference.pdiparams")
    converted = converter.convert(
        both, ConvertOptions(input_shapes={"image": ("n", 3, 16, 16)}, opset=13)
    )
    model = converted.model
    assert model.opset_imports[""] == 13
    assert str(model.graph.inputs[0].shape[0]) == "n"
    (got,) = ferry.load(model).run({"image": expected["x"]}).values()
    np.testing.assert_allclose(got, expected["y"], atol=ATOL, rtol=RTOL)

    # The converter's reference runs Paddle and names its outputs as the converted model's.
    assert converted.reference is not None
    want = converted.reference({"image": expected["x"]})
    assert isinstance(want, dict)
    assert list(want) == [v.name for v in model.graph.outputs]
    np.testing.assert_allclose(next(iter(want.values())), expected["y"], atol=ATOL, rtol=RTOL)


def test_layer_in_memory() -> None:
    """A live paddle.nn.Layer converts (in eval mode, its own mode restored) and matches Paddle.

    The check runs in a process of its own: Paddle's native libraries crash when loaded into a
    process that already holds torch's and TensorFlow's (as this test session does), which says
    nothing about ferry; a user converting a Layer has Paddle loaded, not those.
    """
    if importlib.util.find_spec("paddle") is None:
        pytest.skip("paddlepaddle is not installed in this environment (the 'paddle' extra)")
    if find_paddle_python() is None:
        pytest.skip("no Python with paddle2onnx: run scripts/setup-paddle.sh")
    script = Path(__file__).with_name("paddle_layer_check.py")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "layer ok" in done.stdout


# --- failures -------------------------------------------------------------------------------


def test_unsupported_ops_are_all_listed(models: Path) -> None:
    with pytest.raises(UnsupportedOpError) as info:
        PaddleConverter().convert(models / "unsupported", ConvertOptions())
    ops = {op for op, _ in info.value.ops}
    assert {"pd_op.cholesky", "pd_op.det"} <= ops
    assert "pd_op.cholesky" in str(info.value) and "pd_op.det" in str(info.value)


def test_a_paddle2onnx_failure_is_its_reason_alone(
    models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without ferry's rewrite of float64 scales paddle2onnx fails on this model the way it fails
    # on any exception of its core: it prints the reason with a timestamp, a traceback, and
    # calls sys.exit(-1) (status 255, which once read as "died with signal 127").
    from ferry.converters import _paddle_process

    source = re.sub(r"(?m)^F32_LISTS = .*$", "F32_LISTS = {}", _paddle_process._worker_source())
    assert source != _paddle_process._worker_source()
    monkeypatch.setattr(_paddle_process, "_worker_source", lambda: source)
    with pytest.raises(ConversionError) as info:
        PaddleConverter().convert(models / "upsample_pir", ConvertOptions())
    message = str(info.value)
    assert message.endswith(": (Unimplemented) the 0th elementwise MUST be ir::FloatAttribute")
    assert "\n" not in message and "signal" not in message and "[ERROR]" not in message


@pytest.mark.parametrize(
    ("damage", "fmt", "program"),
    [
        # paddle2onnx itself writes a model without those weights from a truncated file.
        ("truncated", "pir", "inference.json"),
        ("garbage", "legacy", "inference.pdmodel"),
        ("missing", "pir", "inference.json"),
        ("missing", "legacy", "inference.pdmodel"),
        ("program", "legacy", "inference.pdmodel"),
    ],
)
def test_damaged_files_are_a_load_error(
    models: Path, tmp_path: Path, damage: str, fmt: str, program: str
) -> None:
    folder = _copy(models / fmt, tmp_path / fmt)
    params = folder / "inference.pdiparams"
    if damage == "truncated":
        params.write_bytes(params.read_bytes()[: params.stat().st_size // 2])
    elif damage == "garbage":
        params.write_bytes(np.random.default_rng(0).bytes(params.stat().st_size))
    elif damage == "missing":
        params.unlink()
    else:
        (folder / program).write_bytes(np.random.default_rng(0).bytes(500))
    culprit = program if damage == "program" else "inference.pdiparams"
    with pytest.raises(ModelLoadError, match=culprit) as info:
        PaddleConverter().convert(folder / program, ConvertOptions())
    if damage == "missing":
        assert "missing" in str(info.value)


def test_shapes_that_contradict_the_program(models: Path) -> None:
    converter = PaddleConverter()
    with pytest.raises(InvalidInputError, match="fixes it at 3"):
        converter.convert(models / "pir", ConvertOptions(input_shapes={"image": (1, 4, 16, 16)}))
    with pytest.raises(InvalidInputError, match="'images'"):
        converter.convert(models / "pir", ConvertOptions(dynamic_axes={"images": {0: "n"}}))


# --- without Paddle -------------------------------------------------------------------------


def _const(name: str, value: Any, *, node: bool) -> tuple[list[Any], list[Any]]:
    """A weight as paddle2onnx writes it (a Constant node) or as an initializer."""
    tensor = numpy_helper.from_array(np.asarray(value, dtype=np.int64), name)
    if node:
        return [helper.make_node("Constant", [], [name], value=tensor, name=name)], []
    return [], [tensor]


def _graph_model(nodes: list[Any], inits: list[Any], x: list[int], y: list[int]) -> ir.Model:
    graph = helper.make_graph(
        nodes,
        "p2o",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y)],
        inits,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ir.from_proto(proto)


def _legacy_reshape(node: bool) -> tuple[ir.Model, Any]:
    # What paddle2onnx makes of a pre-2.5 `x.reshape([x.shape[0], 3, -1])`: the dim taken from
    # the shape squeezed to 0-D, the fill_constant pieces left as [1].
    nodes: list[Any] = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Slice", ["shape", "zero", "one", "zero"], ["dim1"], name="slice"),
        helper.make_node("Squeeze", ["dim1", "zero"], ["dim"], name="squeeze"),
        helper.make_node("Concat", ["dim", "three", "minus1"], ["target"], axis=0, name="cat"),
        helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape"),
    ]
    inits: list[Any] = []
    for name, value in (("zero", [0]), ("one", [1]), ("three", [3]), ("minus1", [-1])):
        n, i = _const(name, value, node=node)
        nodes, inits = n + nodes, inits + i
    return _graph_model(nodes, inits, [2, 6], [2, 3, 2]), lambda x: x.reshape(2, 3, -1)


def _scalar_operands(node: bool) -> tuple[ir.Model, Any]:
    # 0-D values where ONNX wants 1-D: Slice's starts/ends, Reshape's shape, Tile's repeats,
    # and a Concat of 0-D values only ("axis must be in [-rank, rank-1]").
    nodes: list[Any] = [
        helper.make_node("Slice", ["x", "two", "five", "axis0"], ["part"], name="slice"),
        helper.make_node("Concat", ["three_s", "one_s"], ["shape2"], axis=0, name="cat"),
        helper.make_node("Reshape", ["part", "shape2"], ["grid"], name="to_grid"),
        helper.make_node("Reshape", ["grid", "three_s"], ["flat"], name="to_flat"),
        helper.make_node("Tile", ["flat", "two"], ["y"], name="tile"),
    ]
    inits: list[Any] = []
    scalars = (("two", 2), ("five", 5), ("three_s", 3), ("one_s", 1), ("axis0", [0]))
    for name, value in scalars:
        n, i = _const(name, value, node=node)
        nodes, inits = n + nodes, inits + i
    return _graph_model(nodes, inits, [10], [6]), lambda x: np.tile(x[2:5], 2)


@pytest.mark.parametrize("node", [True, False], ids=["constant-nodes", "initializers"])
@pytest.mark.parametrize("build", [_legacy_reshape, _scalar_operands])
def test_scalars_given_where_onnx_wants_vectors(build: Any, node: bool) -> None:
    model, expect = build(node)
    with pytest.raises(ConversionError, match="rank"):
        ferry.converters.check_model(model)
    result = VectorOperandsPass()(model)
    assert result.modified
    ferry.converters.check_model(model)  # ONNX's checker, with strict shape inference
    x = np.arange(int(np.prod([d for d in model.graph.inputs[0].shape.dims])), dtype=np.float32)
    x = x.reshape(model.graph.inputs[0].shape.numpy())
    (got,) = ferry.load(model).run({"x": x}).values()
    np.testing.assert_array_equal(got, expect(x))


def test_vectors_and_higher_ranks_are_left_alone() -> None:
    # Well-formed 1-D pieces, and a Concat of matrices with a stray scalar (not this bug).
    a, b = helper.make_tensor_value_info, TensorProto.FLOAT
    graph = helper.make_graph(
        [
            helper.make_node("Shape", ["x"], ["shape"]),
            helper.make_node("Concat", ["shape", "minus1"], ["target"], axis=0),
            helper.make_node("Reshape", ["x", "target"], ["y"]),
            helper.make_node("Concat", ["x", "s"], ["bad"], axis=0),
        ],
        "g",
        [a("x", b, [2, 3]), a("s", b, [])],
        [a("y", b, None), a("bad", b, None)],
        [numpy_helper.from_array(np.array([-1], np.int64), "minus1")],
    )
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    before = onnx.printer.to_text(ir.to_proto(model))
    assert not VectorOperandsPass()(model).modified
    assert onnx.printer.to_text(ir.to_proto(model)) == before


def test_how_the_worker_ended_is_said_right() -> None:
    # subprocess gives -N for a signal; paddle2onnx's sys.exit(-1) is status 255, no signal.
    assert _exit_text(-6) == "the converter process was killed by SIGABRT"
    assert _exit_text(255) == "the converter process exited with status 255"


def test_sniff_and_accepts(tmp_path: Path) -> None:
    converter = PaddleConverter()
    pir = tmp_path / "inference.json"
    pir.write_text('{"base_code":{"magic":"pir","trainable":true,"version":4},"program":{}}')
    other = tmp_path / "config.json"
    other.write_text('{"name": "not a model"}')
    legacy = tmp_path / "net.pdmodel"
    legacy.write_bytes(b"\n\x95:")
    assert converter.sniff(pir)
    assert not converter.sniff(other)
    assert converter.sniff(legacy)
    assert converter.sniff(tmp_path)
    assert not converter.sniff(tmp_path / "absent.pdmodel")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert not converter.sniff(empty)
    assert not converter.accepts(np.zeros(3))
    assert not converter.accepts(object())
    with pytest.raises(ModelLoadError, match="several Paddle programs"):
        converter.convert(tmp_path, ConvertOptions())
    with pytest.raises(ModelLoadError, match="not a Paddle program"):
        converter.convert(other, ConvertOptions())
    with pytest.raises(ModelLoadError, match="no Paddle inference model"):
        converter.convert(empty, ConvertOptions())
    with pytest.raises(ConversionError, match="cannot convert a list"):
        converter.convert([1, 2], ConvertOptions())


def test_missing_toolchain_says_how_to_set_it_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    program = tmp_path / "inference.json"
    program.write_text('{"base_code":{"magic":"pir","version":4},"program":{}}')
    monkeypatch.setenv(PADDLE_PYTHON_ENV, str(tmp_path / "no-such-python"))
    with pytest.raises(BackendUnavailableError, match="setup-paddle.sh"):
        PaddleConverter().convert(program, ConvertOptions())
    # A Python without paddle: the worker reports it instead of a traceback.
    monkeypatch.setenv(PADDLE_PYTHON_ENV, sys.executable)
    if _has_no_paddle():
        with pytest.raises(BackendUnavailableError, match="cannot import paddle"):
            PaddleConverter().convert(program, ConvertOptions())


def _has_no_paddle() -> bool:
    import importlib.util

    return importlib.util.find_spec("paddle") is None
