"""The ONNX Runtime backend: its measured rule table against ONNX Runtime itself, provider selection
(without a GPU), precisions and options."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_ir.passes.common import NameFixPass

import models
from ferry.backends import CompiledPartition, CompileSpec, RuleTable, _onnxruntime_ops, get_backend
from ferry.backends._onnxruntime import (
    OnnxRuntimeBackend,
    OnnxRuntimePartition,
    rules,
    select_providers,
)
from ferry.errors import BackendUnavailableError, InvalidInputError
from ferry.plan import Partition

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TRT = "TensorrtExecutionProvider"
GPU_BUILD = ["TensorrtExecutionProvider", CUDA, CPU]


@pytest.fixture(scope="module")
def table() -> RuleTable:
    return RuleTable(rules())


def verdicts(table: RuleTable, model: ir.Model | onnx.ModelProto) -> dict[str, bool | str]:
    if isinstance(model, onnx.ModelProto):
        model = ir.from_proto(model)
    NameFixPass()(model)
    opsets = dict(model.graph.opset_imports)
    return {node.name or "": table.supports(node, opsets) for node in model.graph}


def ort_loads(model: onnx.ModelProto) -> bool:
    so = ort.SessionOptions()
    so.log_severity_level = 4
    try:
        ort.InferenceSession(model.SerializeToString(), so, providers=[CPU])
    except Exception:
        return False
    return True


def spec_for(model: onnx.ModelProto, **options: Any) -> CompileSpec:
    work = ir.from_proto(model)
    NameFixPass()(work)
    graph = work.graph
    inputs = tuple(v.name or "" for v in graph.inputs if v.name not in graph.initializers)
    outputs = tuple(v.name or "" for v in graph.outputs)
    nodes = tuple(n.name or "" for n in graph)
    partition = Partition("onnxruntime", nodes, inputs, outputs, dict(options))
    return CompileSpec(partition, work, None, options)


def one_node(
    op: str,
    dtype: int,
    *,
    opset: int = 20,
    shape: tuple[int, ...] = (1, 2, 4, 4),
    inits: tuple[onnx.TensorProto, ...] = (),
    **attrs: Any,
) -> onnx.ModelProto:
    names = ["x", *(t.name for t in inits)]
    node = helper.make_node(op, names, ["y"], name="n", **attrs)
    graph = helper.make_graph(
        [node],
        op,
        [helper.make_tensor_value_info("x", dtype, list(shape))],
        [helper.make_tensor_value_info("y", dtype, None)],
        list(inits),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


# --- the backend object ----------------------------------------------------------------------


def test_backend_declares_fp32_only_and_trusts_its_rules() -> None:
    backend = get_backend("onnxruntime")
    assert isinstance(backend, OnnxRuntimeBackend)
    assert backend.precisions == ("fp32",)
    assert backend.device == "cpu"
    assert backend.validate(ir.from_proto(models.mlp()), ["fc1", "relu"]) == {}
    claimed = RuleTable(backend.rules())
    for key in [("", "Conv"), ("", "Gelu"), ("ai.onnx.ml", "TreeEnsembleClassifier")]:
        assert key in claimed
    assert ("com.microsoft", "FusedConv") in claimed


def test_rule_data_is_for_this_onnxruntime() -> None:
    from ferry.conformance._gen_onnxruntime import max_opsets

    if ort.__version__ != _onnxruntime_ops.ORT_VERSION:
        pytest.skip(f"table measured on onnxruntime {_onnxruntime_ops.ORT_VERSION}")
    # The cap: what this ONNX Runtime loads, per domain, and no rule claims beyond it.
    assert max_opsets() == _onnxruntime_ops.MAX_OPSET
    for rule in rules():
        if rule.domain in _onnxruntime_ops.MAX_OPSET:
            assert rule.until is not None
            assert rule.until <= _onnxruntime_ops.MAX_OPSET[rule.domain], rule


@pytest.mark.slow
def test_rule_data_regenerates_identically() -> None:
    """The recorded table is what the generator measures now (run after upgrading ORT/onnx)."""
    from ferry.conformance import _gen_onnxruntime

    if (ort.__version__, onnx.__version__) != (
        _onnxruntime_ops.ORT_VERSION,
        _onnxruntime_ops.ONNX_VERSION,
    ):
        pytest.skip("the table was measured on other onnxruntime/onnx versions")
    tops, rows, contrib, failures = _gen_onnxruntime.measure()
    text = _gen_onnxruntime.render(tops, rows, contrib, failures)
    namespace: dict[str, Any] = {}
    exec(compile(text, "<generated>", "exec"), namespace)
    assert namespace["OPS"] == _onnxruntime_ops.OPS
    assert namespace["CONTRIB_OPS"] == _onnxruntime_ops.CONTRIB_OPS
    assert namespace["CONFORMANCE_FAILURES"] == _onnxruntime_ops.CONFORMANCE_FAILURES


# --- the rule table against reality ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.torch
def test_rules_take_every_zoo_node(table: RuleTable) -> None:
    pytest.importorskip("torch")
    from ferry import zoo

    for name in zoo.names():
        rejected = {n: v for n, v in verdicts(table, zoo.build(name)).items() if v is not True}
        assert rejected == {}, name


@pytest.mark.parametrize("build", [models.mlp, models.conv, models.two_inputs, models.with_if])
def test_rules_take_hand_built_models(table: RuleTable, build: Any) -> None:
    assert all(v is True for v in verdicts(table, build()).values())


def test_rules_reject_unknown_ops_with_their_names(table: RuleTable) -> None:
    found = verdicts(table, models.custom_ops())
    assert found["fancy1"] == "acme::FancyAct is not supported"
    assert found["typo"] == "Rellu is not supported"


def _fp16_conv() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((2, 2, 3, 3), np.float16), "w")
    return one_node("Conv", TensorProto.FLOAT16, inits=(w,))


def _fp16_layernorm() -> onnx.ModelProto:
    scale = numpy_helper.from_array(np.ones(4, np.float16), "scale")
    return one_node("LayerNormalization", TensorProto.FLOAT16, inits=(scale,))


def _relu_at(opset: int) -> onnx.ModelProto:
    return one_node("Relu", TensorProto.FLOAT, opset=opset)


@pytest.mark.parametrize(
    ("build", "claimed", "reason"),
    [
        # float16 runs through float kernels between Casts (ORT's InsertCastTransformer).
        (_fp16_conv, True, None),
        (_fp16_layernorm, True, None),
        (lambda: _relu_at(28), True, None),
        (lambda: _relu_at(29), False, r"opset 29 outside supported range 14\.\.28"),
        (lambda: one_node("Relu", TensorProto.BFLOAT16), False, r"dtype bfloat16; supported"),
        (lambda: one_node("Relu", TensorProto.INT64), False, r"Relu: input 0 has dtype int64"),
        (lambda: one_node("Conv", TensorProto.DOUBLE), False, r"dtype float64"),
        (lambda: one_node("Gelu", TensorProto.FLOAT), True, None),
        (lambda: one_node("Swish", TensorProto.FLOAT, opset=24), True, None),
    ],
)
def test_rules_agree_with_onnxruntime_loading_the_node(
    table: RuleTable, build: Any, claimed: bool, reason: str | None
) -> None:
    """What the table claims ONNX Runtime loads, and what it refuses ONNX Runtime refuses."""
    model = build()
    verdict = verdicts(table, model)["n"]
    assert (verdict is True) == claimed, verdict
    if reason is not None:
        assert isinstance(verdict, str)
        assert re.search(reason, verdict), verdict
    assert ort_loads(model) == claimed


def test_if_is_taken_only_when_its_branches_are(table: RuleTable) -> None:
    good = models.with_if()
    assert all(v is True for v in verdicts(table, good).values())
    bad = models.with_if()
    if_node = next(n for n in bad.graph.node if n.op_type == "If")
    then_branch = next(a for a in if_node.attribute if a.name == "then_branch")
    then_branch.g.node[0].op_type = "NoSuchOp"
    verdict = verdicts(table, bad)["branch"]
    assert verdict == (
        "If: then_branch holds node 'then_mul' it cannot run (NoSuchOp is not supported)"
    )


# StringNormalizer builds a C++ locale (en_US.UTF-8) when the session starts; machines without
# that locale installed refuse it. That is the machine, not the op table.
_MACHINE_DEPENDENT = re.compile(r"test_strnormalizer_export_monday_")


def test_no_node_test_case_the_rules_take_fails_to_load(table: RuleTable) -> None:
    """Every ONNX node test case the table accepts whole loads in ONNX Runtime (no over-claims).

    Types are inferred first, as the partitioner sees them. The reverse (a case ONNX Runtime
    loads that the table refuses) is allowed: the table is conservative where ONNX Runtime
    inlines a function body for a type its kernel lacks.
    """
    from onnx.backend.test.case.node import collect_testcases

    overclaimed: list[str] = []
    checked = 0
    for case in collect_testcases():
        if case.model is None or not case.model.graph.node:
            continue
        inferred = onnx.shape_inference.infer_shapes(case.model, strict_mode=False)
        model = ir.from_proto(inferred)
        opsets = dict(model.graph.opset_imports)
        if not all(table.supports(node, opsets) is True for node in model.graph):
            continue
        checked += 1
        if not ort_loads(case.model) and not _MACHINE_DEPENDENT.match(case.name):
            overclaimed.append(case.name)
    assert checked > 1500
    assert overclaimed == []


def test_conformance_failures_name_real_cases() -> None:
    from onnx.backend.test.case.node import collect_testcases

    names = {case.name for case in collect_testcases()}
    assert names >= _onnxruntime_ops.CONFORMANCE_FAILURES


# --- providers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "available", "expected"),
    [
        ({}, [CPU], [CPU]),
        ({"device": "cpu"}, GPU_BUILD, [CPU]),
        ({"device": "CUDA"}, GPU_BUILD, [CUDA, CPU]),
        ({"providers": ["tensorrt", "cuda"]}, GPU_BUILD, [TRT, CUDA, CPU]),
        ({"providers": CUDA}, GPU_BUILD, [CUDA, CPU]),
        ({"providers": [CPU, CUDA]}, GPU_BUILD, [CPU, CUDA]),
        (
            {"providers": [(CUDA, {"device_id": 1})]},
            GPU_BUILD,
            [(CUDA, {"device_id": 1}), CPU],
        ),
        # A plan saved as JSON gives the pair back as a list.
        (
            json.loads(json.dumps({"providers": [CUDA, {"device_id": 1}]})),
            GPU_BUILD,
            [(CUDA, {"device_id": 1}), CPU],
        ),
    ],
)
def test_select_providers(
    options: dict[str, Any], available: list[str], expected: list[Any]
) -> None:
    assert select_providers(options, available) == expected


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"device": "cuda"}, BackendUnavailableError, r"CUDAExecutionProvider.*onnxruntime-gpu"),
        ({"providers": ["tensorrt"]}, BackendUnavailableError, r"TensorrtExecutionProvider"),
        ({"device": "tpu"}, InvalidInputError, r"unknown device 'tpu'; choose one of cpu, cuda"),
        ({"device": "cpu", "providers": [CPU]}, InvalidInputError, r"not both"),
        ({"providers": [42]}, InvalidInputError, r"a name or a \(name, options\) pair"),
    ],
)
def test_select_providers_refuses(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        select_providers(options, [CPU])


def test_partition_runs_on_the_providers_it_was_given() -> None:
    model = models.mlp()
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=[CPU]).run(None, {"x": x})[0]
    part = OnnxRuntimeBackend().compile(spec_for(model, device="cpu", threads=1))
    assert isinstance(part, OnnxRuntimePartition)
    assert isinstance(part, CompiledPartition)
    assert part.serialize() == b""  # ORT compiles from the model; nothing to cache
    assert part.providers == [CPU]
    np.testing.assert_array_equal(part.run({"x": x})["y"], want)
    if CUDA not in ort.get_available_providers():
        with pytest.raises(BackendUnavailableError, match="onnxruntime-gpu"):
            OnnxRuntimeBackend().compile(spec_for(model, device="cuda"))


@pytest.mark.parametrize(
    ("elem_type", "values"),
    [
        (TensorProto.BFLOAT16, [[-1.5, 0.0], [2.25, 100.0]]),
        (TensorProto.FLOAT8E4M3FN, [[-1.5, 0.0], [2.25, 96.0]]),
        (TensorProto.INT4, [[-8, -1], [0, 7]]),
        (TensorProto.UINT4, [[0, 1], [9, 15]]),
        (TensorProto.INT2, [[-2, -1], [0, 1]]),
    ],
)
def test_types_numpy_lacks_pass_through_both_ways(elem_type: int, values: list[Any]) -> None:
    """bfloat16, float8 and packed int4/int2 tensors in and out (ml_dtypes arrays on ferry's side).

    x (exotic) -> Cast(float) -> Add 1 -> Cast(back) -> y: ORT's numpy bridge takes none of them.
    """
    dtype = np.dtype(ir.DataType(elem_type).numpy())
    x = np.array(values, dtype=np.float32).astype(dtype)
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    nodes = [
        helper.make_node("Cast", ["x"], ["xf"], name="up", to=TensorProto.FLOAT),
        helper.make_node("Add", ["xf", "zero"], ["s"], name="add"),
        helper.make_node("Cast", ["s"], ["y"], name="down", to=elem_type),
        helper.make_node("Identity", ["xf"], ["f"], name="copy"),
    ]
    graph = helper.make_graph(
        nodes,
        "exotic",
        [helper.make_tensor_value_info("x", elem_type, [2, 2])],
        [
            helper.make_tensor_value_info("y", elem_type, [2, 2]),
            helper.make_tensor_value_info("f", TensorProto.FLOAT, [2, 2]),
        ],
        [zero],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])
    model.ir_version = 10
    got = OnnxRuntimeBackend().compile(spec_for(model)).run({"x": x})
    np.testing.assert_array_equal(got["f"], x.astype(np.float32))
    assert got["y"].dtype == dtype
    np.testing.assert_array_equal(got["y"].astype(np.float32), x.astype(np.float32))


def test_scalar_inputs_keep_their_shape() -> None:
    model = models.two_inputs()
    feeds = {
        "a": np.ones((2, 4), np.float32),
        "b": np.zeros((2, 4), np.float32),
        "k": np.array(3, dtype=np.int64),
    }
    np.testing.assert_array_equal(
        OnnxRuntimeBackend().compile(spec_for(model)).run(feeds)["sum"], np.full((2, 4), 3.0)
    )


def test_partition_refuses_other_precisions() -> None:
    with pytest.raises(InvalidInputError, match=r"precision 'fp16' is not supported"):
        OnnxRuntimeBackend().compile(spec_for(models.mlp(), precision="fp16"))
    OnnxRuntimeBackend().compile(spec_for(models.mlp(), precision="fp32"))
