"""The TensorRT backend.

Three tiers:

- The rule table and the option parsing, with no TensorRT at all: which zoo and hand-built nodes
  the table takes and why it refuses the others.
- The adapter's own logic (parsing, builder configuration, profiles, device buffers, the runner
  pool, validate's rounds, the engine blob), against a stand-in ``tensorrt`` and ``cuda-python``
  that honour the calls the adapter makes and compute with ONNX Runtime on host memory. They check
  ferry's side of the contract, not TensorRT's.
- The real engine on a GPU (marker ``gpu``): zoo models in fp32 and fp16 against ONNX Runtime,
  dynamic batch through the profile, the engine blob round trip and the real parser's verdicts.
  They skip, with the reason, wherever ``tensorrt``, ``cuda-python`` or a CUDA device is missing.
"""

from __future__ import annotations

import ctypes
import pickle
import re
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_ir.passes.common import NameFixPass

import models
from ferry.backends import (
    CompiledPartition,
    CompileSpec,
    RuleTable,
    _cuda,
    get_backend,
    known_backends,
)
from ferry.backends import _tensorrt as trt_backend
from ferry.backends._tensorrt import (
    DEFAULT_MAX_BATCH,
    BuildOptions,
    TensorRTBackend,
    TensorRTPartition,
    build_options,
    profile_shapes,
)
from ferry.backends._tensorrt_rules import MAX_OPSET, MIN_OPSET, rules, table
from ferry.errors import (
    BackendUnavailableError,
    FerryError,
    InvalidInputError,
    ModelLoadError,
)
from ferry.plan import Partition

RNG = np.random.default_rng(0)


# --- helpers -----------------------------------------------------------------------------------


def named(model: ir.Model | onnx.ModelProto) -> ir.Model:
    if isinstance(model, onnx.ModelProto):
        model = ir.from_proto(model)
    NameFixPass()(model)
    return model


def spec_for(model: ir.Model | onnx.ModelProto, **options: Any) -> CompileSpec:
    """A whole-model CompileSpec, naming nodes first as ferry.load does."""
    work = named(model)
    graph = work.graph
    inputs = tuple(v.name or "" for v in graph.inputs if v.name not in graph.initializers)
    outputs = tuple(v.name or "" for v in graph.outputs)
    nodes = tuple(n.name or "" for n in graph)
    return CompileSpec(
        Partition("tensorrt", nodes, inputs, outputs, dict(options)), work, None, options
    )


