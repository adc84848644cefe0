"""The TFLite writer (``ferry.tflite.write_tflite``).

Every committed fixture (written by TensorFlow's converter, ``tests/data/tflite``) is read,
written back and read again: the same model field by field, and, run in LiteRT, the same outputs
bit for bit. Models built here from the dataclasses alone run in LiteRT and give what numpy
computes. The file's structure (identifier, buffer 0, operator codes, op versions after
TensorFlow's ``op_version.cc``, signatures) and the writer's errors are checked directly. The kit's
``.tflite`` models are round-tripped in ``tests/real/test_tflite_writer_kit.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tflite", reason="the 'tflite' schema package is not installed")

from ferry.errors import InvalidInputError
from ferry.tflite import (
    TFLITE_INT4,
    TFLiteModel,
    TFLiteOperator,
    TFLiteQuant,
    TFLiteSignature,
    TFLiteSubgraph,
    TFLiteTensor,
    _writer,
    read_tflite,
    tflite_op_version,
    tflite_schema,
    write_tflite,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "tflite"
FIXTURES = sorted(p.stem for p in DATA.glob("*.tflite"))
#: Fixtures the stock LiteRT interpreter cannot run: a custom op (Erfc), a Flex (TF) op.
NOT_RUNNABLE = {"custom_op", "flex_op"}
#: int16x8's versions were set by TF's post-training quantizer, not by op_version.cc.
OWN_VERSIONS = {"int16x8"}

F32, F16, I32, U8, I64, BOOL, I16, I8 = 0, 1, 2, 3, 4, 6, 7, 9


@pytest.fixture(scope="module")
def litert() -> Any:
    return pytest.importorskip(
        "ai_edge_litert.interpreter", reason="ai-edge-litert (LiteRT) is not installed"
    )


# ------------------------------------------------------------------------------------ helpers


def assert_same(a: Any, b: Any, where: str = "model") -> None:
    """Dataclasses, arrays, containers and scalars equal, naming the first difference."""
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), where
        for field in dataclasses.fields(a):
            assert_same(getattr(a, field.name), getattr(b, field.name), f"{where}.{field.name}")
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), where
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{a.shape}"
        assert np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"), where
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), f"{where}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{where}: {list(a)} != {list(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    else:
        assert a == b or (a != a and b != b), f"{where}: {a!r} != {b!r}"


def round_trip(model: TFLiteModel) -> TFLiteModel:
    return read_tflite(write_tflite(model), "written")


def tensor(index: int, name: str, shape: Sequence[int], type: int = F32, **kw: Any) -> TFLiteTensor:
    return TFLiteTensor(index=index, name=name, type=type, shape=tuple(shape), **kw)


def single(
    tensors: list[TFLiteTensor],
    ops: list[TFLiteOperator],
    inputs: Sequence[int],
    outputs: Sequence[int],
    **kw: Any,
) -> TFLiteModel:
    graph = TFLiteSubgraph(0, "main", tensors, tuple(inputs), tuple(outputs), ops)
    return TFLiteModel(subgraphs=[graph], **kw)


def quant(scale: Any, zero: Any = 0, axis: int = 0) -> TFLiteQuant:
    scale = np.atleast_1d(np.asarray(scale, np.float32))
    zero = np.broadcast_to(np.asarray(zero, np.int64), scale.shape).copy()
    return TFLiteQuant(scale=scale, zero_point=zero, axis=axis)


def interpreter(litert: Any, content: bytes) -> Any:
    it = litert.Interpreter(model_content=content)
    it.allocate_tensors()
    return it


def invoke(litert: Any, content: bytes, calls: Sequence[Sequence[np.ndarray]]) -> list[list[Any]]:
    """Outputs of one interpreter called with each list of inputs in turn (state carries)."""
    it = interpreter(litert, content)
    results = []
    for feeds in calls:
        for detail, value in zip(it.get_input_details(), feeds):
            it.set_tensor(detail["index"], value)
        it.invoke()
        results.append([np.array(it.get_tensor(d["index"])) for d in it.get_output_details()])
    return results


def inputs_for(it: Any, rng: np.random.Generator) -> list[np.ndarray]:
    """Inputs matching an interpreter's: normal floats, small non-negative integers (indices
    and segment ids stay in range), random booleans."""
    made = []
    for detail in it.get_input_details():
        shape, dtype = [d if d > 0 else 2 for d in detail["shape"]], detail["dtype"]
        if np.issubdtype(dtype, np.floating):
            made.append(rng.standard_normal(shape).astype(dtype))
        elif dtype == np.bool_:
            made.append(rng.integers(0, 2, shape).astype(bool))
        else:
            made.append(rng.integers(0, 2, shape).astype(dtype))
    return made


def tables(content: bytes) -> Any:
    """The written file through the generated reader (structure checks)."""
    return tflite_schema().module.Model.GetRootAs(content, 0)


# ------------------------------------------------------------------ fixtures written by TF


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_reads_back_the_same(name: str) -> None:
    """read -> write -> read gives the model read, field by field (tensors, constants,
    quantization, sparsity, operators, options and their tables, subgraphs, signatures,
    metadata); a file without signatures gains ``serving_default``."""
    model = read_tflite((DATA / f"{name}.tflite").read_bytes(), name)
    again = round_trip(model)
    if not model.signatures:
        (sig,) = again.signatures
        main = model.subgraphs[0]
        assert (sig.key, sig.subgraph) == ("serving_default", 0)
        assert list(sig.inputs.values()) == list(main.inputs)
        assert list(sig.outputs.values()) == list(main.outputs)
        assert list(sig.inputs) == [main.tensors[t].name for t in main.inputs]
        again.signatures = []
    assert_same(model, again)


@pytest.mark.tflite
@pytest.mark.parametrize("name", [f for f in FIXTURES if f not in NOT_RUNNABLE])
def test_fixture_runs_the_same_in_litert(name: str, litert: Any) -> None:
    """The written file computes what TF's file computes, bit for bit, over three calls on one
    interpreter (streaming.tflite keeps state in variables between calls)."""
    original = (DATA / f"{name}.tflite").read_bytes()
    written = write_tflite(read_tflite(original, name))
    rng = np.random.default_rng(7)
    calls = [inputs_for(interpreter(litert, original), rng) for _ in range(3)]
    want = invoke(litert, original, calls)
    got = invoke(litert, written, calls)
    for step, (w, g) in enumerate(zip(want, got)):
        assert len(w) == len(g)
        for k, (a, b) in enumerate(zip(w, g)):
            assert a.dtype == b.dtype and a.shape == b.shape, (step, k)
            assert np.array_equal(a, b, equal_nan=True), f"call {step}, output {k}"


def test_writing_is_deterministic() -> None:
    """Writing what was written gives the same bytes."""
    model = read_tflite((DATA / "mobilenet_int8.tflite").read_bytes(), "m")
    first = write_tflite(model)
    assert write_tflite(read_tflite(first, "w")) == first
    assert write_tflite(model) == first


@pytest.mark.parametrize("name", [f for f in FIXTURES if f not in OWN_VERSIONS])
def test_versions_are_the_converters(name: str) -> None:
    """With every version cleared, the writer gives each op the version TF's converter gave it.
    TF keeps one version per builtin op (the highest its instances need), so that is compared."""
    model = read_tflite((DATA / f"{name}.tflite").read_bytes(), name)
    theirs: dict[str, set[int]] = {}
    for graph in model.subgraphs:
        for op in graph.operators:
            theirs.setdefault(op.display_name, set()).add(op.version)
            op.version = 0
    ours: dict[str, int] = {}
    for graph in round_trip(model).subgraphs:
        for op in graph.operators:
            ours[op.display_name] = max(ours.get(op.display_name, 0), op.version)
    assert {k: {v} for k, v in ours.items()} == theirs


# ------------------------------------------------------------------------------- structure


def conv_relu_model(
    options: dict[str, Any] | None = None,
) -> tuple[TFLiteModel, np.ndarray, np.ndarray]:
    """x [1, 8, 8, 3] -> CONV_2D 3x3 SAME (4 filters, bias) -> RELU -> y [1, 8, 8, 4]."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    tensors = [
        tensor(0, "x", (1, 8, 8, 3)),
        tensor(1, "w", w.shape, data=w),
        tensor(2, "b", b.shape, data=b),
        tensor(3, "conv", (1, 8, 8, 4)),
        tensor(4, "y", (1, 8, 8, 4)),
    ]
    opts = options or {"padding": "SAME", "stride_h": 1, "stride_w": 1}
    ops = [
        TFLiteOperator(0, "CONV_2D", inputs=(0, 1, 2), outputs=(3,), options=opts),
        TFLiteOperator(1, "RELU", inputs=(3,), outputs=(4,)),
    ]
    return single(tensors, ops, [0], [4]), w, b


