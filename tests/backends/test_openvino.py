"""The OpenVINO backend against ONNX Runtime: zoo models, precisions, dynamic batch, the compiled-model
cache round trip, validate(), threads, and ONNX's node test cases for every op the rules claim."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_ir.passes.common import NameFixPass

ov = pytest.importorskip("openvino")

from ferry.backends import (  # noqa: E402
    CompiledPartition,
    CompileSpec,
    RuleTable,
    get_backend,
)
from ferry.backends._openvino import OpenVINOBackend, OpenVINOPartition  # noqa: E402
from ferry.errors import ExecutionError, InvalidInputError, ModelLoadError  # noqa: E402
from ferry.graph import prepare  # noqa: E402
from ferry.plan import Partition  # noqa: E402

pytestmark = pytest.mark.openvino

ZOO = ["digits_cnn", "mlp", "mobilenet_v2", "transformer_block"]


# ---------------------------------------------------------------------------------------------
# Helpers


def spec_for(model: ir.Model | onnx.ModelProto, **options: Any) -> CompileSpec:
    """A whole-model CompileSpec, naming nodes first as ferry.load does."""
    if isinstance(model, onnx.ModelProto):
        model = ir.from_proto(model)
    NameFixPass()(model)
    graph = model.graph
    inputs = tuple(v.name or "" for v in graph.inputs if v.name not in graph.initializers)
    outputs = tuple(v.name or "" for v in graph.outputs)
    nodes = tuple(n.name or "" for n in graph)
    return CompileSpec(
        Partition("openvino", nodes, inputs, outputs, dict(options)), model, None, options
    )


def ort_run(model: ir.Model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def max_error(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> float:
    assert got.keys() == want.keys()
    return max(float(np.max(np.abs(got[k].astype(np.float64) - want[k]))) for k in want)


@pytest.fixture(scope="module")
def backend() -> OpenVINOBackend:
    b = get_backend("openvino")
    assert isinstance(b, OpenVINOBackend)
    return b


@pytest.fixture(scope="module")
def zoo_models() -> dict[str, ir.Model]:
    pytest.importorskip("torch")
    from ferry import zoo

    return {name: zoo.build(name) for name in ZOO}


def cpu_capabilities() -> list[str]:
    return list(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


# ---------------------------------------------------------------------------------------------
# The adapter


def test_registry_and_identity(backend: OpenVINOBackend) -> None:
    assert backend.name == "openvino" and backend.device == "cpu"
    assert backend.precisions[0] == "fp32" and set(backend.precisions) == {"fp32", "bf16", "fp16"}
    assert backend.version == ov.__version__
    assert backend.available()
    assert "ferry[openvino]" in backend.install_hint


@pytest.mark.torch
@pytest.mark.parametrize("name", ZOO)
def test_zoo_fp32_matches_onnxruntime_at_several_batches(
    backend: OpenVINOBackend, zoo_models: dict[str, ir.Model], name: str
) -> None:
    from ferry import zoo

    model = zoo_models[name]
    assert isinstance(model.graph.inputs[0].shape[0], ir.SymbolicDim)  # one compile, any batch
    compiled = backend.compile(spec_for(model.clone()))
    assert isinstance(compiled, CompiledPartition)
    # The default is exact f32 even on CPUs where OpenVINO would pick bf16 by itself.
    assert compiled.inference_precision == "f32"
    assert str(compiled.compiled.get_property("PERFORMANCE_HINT")).endswith("LATENCY")
    for batch in (1, 4, 3):
        feeds = zoo.example_inputs(name, batch=batch, seed=batch)
        got = compiled.run(feeds)
        want = ort_run(model, feeds)
        assert got.keys() == want.keys()
        for key in want:
            assert got[key].shape == want[key].shape and got[key].dtype == want[key].dtype
            np.testing.assert_allclose(got[key], want[key], rtol=1e-3, atol=1e-4)


@pytest.mark.torch
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("name", ZOO)
def test_zoo_low_precision_hint(
    backend: OpenVINOBackend, zoo_models: dict[str, ir.Model], name: str, precision: str
) -> None:
    from ferry import zoo

    model = zoo_models[name]
    compiled = backend.compile(spec_for(model.clone(), precision=precision))
    ran = compiled.inference_precision
    hint = {"bf16": "bf16", "fp16": "f16"}[precision]
    # The hint is a wish: the CPU plugin runs it where the CPU has the instructions; an f16 wish
    # on a CPU with only bf16 (AVX512-BF16/AMX without FP16) runs in bf16, else f32.
    caps = cpu_capabilities()
    if {"bf16": "BF16", "fp16": "FP16"}[precision] in caps:
        assert ran == hint
    elif precision == "fp16" and "BF16" in caps:
        assert ran in ("bf16", "f32")
    else:
        assert ran == "f32"
    feeds = zoo.example_inputs(name, batch=2)
    got, want = compiled.run(feeds), ort_run(model, feeds)
    scale = max(float(np.max(np.abs(v))) for v in want.values())
    err = max_error(got, want)
    # bf16 keeps 8 bits of mantissa: a few percent of the output's range after a dozen layers.
    assert err <= 0.05 * scale + 1e-3, f"{name} in {ran}: max error {err:.4g} (scale {scale:.3g})"
    if ran == "f32":
        assert err < 1e-3


def test_threads_and_precision_options(backend: OpenVINOBackend) -> None:
    from models import mlp

    compiled = backend.compile(spec_for(mlp(), threads=1))
    assert int(compiled.compiled.get_property("INFERENCE_NUM_THREADS")) == 1
    with pytest.raises(InvalidInputError, match="precision 'int4'"):
        backend.compile(spec_for(mlp(), precision="int4"))
    with pytest.raises(InvalidInputError, match="threads"):
        backend.compile(spec_for(mlp(), threads=0))


def test_dynamic_batch_on_a_hand_built_model(backend: OpenVINOBackend) -> None:
    from models import mlp

    spec = spec_for(mlp(batch="batch"))
    compiled = backend.compile(spec)
    for batch in (1, 2, 7, 64):
        x = np.random.default_rng(batch).standard_normal((batch, 16)).astype(np.float32)
        got = compiled.run({"x": x})
        want = ort_run(spec.model, {"x": x})
        assert got["y"].shape == (batch, 4)
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-6)


def test_int64_inputs_in_either_numpy_spelling(backend: OpenVINOBackend) -> None:
    """ONNX Runtime hands int64 results on as numpy ``longlong`` ('q'); OpenVINO's API knows
    only ``int64`` ('l'). A split plan passes such tensors across the boundary."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["ids", "one"], ["y"], name="add")],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [2, 3])],
        [numpy_helper.from_array(np.array(1, np.int64), "one")],
    )
    model = _named(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    compiled = backend.compile(
        CompileSpec(Partition("openvino", ("add",), ("ids",), ("y",)), model)
    )
    for dtype in (np.longlong, np.int64):
        ids = np.arange(6).reshape(2, 3).astype(dtype)
        np.testing.assert_array_equal(compiled.run({"ids": ids})["y"], ids + 1)


def test_serialize_and_load_round_trip(backend: OpenVINOBackend) -> None:
    from models import mlp

    spec = spec_for(mlp())
    compiled = backend.compile(spec)
    blob = compiled.serialize()
    assert isinstance(blob, bytes) and len(blob) > 100
    loaded = backend.load(blob, spec)
    assert loaded.inference_precision == "f32"
    x = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)
    np.testing.assert_array_equal(loaded.run({"x": x})["y"], compiled.run({"x": x})["y"])
    with pytest.raises(ModelLoadError, match="engine cache"):
        backend.load(b"not a compiled model", spec)