def ort_run(
    model: ir.Model | onnx.ModelProto, feeds: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    proto = ir.to_proto(model) if isinstance(model, ir.Model) else model
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def verdicts(
    model: ir.Model | onnx.ModelProto, rule_table: RuleTable | None = None
) -> dict[str, bool | str]:
    model = named(model)
    opsets = dict(model.graph.opset_imports)
    found = rule_table or table()
    return {node.name or "": found.supports(node, opsets) for node in model.graph}


def one_node(
    op: str,
    inputs: list[tuple[str, int, list[Any] | None]],
    outputs: list[tuple[str, int, list[Any] | None]],
    *,
    inits: tuple[onnx.TensorProto, ...] = (),
    opset: int = 20,
    node_inputs: list[str] | None = None,
    node_outputs: list[str] | None = None,
    extra_nodes: tuple[onnx.NodeProto, ...] = (),
    **attrs: Any,
) -> onnx.ModelProto:
    """A model around one node called ``n`` (plus ``extra_nodes`` after it)."""
    node = helper.make_node(
        op,
        node_inputs if node_inputs is not None else [name for name, _, _ in inputs],
        node_outputs if node_outputs is not None else [name for name, _, _ in outputs],
        name="n",
        **attrs,
    )
    graph = helper.make_graph(
        [node, *extra_nodes],
        op,
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        list(inits),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


F = TensorProto.FLOAT


def unary(op: str, dtype: int = F, shape: list[Any] | None = None, **kw: Any) -> onnx.ModelProto:
    shape = shape if shape is not None else ["N", 3, 8, 8]
    return one_node(op, [("x", dtype, shape)], [("y", dtype, None)], **kw)


def const(name: str, value: Any, dtype: Any = np.int64) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


# --- the registry, without TensorRT ------------------------------------------------------------


def test_registered_and_importable_without_the_sdk() -> None:
    assert "tensorrt" in known_backends()
    backend = TensorRTBackend()
    assert backend.name == "tensorrt"
    assert backend.device == "cuda"
    assert backend.precisions == ("fp32", "fp16", "int8")
    assert backend.install_hint == "pip install 'ferry[tensorrt]'  (needs an NVIDIA GPU)"
    assert len(backend.rules()) > 100


def test_unavailable_here_says_why() -> None:
    reason = trt_backend.unavailable_reason()
    if reason is None:
        pytest.skip("TensorRT and a CUDA device are present here")
    assert re.search(r"tensorrt is not importable|cuda-python is not importable|CUDA", reason)
    backend = TensorRTBackend()
    assert backend.available() is False
    assert backend.unavailable_reason() == reason
    with pytest.raises(
        BackendUnavailableError, match=r"'tensorrt' is not available.*ferry\[tensorrt\]"
    ):
        get_backend("tensorrt")
    with pytest.raises(BackendUnavailableError, match=re.escape(reason)):
        backend.compile(spec_for(models.mlp()))


def test_validate_without_a_parser_trusts_the_rules() -> None:
    if trt_backend.unavailable_reason() is None:
        pytest.skip("a real parser is present here")
    model = named(models.mlp())
    assert TensorRTBackend().validate(model, [n.name or "" for n in model.graph]) == {}


# --- options and profiles ----------------------------------------------------------------------


def test_build_options_defaults_and_values() -> None:
    assert build_options({"threads": 4}) == BuildOptions()
    options = build_options(
        {
            "precision": "FP16",
            "workspace": 1 << 30,
            "max_batch": 64,
            "tf32": True,
            "optimization_level": 5,
            "profile": {"x": [[1, 3], [4, 3], [8, 3]]},
        }
    )
    assert options.precision == "fp16"
    assert options.workspace == 1 << 30
    assert options.max_batch == 64
    assert options.tf32 is True
    assert options.optimization_level == 5
    assert options.profile == {"x": ((1, 3), (4, 3), (8, 3))}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"precision": "bf16"},
            r"precision 'bf16' is not supported; choose one of fp32, fp16, int8",
        ),
        ({"workspace": -1}, r"workspace must be a positive byte count"),
        ({"workspace": "1G"}, r"workspace must be a positive byte count"),
        ({"max_batch": 0}, r"max_batch must be a positive integer"),
        ({"max_batch": True}, r"max_batch must be a positive integer"),
        ({"optimization_level": 9}, r"optimization_level must be 0\.\.5"),
        ({"profile": [1, 2]}, r"profile must map input names"),
        (
            {"profile": {"x": [[1], [2]]}},
            r"profile\['x'\] must be \[min_shape, opt_shape, max_shape\]",
        ),
        ({"profile": {"x": [[1, 2], [2], [3, 4]]}}, r"of one rank"),
        ({"profile": {"x": [[4], [2], [8]]}}, r"min <= opt <= max"),
        ({"profile": {"x": [[1.5], [2], [3]]}}, r"non-negative ints"),
    ],
)
def test_build_options_refuse(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        build_options(options)


def test_profile_defaults_to_batch_1_1_32() -> None:
    options = BuildOptions()
    assert profile_shapes("x", (-1, 1, 8, 8), options) == (
        (1, 1, 8, 8),
        (1, 1, 8, 8),
        (32, 1, 8, 8),
    )
    assert DEFAULT_MAX_BATCH == 32
    wide = build_options({"max_batch": 128})
    assert profile_shapes("x", (-1, 16), wide) == ((1, 16), (1, 16), (128, 16))
    assert profile_shapes("x", (2, 16), options) is None  # static: no profile needed


def test_profile_needs_an_entry_for_other_dynamic_dims() -> None:
    with pytest.raises(
        InvalidInputError, match=r"dynamic dims at \[0, 1\].*profile=\{'x': \[min_shape"
    ):
        profile_shapes("x", (-1, -1), BuildOptions())
    options = build_options({"profile": {"x": [[1, 1], [4, 16], [8, 64]]}})
    assert profile_shapes("x", (-1, -1), options) == ((1, 1), (4, 16), (8, 64))


def test_profile_entry_must_fit_the_input() -> None:
    options = build_options({"profile": {"x": [[1, 3], [4, 3], [8, 4]]}})
    with pytest.raises(
        InvalidInputError, match=r"max shape \[8, 4\] does not fit the input's shape \[\?, 3\]"
    ):
        profile_shapes("x", (-1, 3), options)
    with pytest.raises(InvalidInputError, match=r"min shape \[1, 3\] does not fit .* \[\?, 3, 2\]"):
        profile_shapes("x", (-1, 3, 2), options)


# --- the rule table, without TensorRT ----------------------------------------------------------


@pytest.fixture(scope="module")
def zoo_models() -> dict[str, ir.Model]:
    pytest.importorskip("torch")
    from ferry import zoo

    return {
        name: named(zoo.build(name)) for name in ("digits_cnn", "mobilenet_v2", "transformer_block")
    }


@pytest.mark.torch
@pytest.mark.parametrize("name", ["digits_cnn", "mobilenet_v2", "transformer_block"])
def test_rules_take_every_zoo_node(zoo_models: dict[str, ir.Model], name: str) -> None:
    found = verdicts(zoo_models[name])
    assert {n: v for n, v in found.items() if v is not True} == {}
    assert len(found) > 4


@pytest.mark.parametrize(
    "build", [models.mlp, models.conv, models.with_if, lambda: models.reshape_to([2, -1])]
)
def test_rules_take_hand_built_float_models(build: Any) -> None:
    assert all(v is True for v in verdicts(build()).values())


def test_rules_refuse_fp64_everywhere() -> None:
    found = verdicts(unary("Relu", TensorProto.DOUBLE))
    assert (
        found["n"]
        == "Relu: input 0 has dtype float64; supported: bfloat16, float16, float32, int32, int64"
    )
    # A Cast that produces float64 reads float32 fine: the output is what TensorRT lacks.
    cast = unary("Cast", F, to=TensorProto.DOUBLE)
    cast.graph.output[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    reason = verdicts(cast)["n"]
    assert isinstance(reason, str)
    assert "output 0 (y) is float64: TensorRT has no FP64; convert the model to float32" in reason


def test_rules_refuse_strings() -> None:
    found = verdicts(models.strings())
    assert found["id"] == (
        "Identity: input 0 has dtype string; supported: bfloat16, bool, float16, float32, int32, int64"
    )
    normalizer = one_node(
        "StringNormalizer", [("x", TensorProto.STRING, [4])], [("y", TensorProto.STRING, None)]
    )
    assert verdicts(normalizer)["n"] == "StringNormalizer is not supported"


@pytest.mark.parametrize(
    "op",
    [
        "Unique",
        "BitShift",
        "Col2Im",
        "SequenceAt",
        "TfIdfVectorizer",
        "MatMulInteger",
        "QLinearConv",
    ],
)
def test_ops_the_matrix_marks_unsupported_are_absent(op: str) -> None:
    assert ("", op) not in table()


def test_every_claimed_op_is_onnx_or_a_known_legacy_op() -> None:
    legacy = {"ImageScaler", "ParametricSoftplus", "ScaledTanh"}
    for rule in rules():
        assert rule.since >= MIN_OPSET
        assert rule.until is not None and rule.until <= MAX_OPSET
        assert rule.max_rank == 8
        if rule.op_type not in legacy:
            assert onnx.defs.has(rule.op_type, ""), rule.op_type


def _resize(mode: str, **attrs: Any) -> onnx.ModelProto:
    scales = const("scales", [1.0, 1.0, 2.0, 2.0], np.float32)
    return one_node(
        "Resize",
        [("x", F, ["N", 3, 8, 8])],
        [("y", F, None)],
        inits=(scales,),
        node_inputs=["x", "", "scales"],
        mode=mode,
        **attrs,
    )


def _topk(k: int, **attrs: Any) -> onnx.ModelProto:
    return one_node(
        "TopK",
        [("x", F, ["N", 5000])],
        [("values", F, None), ("indices", TensorProto.INT64, None)],
        inits=(const("k", [k]),),
        node_inputs=["x", "k"],
        **attrs,
    )


def _reduce_mean(axes_constant: bool) -> onnx.ModelProto:
    if axes_constant:
        return one_node(
            "ReduceMean", [("x", F, ["N", 4])], [("y", F, None)], inits=(const("axes", [1]),),
            node_inputs=["x", "axes"],
        )  # fmt: skip
    return one_node(
        "ReduceMean", [("x", F, ["N", 4]), ("axes", TensorProto.INT64, [1])], [("y", F, None)]
    )


def _maxpool(indices_used: bool) -> onnx.ModelProto:
    outputs = [("y", F, None)] + ([("i", TensorProto.INT64, None)] if indices_used else [])
    return one_node(
        "MaxPool", [("x", F, ["N", 3, 8, 8])], outputs, node_outputs=["y", "i"], kernel_shape=[2, 2]
    )


def _qdq(zero_point: Any, dtype: Any = np.int8) -> onnx.ModelProto:
    scale = const("scale", 0.1, np.float32)
    zp = const("zp", zero_point, dtype)
    dq = helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["y"], name="dq")
    return one_node(
        "QuantizeLinear",
        [("x", F, ["N", 4])],
        [("y", F, None)],
        inits=(scale, zp),
        node_inputs=["x", "scale", "zp"],
        node_outputs=["q"],
        extra_nodes=(dq,),
    )


def _loop(trip_constant: bool) -> onnx.ModelProto:
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep"),
            helper.make_node("Add", ["acc_in", "one"], ["acc_out"], name="inc"),
            helper.make_node("Identity", ["acc_out"], ["scan"], name="emit"),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", F, [4]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", F, [4]),
            helper.make_tensor_value_info("scan", F, [4]),
        ],
    )
    inits = [const("one", np.ones(4), np.float32), const("cond", True, np.bool_)]
    inputs = [("x", F, [4])]
    if trip_constant:
        inits.append(const("trip", 3))
    else:
        inputs.append(("trip", TensorProto.INT64, []))
    return one_node(
        "Loop",
        inputs,
        [("acc", F, [4]), ("scans", F, None)],
        inits=tuple(inits),
        node_inputs=["trip", "cond", "x"],
        node_outputs=["acc", "scans"],
        body=body,
    )