def test_structure() -> None:
    """TFL3 at bytes 4..8, schema version 3, buffer 0 empty, constants 16-byte aligned and
    activations in buffer 0, both builtin codes set."""
    model, w, _ = conv_relu_model()
    content = write_tflite(model)
    assert content[4:8] == b"TFL3"
    root = tables(content)
    assert root.Version() == 3
    assert root.Buffers(0).DataLength() == 0
    graph = root.Subgraphs(0)
    for i in range(graph.TensorsLength()):
        t = graph.Tensors(i)
        data = root.Buffers(t.Buffer())
        if model.subgraphs[0].tensors[i].data is None:
            assert t.Buffer() == 0
        else:
            assert data.DataLength() == model.subgraphs[0].tensors[i].data.nbytes
            start = data._tab.Vector(data._tab.Offset(4))  # where the bytes lie in the file
            assert start % 16 == 0
    assert bytes(root.Buffers(graph.Tensors(1).Buffer()).DataAsNumpy()) == w.tobytes()
    codes = [root.OperatorCodes(i) for i in range(root.OperatorCodesLength())]
    assert [(c.BuiltinCode(), c.DeprecatedBuiltinCode(), c.Version()) for c in codes] == [
        (3, 3, 1),  # CONV_2D
        (19, 19, 1),  # RELU
    ]