def test_the_prepared_model_is_compiled_not_its_file(
    backend: OpenVINOBackend, tmp_path: Any
) -> None:
    """OpenVINO compiles the model placement asked it about (with its inferred types), not the
    file it was read from; external weights are read in."""
    from models import mlp, save_external

    path = save_external(mlp(seed=1), tmp_path / "m.onnx")  # other weights, beside the file
    spec = spec_for(mlp())
    compiled = backend.compile(CompileSpec(spec.partition, spec.model, path, {}))
    x = np.ones((2, 16), np.float32)
    np.testing.assert_allclose(
        compiled.run({"x": x})["y"], ort_run(spec.model, {"x": x})["y"], rtol=1e-4, atol=1e-6
    )
    compiled = backend.compile(spec_for(ir.load(path)))
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(compiled.run({"x": x})["y"], want[0], rtol=1e-4, atol=1e-6)


def test_outputs_subset_and_copies(backend: OpenVINOBackend) -> None:
    from models import two_inputs

    spec = spec_for(two_inputs())
    compiled = backend.compile(spec)
    rng = np.random.default_rng(0)
    feeds = {
        "a": rng.standard_normal((3, 4)).astype(np.float32),
        "b": rng.standard_normal((3, 4)).astype(np.float32),
        "k": np.array(3, np.int64),
    }
    first = compiled.run(feeds)
    want = ort_run(spec.model, feeds)
    for key in want:
        np.testing.assert_allclose(first[key], want[key], rtol=1e-5, atol=1e-6)
    keep = {k: v.copy() for k, v in first.items()}
    compiled.run({k: v + 1 for k, v in feeds.items()})
    for key in keep:  # results are ours, not views into OpenVINO's buffers
        np.testing.assert_array_equal(first[key], keep[key])
    name = spec.model.graph.outputs[0].name
    assert list(compiled.run(feeds, [name])) == [name]