def _if_with(op: str) -> onnx.ModelProto:
    model = models.with_if()
    if_node = next(n for n in model.graph.node if n.op_type == "If")
    then_branch = next(a for a in if_node.attribute if a.name == "then_branch")
    then_branch.g.node[0].op_type = op
    return model


@pytest.mark.parametrize(
    ("build", "node", "reason"),
    [
        (lambda: _resize("linear"), "n", None),
        (
            lambda: _resize("cubic"),
            "n",
            r"mode='cubic' is not supported \(supported: 'nearest', 'linear'\)",
        ),
        (
            lambda: _resize("linear", coordinate_transformation_mode="tf_crop_and_resize"),
            "n",
            r"coordinate_transformation_mode='tf_crop_and_resize' is not supported",
        ),
        (lambda: _resize("nearest", antialias=1), "n", r"antialias=1 is not supported"),
        (lambda: _topk(10), "n", None),
        (lambda: _topk(4000), "n", r"K=4000 is not supported \(must be < 3840\)"),
        (lambda: _topk(10, sorted=0), "n", r"sorted=0 is not supported"),
        (lambda: _reduce_mean(True), "n", None),
        (lambda: _reduce_mean(False), "n", r"input 1 \(axes\) must be a constant"),
        (lambda: _maxpool(False), "n", None),
        (lambda: _maxpool(True), "n", r"the Indices output is not supported"),
        (
            lambda: unary("MaxPool", shape=["N", 3, 8], kernel_shape=[2]),
            "n",
            r"2D or 3D pooling only",
        ),
        (lambda: _qdq(0), "n", None),
        (lambda: _qdq(0), "dq", None),
        (lambda: _qdq(3), "n", r"zero point must be 0"),
        (lambda: _qdq(0, np.uint8), "n", r"uint8 \(asymmetric\) quantization is not supported"),
        (lambda: _loop(True), "n", None),
        (lambda: _loop(False), "n", r"a Loop with scan outputs needs a constant trip count"),
        (lambda: _if_with("Mul"), "branch", None),
        (
            lambda: _if_with("Unique"),
            "branch",
            r"If: then_branch holds node 'then_mul' it cannot run \(Unique is not supported\)",
        ),
        (lambda: unary("NonZero"), "n", r"NonZero's output shape depends on the data"),
        (lambda: unary("Relu", shape=[1] * 9), "n", r"input 0 has rank 9; supports at most 8"),
        (lambda: unary("Relu", opset=25), "n", r"Relu: opset 25 outside supported range 9\.\.24"),
        (
            lambda: unary(
                "Pad", TensorProto.BOOL, node_inputs=["x", "pads"], inits=(const("pads", [0] * 8),)
            ),
            "n",
            r"input 0 has dtype bool",
        ),
        (
            lambda: one_node(
                "Dropout",
                [("x", F, [4])],
                [("y", F, None)],
                inits=(const("ratio", 0.5, np.float32), const("train", True, np.bool_)),
                node_inputs=["x", "ratio", "train"],
            ),
            "n",
            r"training_mode=True is not supported",
        ),
        (
            lambda: one_node(
                "LayerNormalization",
                [("x", F, ["N", 4])],
                [("y", F, None), ("mean", F, None)],
                inits=(const("scale", np.ones(4), np.float32),),
                node_inputs=["x", "scale"],
                node_outputs=["y", "mean"],
            ),
            "n",
            r"the Mean output is not supported",
        ),
        (
            lambda: one_node(
                "LSTM",
                [("x", F, [2, 1, 3])],
                [("y", F, None)],
                inits=(
                    const("w", np.ones((1, 8, 3)), np.float32),
                    const("r", np.ones((1, 8, 2)), np.float32),
                ),
                node_inputs=["x", "w", "r"],
                hidden_size=2,
                layout=1,
            ),
            "n",
            r"layout=1 is not supported",
        ),
    ],
)
def test_rule_conditions(build: Any, node: str, reason: str | None) -> None:
    """The matrix's restrictions, each with its reason; the same node passes without it."""
    verdict = verdicts(build())[node]
    if reason is None:
        assert verdict is True
    else:
        assert isinstance(verdict, str)
        assert re.search(reason, verdict), verdict