def test_operator_codes_are_shared_and_codes_past_127_use_the_placeholder() -> None:
    """One operator code per (builtin, custom code, version); GELU (150) keeps 127 in the
    byte-sized deprecated field, as TFLite writes codes past 127."""
    tensors = [tensor(i, f"t{i}", (2, 3)) for i in range(5)]
    ops = [
        TFLiteOperator(0, "GELU", inputs=(0,), outputs=(1,)),
        TFLiteOperator(1, "GELU", inputs=(1,), outputs=(2,)),
        TFLiteOperator(2, "TANH", inputs=(2,), outputs=(3,)),
        TFLiteOperator(3, "GELU", inputs=(3,), outputs=(4,), version=2),
    ]
    root = tables(write_tflite(single(tensors, ops, [0], [4])))
    codes = [root.OperatorCodes(i) for i in range(root.OperatorCodesLength())]
    assert [(c.BuiltinCode(), c.DeprecatedBuiltinCode(), c.Version()) for c in codes] == [
        (150, 127, 1),
        (28, 28, 1),
        (150, 127, 2),
    ]
    graph = root.Subgraphs(0)
    assert [graph.Operators(i).OpcodeIndex() for i in range(4)] == [0, 0, 1, 2]


def test_identical_constants_share_a_buffer() -> None:
    same = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensors = [
        tensor(0, "x", (2, 3)),
        tensor(1, "a", (2, 3), data=same),
        tensor(2, "b", (2, 3), data=same.copy()),
        tensor(3, "c", (2, 3), data=same + 1),
        tensor(4, "y1", (2, 3)),
        tensor(5, "y2", (2, 3)),
        tensor(6, "y3", (2, 3)),
    ]
    ops = [
        TFLiteOperator(0, "ADD", inputs=(0, 1), outputs=(4,)),
        TFLiteOperator(1, "ADD", inputs=(4, 2), outputs=(5,)),
        TFLiteOperator(2, "ADD", inputs=(5, 3), outputs=(6,)),
    ]
    root = tables(write_tflite(single(tensors, ops, [0], [6])))
    graph = root.Subgraphs(0)
    buffers = [graph.Tensors(i).Buffer() for i in range(1, 4)]
    assert buffers[0] == buffers[1] != buffers[2]
    assert root.BuffersLength() == 3  # the sentinel and two constants


def test_metadata_description_and_the_model_are_kept() -> None:
    model, _, _ = conv_relu_model()
    model.description = "made by ferry"
    model.metadata = {"min_runtime_version": b"1.14.0\0\0", "note": b"\x00\x01"}
    again = round_trip(model)
    assert again.description == "made by ferry"
    assert again.metadata == model.metadata
    # Writing computed versions into the file, not into the caller's model.
    assert [op.version for op in model.subgraphs[0].operators] == [0, 0]
    assert [op.version for op in again.subgraphs[0].operators] == [1, 1]


# ---------------------------------------------------------------------------- op versions


def _op_model(
    opcode: str,
    inputs: list[TFLiteTensor],
    outputs: list[TFLiteTensor],
    options: dict[str, Any] | None = None,
    omitted: Sequence[int] = (),
) -> tuple[TFLiteOperator, list[TFLiteTensor]]:
    tensors = [dataclasses.replace(t, index=i) for i, t in enumerate([*inputs, *outputs])]
    ins = tuple(-1 if k in omitted else k for k in range(len(inputs)))
    outs = tuple(range(len(inputs), len(tensors)))
    return TFLiteOperator(0, opcode, inputs=ins, outputs=outs, options=options or {}), tensors


def _t(
    shape: Sequence[int], type: int = F32, q: TFLiteQuant | None = None, const: bool = False
) -> TFLiteTensor:
    data = np.zeros(shape, _writer.TFLITE_DTYPES[type]) if const else None
    return tensor(0, "t", shape, type, quant=q, data=data)