def test_pass_through_graph_keeps_its_names(backend: OpenVINOBackend) -> None:
    # OpenVINO renames the input of an input->output graph after the output; ferry still finds it.
    graph = helper.make_graph(
        [helper.make_node("Dropout", ["x"], ["y"], name="drop")],
        "pass",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compiled = backend.compile(spec_for(model))
    x = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], x)


def test_run_errors_are_execution_errors(backend: OpenVINOBackend) -> None:
    from models import mlp

    compiled = backend.compile(spec_for(mlp(batch=2)))
    with pytest.raises(ExecutionError, match="OpenVINO failed to run"):
        compiled.run({"x": np.ones((2, 5), np.float32)})


def test_unreadable_model_is_a_model_load_error(backend: OpenVINOBackend) -> None:
    from models import custom_ops

    with pytest.raises(ModelLoadError, match="OpenVINO could not read the model"):
        backend.compile(spec_for(custom_ops()))


def test_threads_share_one_compiled_partition(backend: OpenVINOBackend) -> None:
    from models import conv

    spec = spec_for(conv())
    compiled = backend.compile(spec)
    assert isinstance(compiled, OpenVINOPartition)
    x_value = spec.model.graph.inputs[0]
    shape = [d if isinstance(d, int) else 2 for d in x_value.shape]  # type: ignore[union-attr]
    rng = np.random.default_rng(0)
    feeds = [rng.standard_normal(shape).astype(np.float32) for _ in range(8)]
    want = [ort_run(spec.model, {x_value.name or "": f}) for f in feeds]
    errors: list[str] = []
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        barrier.wait()
        for j in range(25):
            k = (i + j) % len(feeds)
            got = compiled.run({x_value.name or "": feeds[k]})
            for key in want[k]:
                if not np.allclose(got[key], want[k][key], rtol=1e-4, atol=1e-5):
                    errors.append(f"thread {i} call {j}: wrong {key}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert 1 <= len(compiled._free) <= 8  # requests are reused, at most one per concurrent call


# ---------------------------------------------------------------------------------------------
# validate()


def _named(model: onnx.ModelProto) -> ir.Model:
    m = ir.from_proto(model)
    NameFixPass()(m)
    return m


def test_validate_rejects_a_custom_op_only(backend: OpenVINOBackend) -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Bar", ["a"], ["b"], name="bar", domain="com.acme"),
        helper.make_node("LayerNormalization", ["b", "s", "c"], ["ln"], name="ln", axis=-1),
        helper.make_node("Softmax", ["ln"], ["y"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [
            numpy_helper.from_array(np.ones(4, np.float32), "s"),
            numpy_helper.from_array(np.zeros(4, np.float32), "c"),
        ],
    )
    # A custom op's output type is known only when the model says it (no schema to infer it from);
    # without it OpenVINO cannot type what follows, and ferry conservatively leaves that to ORT.
    graph.value_info.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 4]))
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.acme", 1)]
    )
    rejected = backend.validate(_named(model), ["relu", "bar", "ln", "softmax"])
    assert list(rejected) == ["bar"]
    assert "no conversion for com.acme.Bar" in rejected["bar"]
    assert backend.validate(_named(model), ["relu", "ln"]) == {}