# --- a stand-in TensorRT and cuda-python -------------------------------------------------------


class _FakeCuda:
    """cuda-python's runtime module over host memory: pointers are addresses of ctypes buffers."""

    def __init__(self, devices: int = 1) -> None:
        self.module = types.ModuleType("cuda.bindings.runtime")
        self.live: dict[int, Any] = {}
        self.devices = devices
        self.streams = 0
        m = self.module
        m.cudaError_t = types.SimpleNamespace(cudaSuccess=0, cudaErrorNoDevice=100)
        m.cudaMemcpyKind = types.SimpleNamespace(cudaMemcpyHostToDevice=1, cudaMemcpyDeviceToHost=2)
        m.cudaGetDeviceCount = lambda: (0, self.devices) if self.devices else (100, 0)
        m.cudaGetErrorName = lambda err: (0, b"cudaErrorNoDevice")
        m.cudaGetDevice = lambda: (0, 0)
        m.cudaGetDeviceProperties = lambda d: (0, types.SimpleNamespace(major=8, minor=9))
        m.cudaMalloc = self._malloc
        m.cudaFree = self._free
        m.cudaMemcpyAsync = self._memcpy
        m.cudaStreamCreate = self._stream_create
        m.cudaStreamSynchronize = lambda s: (0,)
        m.cudaStreamDestroy = self._stream_destroy

    def _malloc(self, n: int) -> tuple[int, int]:
        buf = ctypes.create_string_buffer(n)
        self.live[ctypes.addressof(buf)] = buf
        return 0, ctypes.addressof(buf)

    def _free(self, ptr: int) -> tuple[int]:
        del self.live[ptr]
        return (0,)

    def _memcpy(self, dst: int, src: int, n: int, kind: int, stream: Any) -> tuple[int]:
        assert isinstance(dst, int) and isinstance(src, int) and n > 0
        device = dst if kind == 1 else src
        assert any(p <= device < p + len(b) for p, b in self.live.items()), "not device memory"
        ctypes.memmove(dst, src, n)
        return (0,)

    def _stream_create(self) -> tuple[int, Any]:
        self.streams += 1
        return 0, _Stream(self.streams)

    def _stream_destroy(self, stream: Any) -> tuple[int]:
        self.streams -= 1
        return (0,)


class _Stream:
    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __int__(self) -> int:
        return self.handle