PER_CHANNEL = quant(np.full(8, 0.1), 0, axis=0)
VERSION_CASES = {
    "float conv": (
        "CONV_2D",
        [_t((1, 8, 8, 3)), _t((8, 3, 3, 3)), _t((8,))],
        [_t((1, 8, 8, 8))],
        {},
        1,
    ),
    "int8 per-channel conv": (
        "CONV_2D",
        [
            _t((1, 8, 8, 3), I8, quant(0.1)),
            _t((8, 3, 3, 3), I8, PER_CHANNEL, True),
            _t((8,), I32, quant(np.full(8, 0.01)), True),
        ],
        [_t((1, 8, 8, 8), I8, quant(0.2))],
        {},
        3,
    ),
    "hybrid per-channel conv": (
        "CONV_2D",
        [_t((1, 8, 8, 3)), _t((8, 3, 3, 3), I8, PER_CHANNEL, True), _t((8,))],
        [_t((1, 8, 8, 8))],
        {},
        5,
    ),
    "hybrid per-tensor conv": (
        "CONV_2D",
        [_t((1, 8, 8, 3)), _t((8, 3, 3, 3), I8, quant(0.1), True), _t((8,))],
        [_t((1, 8, 8, 8))],
        {},
        2,
    ),
    "grouped conv": (
        "CONV_2D",
        [_t((1, 8, 8, 4)), _t((8, 3, 3, 2)), _t((8,))],
        [_t((1, 8, 8, 8))],
        {},
        6,
    ),
    "dilated depthwise": (
        "DEPTHWISE_CONV_2D",
        [_t((1, 8, 8, 3)), _t((1, 3, 3, 3)), _t((3,))],
        [_t((1, 8, 8, 3))],
        {"dilation_h_factor": 2},
        2,
    ),
    "fully connected without bias": (
        "FULLY_CONNECTED",
        [_t((1, 4)), _t((3, 4))],
        [_t((1, 3))],
        {},
        6,
    ),
    "int8 fully connected": (
        "FULLY_CONNECTED",
        [_t((1, 4), I8, quant(0.1)), _t((3, 4), I8, quant(0.1)), _t((3,), I32)],
        [_t((1, 3), I8, quant(0.1))],
        {},
        4,
    ),
    "keep_num_dims": (
        "FULLY_CONNECTED",
        [_t((1, 2, 4)), _t((3, 4)), _t((3,))],
        [_t((1, 2, 3))],
        {"keep_num_dims": True},
        5,
    ),
    "int8 add": (
        "ADD",
        [_t((2,), I8, quant(0.1)), _t((2,), I8, quant(0.1))],
        [_t((2,), I8, quant(0.1))],
        {},
        2,
    ),
    "int16 add, not quantized": ("ADD", [_t((2,), I16), _t((2,), I16)], [_t((2,), I16)], {}, 5),
    "int64 sub": ("SUB", [_t((2,), I64), _t((2,), I64)], [_t((2,), I64)], {}, 4),
    "int8 mul rescaling up": (
        "MUL",
        [_t((2,), I8, quant(1.0)), _t((2,), I8, quant(1.0))],
        [_t((2,), I8, quant(0.5))],
        {},
        3,
    ),
    "float16 dequantize": ("DEQUANTIZE", [_t((4,), F16, None, True)], [_t((4,))], {}, 3),
    "per-channel int8 dequantize": (
        "DEQUANTIZE",
        [_t((8, 2), I8, PER_CHANNEL, True)],
        [_t((8, 2))],
        {},
        5,
    ),
    "int4 dequantize": ("DEQUANTIZE", [_t((4,), TFLITE_INT4, quant(0.1), True)], [_t((4,))], {}, 6),
    "int16 quantize": ("QUANTIZE", [_t((4,))], [_t((4,), I16, quant(0.1))], {}, 2),
    "5-D transpose": (
        "TRANSPOSE",
        [_t((1, 2, 3, 4, 5)), _t((5,), I32)],
        [_t((5, 4, 3, 2, 1))],
        {},
        4,
    ),
    "half-pixel resize": (
        "RESIZE_BILINEAR",
        [_t((1, 4, 4, 1)), _t((2,), I32)],
        [_t((1, 8, 8, 1))],
        {"half_pixel_centers": True},
        3,
    ),
    "int8 mean": (
        "MEAN",
        [_t((1, 4, 4, 2), I8, quant(0.1)), _t((2,), I32)],
        [_t((1, 2), I8, quant(0.1))],
        {},
        2,
    ),
    "int16 softmax": (
        "SOFTMAX",
        [_t((1, 4), I16, quant(0.1))],
        [_t((1, 4), I16, quant(0.1))],
        {},
        3,
    ),
    "int8 split (axis first)": (
        "SPLIT",
        [_t((), I32), _t((4, 2), I8, quant(0.1))],
        [_t((2, 2), I8, quant(0.1))],
        {},
        2,
    ),
    "strided slice with new axis": (
        "STRIDED_SLICE",
        [_t((4,)), _t((1,), I32), _t((1,), I32), _t((1,), I32)],
        [_t((1, 4))],
        {"new_axis_mask": 1},
        6,
    ),
    "float16 cast": ("CAST", [_t((4,))], [_t((4,), F16)], {}, 5),
    "bool gather": ("GATHER", [_t((4,), BOOL), _t((2,), I32)], [_t((2,), BOOL)], {}, 3),
    "transpose conv with bias": (
        "TRANSPOSE_CONV",
        [_t((4,), I32), _t((2, 3, 3, 2)), _t((1, 4, 4, 2)), _t((2,))],
        [_t((1, 8, 8, 2))],
        {},
        3,
    ),
    "transpose conv, bias omitted": (
        "TRANSPOSE_CONV",
        [_t((4,), I32), _t((2, 3, 3, 2)), _t((1, 4, 4, 2)), _t((2,))],
        [_t((1, 8, 8, 2))],
        {"omitted": (3,)},
        1,
    ),
    "hybrid sequence lstm": (
        "UNIDIRECTIONAL_SEQUENCE_LSTM",
        [_t((1, 2, 3)), _t((4, 3)), _t((4, 3), I8, quant(0.1), True)],
        [_t((1, 2, 4))],
        {},
        2,
    ),
    "relu6 given by name": (
        "TRANSPOSE_CONV",
        [_t((4,), I32), _t((2, 3, 3, 2)), _t((1, 4, 4, 2))],
        [_t((1, 8, 8, 2))],
        {"fused_activation_function": "RELU6"},
        4,
    ),
    "no activation given by name": (
        "TRANSPOSE_CONV",
        [_t((4,), I32), _t((2, 3, 3, 2)), _t((1, 4, 4, 2))],
        [_t((1, 8, 8, 2))],
        {"fused_activation_function": "NONE"},
        1,
    ),
    "op the table does not list": (
        "HARD_SWISH",
        [_t((4,), I8, quant(0.1))],
        [_t((4,), I8, quant(0.1))],
        {},
        1,
    ),
}