def test_validate_rejects_what_the_cpu_plugin_does_not_run(backend: OpenVINOBackend) -> None:
    # The CPU plugin runs Unsqueeze only with constant axes: computed axes are refused.
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Unsqueeze", ["r", "axes"], ["u"], name="unsqueeze"),
        helper.make_node("Unsqueeze", ["r", "const_axes"], ["v"], name="unsqueeze_const"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4]),
            helper.make_tensor_value_info("axes", TensorProto.INT64, [1]),
        ],
        [
            helper.make_tensor_value_info("u", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("v", TensorProto.FLOAT, None),
        ],
        [numpy_helper.from_array(np.array([0], np.int64), "const_axes")],
    )
    model = _named(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    rejected = backend.validate(model, ["relu", "unsqueeze", "unsqueeze_const"])
    assert "unsqueeze" in rejected and "CPU plugin does not support" in rejected["unsqueeze"]
    assert "unsqueeze_const" not in rejected and "relu" not in rejected
    # The rules already say so, before the engine is asked.
    table = RuleTable(backend.rules())
    by_name = {n.name: n for n in model.graph}
    assert "must be a constant" in str(table.supports(by_name["unsqueeze"], model.opset_imports))
    assert table.supports(by_name["unsqueeze_const"], model.opset_imports) is True


def test_validate_maps_decomposed_ops_to_their_node(backend: OpenVINOBackend) -> None:
    # LayerNormalization becomes MVN, Multiply, Add...: the generated names map back to "ln".
    from ferry.backends._openvino_query import _convert_partially, _OwnerMap

    graph = helper.make_graph(
        [helper.make_node("LayerNormalization", ["x", "s", "c"], ["y"], name="ln", axis=-1)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [
            numpy_helper.from_array(np.ones(4, np.float32), "s"),
            numpy_helper.from_array(np.zeros(4, np.float32), "c"),
        ],
    )
    model = _named(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    ov_model, unconverted = _convert_partially(model)
    assert not unconverted
    owners = _OwnerMap(model, ov_model)
    compute = [
        op
        for op in ov_model.get_ordered_ops()
        if op.get_type_name() not in ("Parameter", "Result", "Constant")
    ]
    assert len(compute) > 1  # a real decomposition
    assert all(owners.of(op) == {"ln"} for op in compute)


@pytest.mark.torch
@pytest.mark.parametrize("name", ZOO)
def test_rules_and_engine_take_every_zoo_node(
    backend: OpenVINOBackend, zoo_models: dict[str, ir.Model], name: str
) -> None:
    model = zoo_models[name].clone()
    NameFixPass()(model)
    table = RuleTable(backend.rules())
    refused = {
        n.name: reason
        for n in model.graph
        if (reason := table.supports(n, model.opset_imports)) is not True
    }
    assert refused == {}
    assert backend.validate(model, [n.name or "" for n in model.graph]) == {}


# ---------------------------------------------------------------------------------------------
# Conformance: ONNX's node test cases for what the rules claim


def _node_cases() -> list[Any]:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    return [c for c in cases if len(c.model.graph.node) == 1 and not c.name.endswith("_expanded")]


def _arrays(values: list[Any]) -> list[np.ndarray] | None:
    out = []
    for v in values:
        if isinstance(v, TensorProto):
            v = numpy_helper.to_array(v)
        if v is None or isinstance(v, (list, tuple, dict)):
            return None
        out.append(np.asarray(v))
    return out


def _forms(case: Any) -> Iterator[tuple[str, onnx.ModelProto, list[np.ndarray]]]:
    """The case as written, and with every input but the first an initializer."""
    inputs = _arrays(case.data_sets[0][0])
    if inputs is None:
        return
    yield "as-is", case.model, inputs
    if len(case.model.graph.input) >= 2:
        model = onnx.ModelProto()
        model.CopyFrom(case.model)
        for vi, array in zip(list(model.graph.input)[1:], inputs[1:]):
            tensor = numpy_helper.from_array(array, vi.name)
            tensor.data_type = vi.type.tensor_type.elem_type
            model.graph.initializer.append(tensor)
        first = model.graph.input[0]
        del model.graph.input[1:]
        assert model.graph.input[0] is first
        yield "const", model, inputs[:1]


def _claimed_forms(full: bool) -> list[Any]:
    table = RuleTable(OpenVINOBackend().rules())
    params, seen = [], set()
    for case in _node_cases():
        op = case.model.graph.node[0].op_type
        if not full and op in seen:
            continue
        for form, model, inputs in _forms(case):
            m = _named(model)
            node = next(iter(m.graph))
            if table.supports(node, m.opset_imports) is True:
                params.append(pytest.param(case, m, inputs, id=f"{case.name}-{form}"))
                seen.add(op)
                if not full:
                    break
    return params


def _check_case(
    backend: OpenVINOBackend, case: Any, model: ir.Model, inputs: list[np.ndarray]
) -> None:
    node = next(iter(model.graph))
    assert backend.validate(model, [node.name or ""]) == {}
    compiled = backend.compile(spec_for(model))
    names = [v.name or "" for v in model.graph.inputs]
    got = compiled.run(dict(zip(names, inputs)))
    expected = _arrays(case.data_sets[0][1])
    assert expected is not None
    for value, want in zip(model.graph.outputs, expected):
        have = got[value.name or ""]
        assert have.dtype == want.dtype and have.shape == want.shape
        if want.dtype.kind in "fc":
            tight = want.dtype != np.float16
            np.testing.assert_allclose(
                have,
                want,
                rtol=max(case.rtol, 1e-3 if tight else 1e-2),
                atol=max(case.atol, 1e-5 if tight else 1e-3),
            )
        else:
            np.testing.assert_array_equal(have, want)


@pytest.mark.parametrize(("case", "model", "inputs"), _claimed_forms(full=False))
def test_node_conformance_one_case_per_claimed_op(
    backend: OpenVINOBackend, case: Any, model: ir.Model, inputs: list[np.ndarray]
) -> None:
    _check_case(backend, case, model, inputs)


@pytest.mark.slow
def test_node_conformance_every_claimed_case(backend: OpenVINOBackend) -> None:
    failures = []
    for param in _claimed_forms(full=True):
        case, model, inputs = param.values
        try:
            _check_case(backend, case, model, inputs)
        except AssertionError as e:
            failures.append(f"{param.id}: {str(e).strip().splitlines()[0]}")
    assert not failures, failures


def _quantizing_chain(refused: bool) -> ir.Model:
    """Relu -> Mul -> [DynamicQuantizeLinear -> DequantizeLinear] -> Sigmoid -> Tanh."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Mul", ["r", "r"], ["m"], name="mul"),
        helper.make_node("Sigmoid", ["d" if refused else "m"], ["sg"], name="sig"),
        helper.make_node("Tanh", ["sg"], ["y"], name="tanh"),
    ]
    if refused:
        nodes[2:2] = [
            helper.make_node("DynamicQuantizeLinear", ["m"], ["q", "s", "z"], name="dql"),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="deq"),
        ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
    )
    return prepare(
        ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    )


def test_placement_takes_the_whole_model_or_splits_minimally_around_a_refused_op() -> None:
    from ferry.backends import explain

    whole = explain(_quantizing_chain(refused=False), ["openvino", "onnxruntime"])
    assert [p.backend for p in whole.plan.partitions] == ["openvino"]
    assert whole.cost().boundary_tensors == 0
    # OpenVINO refuses DynamicQuantizeLinear (it rounds differently from ONNX): only that node
    # leaves it, and everything after goes back to OpenVINO.
    model = _quantizing_chain(refused=True)
    split = explain(model, ["openvino", "onnxruntime"], min_partition_size=1)
    assert [(p.backend, p.nodes) for p in split.plan.partitions] == [
        ("openvino", ("relu", "mul")),
        ("onnxruntime", ("dql",)),
        ("openvino", ("deq", "sig", "tanh")),
    ]
    assert "rounds differently" in split.node("dql").reasons["openvino"]
    # By default a two-node stretch is not worth its own engine call: it joins the refused
    # node's partition, one boundary fewer.
    folded = explain(model, ["openvino", "onnxruntime"])
    assert [(p.backend, p.nodes) for p in folded.plan.partitions] == [
        ("onnxruntime", ("relu", "mul", "dql")),
        ("openvino", ("deq", "sig", "tanh")),
    ]