class _FakeTensorRT:
    """Just the TensorRT 10 Python API the adapter uses; "engines" run the ONNX model with ORT."""

    #: Ops this parser "cannot import" (the real parser takes them; here they test validate()).
    unsupported = frozenset({"Erf", "Sin"})

    def __init__(self, cuda: _FakeCuda, *, fp16_flag: bool = True) -> None:
        self.cuda = cuda
        self.built: list[dict[str, Any]] = []
        fake = self
        m = types.ModuleType("tensorrt")
        self.module = m
        m.__version__ = "10.99.0"

        class ILogger:
            Severity = types.SimpleNamespace(
                INTERNAL_ERROR=0, ERROR=1, WARNING=2, INFO=3, VERBOSE=4
            )

            def __init__(self) -> None:
                pass

        m.ILogger = ILogger
        flags = {"TF32": "TF32"} | ({"FP16": "FP16"} if fp16_flag else {})
        m.BuilderFlag = types.SimpleNamespace(**flags)
        m.MemoryPoolType = types.SimpleNamespace(WORKSPACE="WORKSPACE")
        m.NetworkDefinitionCreationFlag = types.SimpleNamespace(STRONGLY_TYPED=1)
        m.TensorIOMode = types.SimpleNamespace(INPUT="INPUT", OUTPUT="OUTPUT")
        m.bfloat16 = "bfloat16"
        m.nptype = lambda t: np.dtype(t).type

        class Tensor:
            def __init__(self, name: str, shape: tuple[int, ...]) -> None:
                self.name, self.shape, self.is_shape_tensor = name, shape, False

        class Network:
            def __init__(self, flags: int) -> None:
                self.flags = flags
                self.inputs: list[Tensor] = []
                self.onnx = b""

            @property
            def num_inputs(self) -> int:
                return len(self.inputs)

            def get_input(self, i: int) -> Tensor:
                return self.inputs[i]

        class Error:
            def __init__(self, index: int, node: onnx.NodeProto) -> None:
                self.index, self.onnx_node = index, node

            def code(self) -> str:
                return "UNSUPPORTED_NODE"

            def desc(self) -> str:
                return f"No importer registered for op: {self.onnx_node.op_type}"

            def node(self) -> int:
                return self.index

            def node_name(self) -> str:
                return self.onnx_node.name

            def node_operator(self) -> str:
                return self.onnx_node.op_type

        class OnnxParser:
            def __init__(self, network: Network, logger: Any) -> None:
                self.network = network
                self.errors: list[Error] = []
                self.subgraphs: list[list[int]] = []

            def parse(self, data: bytes, path: str | None = None) -> bool:
                model = onnx.load_from_string(bytes(data))
                for index, node in enumerate(model.graph.node):
                    if node.op_type in fake.unsupported:
                        self.errors.append(Error(index, node))
                        return False  # the real parser stops at its first failing node
                inits = {t.name for t in model.graph.initializer}
                for vi in model.graph.input:
                    if vi.name not in inits:
                        dims = tuple(
                            d.dim_value if d.HasField("dim_value") else -1
                            for d in vi.type.tensor_type.shape.dim
                        )
                        self.network.inputs.append(Tensor(vi.name, dims))
                self.network.onnx = bytes(data)
                return True

            def supports_model_v2(self, data: bytes, path: str | None = None) -> bool:
                ok = self.parse(data, path)
                bad = {e.index for e in self.errors}
                count = len(onnx.load_from_string(bytes(data)).graph.node)
                runs: list[list[int]] = [[]]
                for i in range(count):
                    if i in bad:
                        runs.append([])
                    else:
                        runs[-1].append(i)
                self.subgraphs = [r for r in runs if r]
                return ok

            @property
            def num_subgraphs(self) -> int:
                return len(self.subgraphs)

            def get_subgraph_nodes(self, i: int) -> list[int]:
                return self.subgraphs[i]

            @property
            def num_errors(self) -> int:
                return len(self.errors)

            def get_error(self, i: int) -> Error:
                return self.errors[i]

        class Profile:
            def __init__(self) -> None:
                self.shapes: dict[str, tuple[Any, ...]] = {}

            def set_shape(self, name: str, lo: Any, opt: Any, hi: Any) -> None:
                self.shapes[name] = (tuple(lo), tuple(opt), tuple(hi))

        class Config:
            def __init__(self) -> None:
                self.flags = {"TF32"}
                self.pools: dict[str, int] = {}
                self.profiles: list[Profile] = []
                self.builder_optimization_level = 3

            def set_flag(self, flag: str) -> None:
                self.flags.add(flag)

            def clear_flag(self, flag: str) -> None:
                self.flags.discard(flag)

            def set_memory_pool_limit(self, pool: str, size: int) -> None:
                self.pools[pool] = size

            def add_optimization_profile(self, profile: Profile) -> int:
                self.profiles.append(profile)
                return len(self.profiles) - 1

        class HostMemory(bytes):
            @property
            def nbytes(self) -> int:
                return len(self)

        class Builder:
            def __init__(self, logger: Any) -> None:
                assert fake.cuda.devices, "the real Builder needs a GPU"

            def create_network(self, flags: int) -> Network:
                return Network(flags)

            def create_builder_config(self) -> Config:
                return Config()

            def create_optimization_profile(self) -> Profile:
                return Profile()

            def build_serialized_network(self, network: Network, config: Config) -> HostMemory:
                record = {
                    "onnx": network.onnx,
                    "profile": config.profiles[0].shapes if config.profiles else {},
                    "flags": sorted(config.flags),
                    "strongly_typed": bool(network.flags & 2),
                    "workspace": config.pools.get("WORKSPACE"),
                    "level": config.builder_optimization_level,
                }
                fake.built.append(record)
                return HostMemory(b"FAKEPLAN" + pickle.dumps(record))

        class Context:
            def __init__(self, engine: Engine) -> None:
                self.engine = engine
                self.shapes: dict[str, tuple[int, ...]] = {}
                self.addresses: dict[str, int] = {}
                fake.contexts += 1

            def set_input_shape(self, name: str, shape: Any) -> bool:
                shape = tuple(shape)
                lo, _, hi = self.engine.profile.get(name, (None, None, None))
                if lo is None:
                    ok = all(d < 0 or d == s for d, s in zip(self.engine.declared[name], shape))
                else:
                    ok = len(shape) == len(lo) and all(
                        a <= s <= b for a, s, b in zip(lo, shape, hi)
                    )
                if ok:
                    self.shapes[name] = shape
                return ok

            def set_tensor_address(self, name: str, ptr: int) -> bool:
                self.addresses[name] = ptr
                return True

            def _feeds(self) -> dict[str, np.ndarray]:
                feeds = {}
                for name in self.engine.inputs:
                    shape, dtype = self.shapes[name], self.engine.dtypes[name]
                    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
                    raw = ctypes.string_at(self.addresses[name], n) if n else b""
                    feeds[name] = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
                return feeds

            def get_tensor_shape(self, name: str) -> tuple[int, ...]:
                if name in self.engine.inputs:
                    return self.shapes[name]
                return self.engine.session.run([name], self._feeds())[0].shape

            def execute_async_v3(self, stream: int) -> bool:
                assert isinstance(stream, int)
                outputs = self.engine.session.run(self.engine.outputs, self._feeds())
                for name, value in zip(self.engine.outputs, outputs):
                    value = np.ascontiguousarray(value)
                    if value.nbytes:
                        ctypes.memmove(self.addresses[name], value.ctypes.data, value.nbytes)
                return True

        class Engine:
            def __init__(self, record: dict[str, Any]) -> None:
                self.record = record
                model = onnx.load_from_string(record["onnx"])
                self.session = ort.InferenceSession(
                    record["onnx"], providers=["CPUExecutionProvider"]
                )
                self.profile = record["profile"]
                inits = {t.name for t in model.graph.initializer}
                self.inputs = [v.name for v in model.graph.input if v.name not in inits]
                self.outputs = [v.name for v in model.graph.output]
                self.declared: dict[str, tuple[int, ...]] = {}
                self.dtypes: dict[str, str] = {}
                for vi in (*model.graph.input, *model.graph.output):
                    tt = vi.type.tensor_type
                    self.dtypes[vi.name] = helper.tensor_dtype_to_np_dtype(tt.elem_type).name
                    self.declared[vi.name] = tuple(
                        d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim
                    )

            @property
            def num_io_tensors(self) -> int:
                return len(self.inputs) + len(self.outputs)

            def get_tensor_name(self, i: int) -> str:
                return [*self.inputs, *self.outputs][i]

            def get_tensor_mode(self, name: str) -> str:
                return "INPUT" if name in self.inputs else "OUTPUT"

            def get_tensor_dtype(self, name: str) -> str:
                return self.dtypes[name]

            def get_tensor_shape(self, name: str) -> tuple[int, ...]:
                return self.declared[name]

            def get_tensor_profile_shape(self, name: str, index: int) -> tuple[Any, ...]:
                return self.profile[name]

            def create_execution_context(self) -> Context:
                return Context(self)

        class Runtime:
            def __init__(self, logger: Any) -> None:
                pass

            def deserialize_cuda_engine(self, blob: bytes) -> Engine | None:
                if not bytes(blob).startswith(b"FAKEPLAN"):
                    return None
                return Engine(pickle.loads(bytes(blob)[8:]))

        self.contexts = 0
        m.Builder, m.OnnxParser, m.Runtime = Builder, OnnxParser, Runtime