@pytest.mark.parametrize("case", list(VERSION_CASES))
def test_version_follows_op_version_cc(case: str) -> None:
    opcode, inputs, outputs, options, want = VERSION_CASES[case]
    options = dict(options)
    omitted = options.pop("omitted", ())
    op, tensors = _op_model(opcode, inputs, outputs, options, omitted)
    assert tflite_op_version(op, tensors) == want
    if case == "op the table does not list":
        return
    # What the writer puts in the file.
    graph = TFLiteSubgraph(
        0,
        "g",
        tensors,
        tuple(t for t in op.inputs if t >= 0 and tensors[t].data is None),
        op.outputs,
        [op],
    )
    (written,) = round_trip(TFLiteModel(subgraphs=[graph])).subgraphs[0].operators
    assert written.version == want


def test_explicit_versions_are_kept_and_custom_ops_are_1() -> None:
    tensors = [tensor(0, "x", (2,)), tensor(1, "y", (2,)), tensor(2, "z", (2,))]
    ops = [
        TFLiteOperator(0, "TANH", inputs=(0,), outputs=(1,), version=3),
        TFLiteOperator(
            1, "CUSTOM", custom_code="MyOp", inputs=(1,), outputs=(2,), custom_options=b"\x01\x02"
        ),
    ]
    (graph,) = round_trip(single(tensors, ops, [0], [2])).subgraphs
    assert [(op.display_name, op.version) for op in graph.operators] == [
        ("TANH", 3),
        ("CUSTOM(MyOp)", 1),
    ]
    assert graph.operators[1].custom_options == b"\x01\x02"


# --------------------------------------------------------------- models built from scratch


def _conv_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """NHWC x, OHWI w, stride 1, SAME padding."""
    kh, kw = w.shape[1:3]
    padded = np.pad(x, ((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2), (0, 0)))
    height, width = x.shape[1:3]
    out = np.zeros((*x.shape[:3], w.shape[0]), np.float64)
    for i in range(kh):
        for j in range(kw):
            patch = padded[:, i : i + height, j : j + width, :].astype(np.float64)
            out += np.einsum("nhwc,oc->nhwo", patch, w[:, i, j, :].astype(np.float64))
    return out + b


@pytest.mark.tflite
def test_conv_relu_built_from_scratch_runs(litert: Any) -> None:
    model, w, b = conv_relu_model()
    content = write_tflite(model)
    x = np.random.default_rng(2).standard_normal((1, 8, 8, 3)).astype(np.float32)
    (got,) = invoke(litert, content, [[x]])[0]
    want = np.maximum(_conv_reference(x, w, b), 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert (got == 0).any() and (got > 0).any()  # the RELU did something


@pytest.mark.tflite
def test_fully_connected_built_from_scratch_runs(litert: Any) -> None:
    """Also: weights given as a transposed (non-contiguous) view, a big-endian bias."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((5, 3)).astype(np.float32).T
    b = rng.standard_normal(3).astype(">f4")
    assert not w.flags.c_contiguous
    tensors = [
        tensor(0, "x", (2, 5)),
        tensor(1, "w", (3, 5), data=w),
        tensor(2, "b", (3,), data=b),
        tensor(3, "y", (2, 3)),
    ]
    ops = [
        TFLiteOperator(
            0,
            "FULLY_CONNECTED",
            inputs=(0, 1, 2),
            outputs=(3,),
            options={"fused_activation_function": "RELU6"},
        )
    ]
    x = rng.standard_normal((2, 5)).astype(np.float32)
    (got,) = invoke(litert, write_tflite(single(tensors, ops, [0], [3])), [[x]])[0]
    np.testing.assert_allclose(got, np.clip(x @ w.T + b, 0, 6), rtol=1e-5, atol=1e-6)


@pytest.mark.tflite
def test_add_with_broadcast_built_from_scratch_runs(litert: Any) -> None:
    """[2, 1, 3] + [1, 4, 1] from two inputs, then + a constant [3]."""
    rng = np.random.default_rng(4)
    c = rng.standard_normal(3).astype(np.float32)
    tensors = [
        tensor(0, "a", (2, 1, 3)),
        tensor(1, "b", (1, 4, 1)),
        tensor(2, "c", (3,), data=c),
        tensor(3, "ab", (2, 4, 3)),
        tensor(4, "y", (2, 4, 3)),
    ]
    ops = [
        TFLiteOperator(0, "ADD", inputs=(0, 1), outputs=(3,)),
        TFLiteOperator(1, "ADD", inputs=(3, 2), outputs=(4,)),
    ]
    a = rng.standard_normal((2, 1, 3)).astype(np.float32)
    b = rng.standard_normal((1, 4, 1)).astype(np.float32)
    (got,) = invoke(litert, write_tflite(single(tensors, ops, [0, 1], [4])), [[a, b]])[0]
    np.testing.assert_array_equal(got, (a + b) + c)


@pytest.mark.tflite
def test_int8_per_channel_conv_runs(litert: Any) -> None:
    """A fully int8 CONV_2D with per-channel weights: version 3, and LiteRT computes what the
    quantization says (within one step of rounding)."""
    rng = np.random.default_rng(5)
    w_scale = rng.uniform(0.01, 0.05, 4).astype(np.float32)
    w = rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    x_scale, x_zero, y_scale, y_zero = 0.05, -3, 0.1, 2
    bias = rng.integers(-500, 500, 4).astype(np.int32)
    tensors = [
        tensor(0, "x", (1, 6, 6, 3), I8, quant=quant(x_scale, x_zero)),
        tensor(1, "w", w.shape, I8, data=w, quant=quant(w_scale, 0, axis=0)),
        tensor(2, "b", (4,), I32, data=bias, quant=quant(x_scale * w_scale, 0)),
        tensor(3, "y", (1, 6, 6, 4), I8, quant=quant(y_scale, y_zero)),
    ]
    ops = [
        TFLiteOperator(
            0,
            "CONV_2D",
            inputs=(0, 1, 2),
            outputs=(3,),
            options={"padding": "SAME", "stride_h": 1, "stride_w": 1},
        )
    ]
    content = write_tflite(single(tensors, ops, [0], [3]))
    assert read_tflite(content, "c").subgraphs[0].operators[0].version == 3
    xq = rng.integers(-128, 128, (1, 6, 6, 3)).astype(np.int8)
    (got,) = invoke(litert, content, [[xq]])[0]
    real = _conv_reference(
        (xq.astype(np.float64) - x_zero) * x_scale,
        w.astype(np.float64) * w_scale[:, None, None, None],
        bias * (x_scale * w_scale.astype(np.float64)),
    )
    want = np.clip(np.round(real / y_scale) + y_zero, -128, 127)
    assert np.abs(got.astype(int) - want).max() <= 1
    assert len(np.unique(got)) > 20  # not saturated: the check means something


@pytest.mark.tflite
def test_float16_weights_run(litert: Any) -> None:
    """A FLOAT16 constant through DEQUANTIZE (version 3) into a float ADD."""
    rng = np.random.default_rng(6)
    w = rng.standard_normal((2, 3)).astype(np.float16)
    tensors = [
        tensor(0, "x", (2, 3)),
        tensor(1, "w16", (2, 3), F16, data=w),
        tensor(2, "w", (2, 3)),
        tensor(3, "y", (2, 3)),
    ]
    ops = [
        TFLiteOperator(0, "DEQUANTIZE", inputs=(1,), outputs=(2,)),
        TFLiteOperator(1, "ADD", inputs=(0, 2), outputs=(3,)),
    ]
    content = write_tflite(single(tensors, ops, [0], [3]))
    again = read_tflite(content, "c")
    assert again.subgraphs[0].operators[0].version == 3
    assert_same(again.subgraphs[0].tensors[1].data, w)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    (got,) = invoke(litert, content, [[x]])[0]
    np.testing.assert_array_equal(got, x + w.astype(np.float32))


@pytest.mark.tflite
def test_int4_weights_are_packed_and_run(litert: Any) -> None:
    """INT4 constants are stored two a byte, low nibble first (an odd count pads the last
    byte), read back as written, and LiteRT dequantizes them (DEQUANTIZE version 6)."""
    w = np.array([-8, 7, 1, -1, 0, 5, -3], np.int8)
    tensors = [
        tensor(0, "x", (7,)),
        tensor(1, "w4", (7,), TFLITE_INT4, data=w, quant=quant(0.5)),
        tensor(2, "w", (7,)),
        tensor(3, "y", (7,)),
    ]
    ops = [
        TFLiteOperator(0, "DEQUANTIZE", inputs=(1,), outputs=(2,)),
        TFLiteOperator(1, "ADD", inputs=(0, 2), outputs=(3,)),
    ]
    content = write_tflite(single(tensors, ops, [0], [3]))
    root = tables(content)
    packed = root.Buffers(root.Subgraphs(0).Tensors(1).Buffer()).DataAsNumpy()
    assert packed.tolist() == [0x78, 0xF1, 0x50, 0x0D]
    again = read_tflite(content, "c").subgraphs[0]
    assert_same(again.tensors[1].data, w)
    assert again.operators[0].version == 6
    x = np.arange(7, dtype=np.float32)
    (got,) = invoke(litert, content, [[x]])[0]
    np.testing.assert_array_equal(got, x + w * 0.5)


@pytest.mark.tflite
def test_default_signature_runs(litert: Any) -> None:
    """Without signatures, ``serving_default`` over subgraph 0, keyed by tensor names."""
    model, w, b = conv_relu_model()
    it = litert.Interpreter(model_content=write_tflite(model))
    assert list(it.get_signature_list()) == ["serving_default"]
    runner = it.get_signature_runner("serving_default")
    x = np.random.default_rng(8).standard_normal((1, 8, 8, 3)).astype(np.float32)
    got = runner(x=x)
    assert list(got) == ["y"]
    np.testing.assert_allclose(
        got["y"], np.maximum(_conv_reference(x, w, b), 0), rtol=1e-5, atol=1e-5
    )


@pytest.mark.tflite
def test_given_signatures_are_written(litert: Any) -> None:
    model, _, _ = conv_relu_model()
    model.subgraphs[0].outputs = (3, 4)
    model.signatures = [
        TFLiteSignature("features", 0, {"image": 0}, {"pre_relu": 3, "activated": 4}),
    ]
    content = write_tflite(model)
    assert_same(read_tflite(content, "c").signatures, model.signatures)
    runner = litert.Interpreter(model_content=content).get_signature_runner("features")
    x = np.ones((1, 8, 8, 3), np.float32)
    got = runner(image=x)
    assert sorted(got) == ["activated", "pre_relu"]
    np.testing.assert_array_equal(got["activated"], np.maximum(got["pre_relu"], 0))


@pytest.mark.tflite
def test_vector_and_enum_options_run(litert: Any) -> None:
    """RESHAPE's new_shape and SQUEEZE's squeeze_dims are written as vectors; enum options are
    taken by name or number; an options dict of defaults still gets its table."""
    tensors = [
        tensor(0, "x", (1, 6)),
        tensor(1, "r", (1, 2, 3, 1)),
        tensor(2, "s", (2, 3)),
        tensor(3, "m", (2,)),
    ]
    ops = [
        TFLiteOperator(
            0, "RESHAPE", inputs=(0,), outputs=(1,), options={"new_shape": [1, 2, 3, 1]}
        ),
        TFLiteOperator(1, "SQUEEZE", inputs=(1,), outputs=(2,), options={"squeeze_dims": (0, 3)}),
        TFLiteOperator(2, "SUM", inputs=(2, 4), outputs=(3,), options={"keep_dims": False}),
    ]
    tensors.append(tensor(4, "axis", (1,), I32, data=np.array([1], np.int32)))
    content = write_tflite(single(tensors, ops, [0], [3]))
    graph = read_tflite(content, "c").subgraphs[0]
    assert graph.operators[0].options == {"new_shape": (1, 2, 3, 1)}
    assert graph.operators[1].options == {"squeeze_dims": (0, 3)}
    assert graph.operators[2].options_type == "ReducerOptions"
    x = np.arange(6, dtype=np.float32).reshape(1, 6)
    (got,) = invoke(litert, content, [[x]])[0]
    np.testing.assert_array_equal(got, x.reshape(2, 3).sum(axis=1))


def test_options_tables() -> None:
    """No options: no table (LiteRT reads defaults), except for LSTM whose parser needs one; a
    given options_type is written even when empty; enum names match their numbers."""
    by_name, _, _ = conv_relu_model({"padding": "valid", "fused_activation_function": "Relu6"})
    by_number, _, _ = conv_relu_model({"padding": 1, "fused_activation_function": 3})
    assert write_tflite(by_name) == write_tflite(by_number)
    tensors = [tensor(0, "x", (4,)), tensor(1, "y", (4,))]
    plain = TFLiteOperator(0, "NEG", inputs=(0,), outputs=(1,))
    (op,) = round_trip(single(tensors, [plain], [0], [1])).subgraphs[0].operators
    assert (op.options_type, op.options) == (None, {})
    plain.options_type = "NegOptions"
    (op,) = round_trip(single(tensors, [plain], [0], [1])).subgraphs[0].operators
    assert (op.options_type, op.options) == ("NegOptions", {})
    lstm = TFLiteOperator(0, "LSTM", inputs=(0,), outputs=(1,))
    (op,) = round_trip(single(tensors, [lstm], [0], [1])).subgraphs[0].operators
    assert op.options_type == "LSTMOptions"


# ------------------------------------------------------------------------------------ errors


def _error(model: TFLiteModel) -> str:
    with pytest.raises(InvalidInputError) as info:
        write_tflite(model)
    return str(info.value)


def test_out_of_range_tensor_index_is_named() -> None:
    model, _, _ = conv_relu_model()
    model.subgraphs[0].operators[1].inputs = (9,)
    message = _error(model)
    assert "operator 1 (RELU)" in message and "tensor 9" in message and "5 tensors" in message
    model, _, _ = conv_relu_model()
    model.subgraphs[0].outputs = (5,)
    assert "output tensor 5" in _error(model)


def test_unknown_option_names_the_op_and_the_known_keys() -> None:
    model, _, _ = conv_relu_model({"padding": "SAME", "stride": 2})
    message = _error(model)
    assert "operator 0 (CONV_2D)" in message and "'stride'" in message
    assert "stride_h" in message and "dilation_w_factor" in message
    tensors = [tensor(0, "x", (4,)), tensor(1, "y", (4,))]
    op = TFLiteOperator(0, "RELU", inputs=(0,), outputs=(1,), options={"alpha": 0.1})
    assert "RELU) takes no builtin options" in _error(single(tensors, [op], [0], [1]))


def test_bad_option_values_are_named() -> None:
    model, _, _ = conv_relu_model({"padding": "HALF"})
    message = _error(model)
    assert "'padding'" in message and "SAME" in message and "VALID" in message
    model, _, _ = conv_relu_model({"stride_h": 2**40})
    assert "stride_h" in _error(model)
    model, _, _ = conv_relu_model()
    model.subgraphs[0].operators[0].options_type = "Pool2DOptions"
    assert "'Pool2DOptions', but CONV_2D takes Conv2DOptions" in _error(model)
    tensors = [tensor(0, "x", (1, 6)), tensor(1, "y", (2, 3))]
    op = TFLiteOperator(0, "RESHAPE", inputs=(0,), outputs=(1,), options={"new_shape": [[2, 3]]})
    assert "new_shape" in _error(single(tensors, [op], [0], [1]))


def test_data_that_does_not_fit_is_named() -> None:
    model, _, _ = conv_relu_model()
    model.subgraphs[0].tensors[1].data = np.zeros((4, 3, 3, 2), np.float32)
    message = _error(model)
    assert "tensor 1 'w'" in message and "[4, 3, 3, 3]" in message and "[4, 3, 3, 2]" in message
    model, _, _ = conv_relu_model()
    model.subgraphs[0].tensors[2].data = np.zeros(4, np.float64)
    message = _error(model)
    assert "tensor 2 'b'" in message and "float64" in message
    tensors = [
        tensor(0, "w4", (2,), TFLITE_INT4, data=np.array([3, 9], np.int8), quant=quant(1.0)),
        tensor(1, "y", (2,)),
    ]
    op = TFLiteOperator(0, "DEQUANTIZE", inputs=(0,), outputs=(1,))
    assert "'w4' is int4" in _error(single(tensors, [op], [], [1]))


def test_inconsistent_graphs_are_named() -> None:
    model, _, _ = conv_relu_model()
    model.subgraphs[0].operators.reverse()  # RELU now reads the conv's output before it exists
    message = _error(model)
    assert "RELU" in message and "'conv'" in message and "no earlier operator" in message
    model, _, _ = conv_relu_model()
    model.subgraphs[0].operators[1].outputs = (1,)
    assert "writes tensor 1 'w', a constant" in _error(model)
    model, _, _ = conv_relu_model()
    model.subgraphs[0].tensors[3].index = 7
    assert "tensor 7 'conv' sits at position 3" in _error(model)
    model, _, _ = conv_relu_model()
    model.subgraphs[0].tensors[1].quant = quant(np.ones(3), 0, axis=0)
    assert "3 scales along axis 0" in _error(model)


def test_other_mistakes_are_named() -> None:
    model, _, _ = conv_relu_model()
    model.subgraphs[0].operators[1].opcode = "RELU_7"
    assert "'RELU_7' is no TFLite builtin operator" in _error(model)
    model, _, _ = conv_relu_model()
    model.subgraphs[0].operators[1].opcode = "CUSTOM"
    assert "CUSTOM without a custom_code" in _error(model)
    model, _, _ = conv_relu_model()
    model.version = 2
    assert "version 3" in _error(model)
    model, _, _ = conv_relu_model()
    model.signatures = [TFLiteSignature("s", 0, {"x": 0}, {"y": 40})]
    assert "signature 's' maps output 'y' to tensor 40" in _error(model)
    model.signatures = [TFLiteSignature("s", 0, {"x": 0}, {"y": 3})]
    assert "tensor 3 'conv', which is no output of subgraph 0" in _error(model)


def test_models_past_the_flatbuffer_limit_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 2 GiB limit, checked before building (lowered here to stand for a big model)."""
    monkeypatch.setattr(_writer, "FLATBUFFER_LIMIT", 1500)
    model, _, _ = conv_relu_model()
    assert "2 GiB" in _error(model)