@pytest.fixture
def fake_sdk(monkeypatch: pytest.MonkeyPatch) -> Iterator[_FakeTensorRT]:
    cuda = _FakeCuda()
    fake = _FakeTensorRT(cuda)
    package = types.ModuleType("cuda")
    bindings = types.ModuleType("cuda.bindings")
    bindings.runtime = cuda.module  # type: ignore[attr-defined]
    package.bindings = bindings  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tensorrt", fake.module)
    monkeypatch.setitem(sys.modules, "cuda", package)
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", cuda.module)
    monkeypatch.setattr(trt_backend, "_trt_logger", None)
    _clear_caches()
    yield fake
    _clear_caches()


def _clear_caches() -> None:
    trt_backend.unavailable_reason.cache_clear()
    _cuda.device_problem.cache_clear()
    _cuda.compute_capability.cache_clear()


def _digits_like() -> onnx.ModelProto:
    """x[N, 1, 8, 8] -> Conv -> Relu -> Flatten -> Gemm -> y[N, 10] (digits_cnn's shape, no torch)."""
    w = const("w", RNG.standard_normal((4, 1, 3, 3)), np.float32)
    fc = const("fc", RNG.standard_normal((10, 4 * 6 * 6)), np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "digits_like",
        [helper.make_tensor_value_info("x", F, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("y", F, ["N", 10])],
        [w, fc],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_fake_sdk_makes_it_available(fake_sdk: _FakeTensorRT) -> None:
    backend = TensorRTBackend()
    assert backend.available() and backend.unavailable_reason() is None
    assert backend.version == "10.99.0+sm89"  # engines are specific to TensorRT and the GPU


def test_no_device_is_a_reason(fake_sdk: _FakeTensorRT) -> None:
    fake_sdk.cuda.devices = 0
    _clear_caches()
    assert TensorRTBackend().unavailable_reason() == "no usable CUDA device (cudaErrorNoDevice)"
    assert TensorRTBackend().version == "10.99.0"


def test_compile_runs_like_onnxruntime_across_batches(fake_sdk: _FakeTensorRT) -> None:
    model = _digits_like()
    part = TensorRTBackend().compile(spec_for(model))
    assert isinstance(part, CompiledPartition)
    (built,) = fake_sdk.built
    # fp32 means fp32: TF32 off; a dynamic batch gets the default 1 / 1 / 32 profile.
    assert built["flags"] == []
    assert built["profile"] == {"x": ((1, 1, 8, 8), (1, 1, 8, 8), (32, 1, 8, 8))}
    assert not built["strongly_typed"]
    for batch in (1, 7, 32, 3):  # buffers grow, then are reused
        x = RNG.standard_normal((batch, 1, 8, 8)).astype(np.float32)
        got = part.run({"x": x})
        np.testing.assert_array_equal(got["y"], ort_run(model, {"x": x})["y"])
    with pytest.raises(
        InvalidInputError,
        match=r"shape \[33, 1, 8, 8\]; the engine takes shapes between \[1, 1, 8, 8\] and \[32, 1, 8, 8\].*max_batch",
    ):
        part.run({"x": np.zeros((33, 1, 8, 8), np.float32)})
    with pytest.raises(InvalidInputError, match=r"missing input \['x'\]"):
        part.run({})
    with pytest.raises(InvalidInputError, match=r"unknown output \['nope'\]"):
        part.run({"x": np.zeros((1, 1, 8, 8), np.float32)}, ["nope"])


def test_scalar_int64_and_bool_io(fake_sdk: _FakeTensorRT) -> None:
    model = models.two_inputs()  # a[batch, 4], b[batch, 4], k[] int64 -> sum, mask (bool)
    part = TensorRTBackend().compile(spec_for(model))
    feeds = {
        "a": RNG.standard_normal((3, 4)).astype(np.float32),
        "b": RNG.standard_normal((3, 4)).astype(np.float32),
        "k": np.array(3, dtype=np.int64),
    }
    got = part.run(feeds)
    want = ort_run(model, feeds)
    assert got["mask"].dtype == np.bool_ and got["sum"].shape == (3, 4)
    np.testing.assert_array_equal(got["mask"], want["mask"])
    np.testing.assert_array_equal(got["sum"], want["sum"])
    assert list(part.run(feeds, ["mask"])) == ["mask"]


def test_options_reach_the_builder(fake_sdk: _FakeTensorRT) -> None:
    model = _digits_like()
    TensorRTBackend().compile(
        spec_for(
            model, precision="fp16", workspace=1 << 28, tf32=True, max_batch=8, optimization_level=1
        )
    )
    (built,) = fake_sdk.built
    assert built["flags"] == ["FP16", "TF32"]
    assert built["workspace"] == 1 << 28
    assert built["level"] == 1
    assert built["profile"]["x"][2] == (8, 1, 8, 8)


def test_profile_option_covers_every_dynamic_dim(fake_sdk: _FakeTensorRT) -> None:
    model = models.reshape_to([-1])
    with pytest.raises(InvalidInputError, match=r"input 'x' has dynamic dims at \[0, 1\]"):
        TensorRTBackend().compile(spec_for(model))
    part = TensorRTBackend().compile(spec_for(model, profile={"x": [[1, 1], [2, 8], [4, 16]]}))
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_array_equal(part.run({"x": x})["y"], x.reshape(-1))
    with pytest.raises(InvalidInputError, match=r"profile names \['z'\], which are not inputs"):
        TensorRTBackend().compile(
            spec_for(model, profile={"x": [[1, 1], [2, 8], [4, 16]], "z": [[1], [1], [1]]})
        )


def test_int8_needs_a_qdq_model(fake_sdk: _FakeTensorRT) -> None:
    with pytest.raises(FerryError, match=r"precision 'int8' needs a quantized \(QDQ\) model"):
        TensorRTBackend().compile(spec_for(_digits_like(), precision="int8"))
    assert fake_sdk.built == []
    part = TensorRTBackend().compile(spec_for(_qdq(0), precision="int8"))
    assert fake_sdk.built[0]["strongly_typed"]  # explicit quantization: the Q/DQ nodes decide
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_array_equal(part.run({"x": x})["y"], ort_run(_qdq(0), {"x": x})["y"])


def test_fp16_on_tensorrt_11_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch, fake_sdk: _FakeTensorRT
) -> None:
    monkeypatch.delattr(fake_sdk.module.BuilderFlag, "FP16")
    with pytest.raises(
        FerryError, match=r"strongly typed networks only.*convert the model to float16"
    ):
        TensorRTBackend().compile(spec_for(_digits_like(), precision="fp16"))


def test_engine_blob_round_trip(fake_sdk: _FakeTensorRT) -> None:
    model = _digits_like()
    spec = spec_for(model)
    part = TensorRTBackend().compile(spec)
    blob = part.serialize()
    assert blob.startswith(b"FAKEPLAN")
    again = TensorRTBackend().load(blob, spec)
    x = RNG.standard_normal((5, 1, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(again.run({"x": x})["y"], part.run({"x": x})["y"])
    assert len(fake_sdk.built) == 1  # loading did not build
    with pytest.raises(ModelLoadError, match=r"could not load the engine.*engine cache"):
        TensorRTBackend().load(b"garbage", spec)


def test_parser_failure_names_the_node(fake_sdk: _FakeTensorRT) -> None:
    model = unary("Erf", shape=[2, 3])
    with pytest.raises(
        ModelLoadError,
        match=r"rejected the partition of 1 node\(s\) starting at node 'n': UNSUPPORTED_NODE: No importer registered for op: Erf \(node 'n', Erf\)",
    ):
        TensorRTBackend().compile(spec_for(model))


def test_validate_asks_the_parser_until_it_takes_the_rest(fake_sdk: _FakeTensorRT) -> None:
    """Two nodes the (stand-in) parser cannot import: one round each; the others are kept."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="first"),
        helper.make_node("Sin", ["a"], ["b"], name="sine"),
        helper.make_node("Relu", ["b"], ["c"], name="middle"),
        helper.make_node("Erf", ["c"], ["d"], name="erf"),
        helper.make_node("Relu", ["d"], ["y"], name="last"),
    ]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", F, ["N", 4])],
        [helper.make_tensor_value_info("y", F, ["N", 4])],
    )  # fmt: skip
    model = named(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    rejected = TensorRTBackend().validate(model, ["first", "sine", "middle", "erf", "last"])
    assert rejected == {
        "sine": "TensorRT's ONNX parser rejects it: UNSUPPORTED_NODE: No importer registered for op: Sin (node 'sine', Sin)",
        "erf": "TensorRT's ONNX parser rejects it: UNSUPPORTED_NODE: No importer registered for op: Erf (node 'erf', Erf)",
    }
    assert TensorRTBackend().validate(model, ["first", "middle"]) == {}
    assert TensorRTBackend().validate(model, []) == {}


def test_runs_from_many_threads(fake_sdk: _FakeTensorRT) -> None:
    model = _digits_like()
    part = TensorRTBackend().compile(spec_for(model))
    assert isinstance(part, TensorRTPartition)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(5):
                x = rng.standard_normal((int(rng.integers(1, 9)), 1, 8, 8)).astype(np.float32)
                np.testing.assert_array_equal(
                    part.run({"x": x})["y"], ort_run(model, {"x": x})["y"]
                )
        except BaseException as e:  # collected and re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert 1 <= fake_sdk.contexts <= 6  # one context per call running at once, reused after
    part.close()
    assert fake_sdk.cuda.live == {}  # every device buffer freed
    assert fake_sdk.cuda.streams == 0


# --- the real engine (GPU) ---------------------------------------------------------------------

gpu = pytest.mark.skipif(
    trt_backend.unavailable_reason() is not None,
    reason=f"TensorRT cannot run here: {trt_backend.unavailable_reason()}",
)


def _max_rel_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / (np.abs(want).max() + 1e-12))


@pytest.mark.gpu
@pytest.mark.torch
@gpu
@pytest.mark.parametrize("name", ["digits_cnn", "mobilenet_v2", "transformer_block"])
@pytest.mark.parametrize(("precision", "tolerance"), [("fp32", 1e-4), ("fp16", 2e-2)])
def test_gpu_zoo_matches_onnxruntime(
    zoo_models: dict[str, ir.Model], name: str, precision: str, tolerance: float
) -> None:
    from ferry import zoo

    model = zoo_models[name]
    part = get_backend("tensorrt").compile(spec_for(model, precision=precision))
    for batch in (1, 8, DEFAULT_MAX_BATCH):  # the default profile's dynamic batch
        feeds = zoo.example_inputs(name, batch=batch)
        got = part.run(feeds)
        want = ort_run(model, feeds)
        for key in want:
            assert got[key].shape == want[key].shape
            error = _max_rel_error(got[key], want[key])
            assert error < tolerance, f"{name} {precision} batch {batch}: relative error {error}"
            if name == "digits_cnn":
                agree = np.mean(got[key].argmax(-1) == want[key].argmax(-1))
                assert agree >= (1.0 if precision == "fp32" else 0.9)


@pytest.mark.gpu
@gpu
def test_gpu_dynamic_batch_profile_and_blob_round_trip() -> None:
    model = _digits_like()
    spec = spec_for(model, max_batch=64)
    backend = get_backend("tensorrt")
    part = backend.compile(spec)
    x = RNG.standard_normal((64, 1, 8, 8)).astype(np.float32)
    want = ort_run(model, {"x": x})["y"]
    np.testing.assert_allclose(part.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)
    with pytest.raises(InvalidInputError, match=r"between \[1, 1, 8, 8\] and \[64, 1, 8, 8\]"):
        part.run({"x": np.zeros((65, 1, 8, 8), np.float32)})
    loaded = backend.load(part.serialize(), spec)
    np.testing.assert_array_equal(loaded.run({"x": x})["y"], part.run({"x": x})["y"])


@pytest.mark.gpu
@gpu
def test_gpu_parser_takes_what_the_rules_take() -> None:
    """The real parser accepts every node of a model the table accepts whole."""
    for build in (models.mlp, models.conv, _digits_like):
        model = named(build())
        assert all(v is True for v in verdicts(model).values())
        assert get_backend("tensorrt").validate(model, [n.name or "" for n in model.graph]) == {}
