"""The ``iree`` backend on small models built here: registration, options, devices, the
compiled form, and compile + run against ONNX Runtime (several outputs, int64/bool/scalar
outputs, a dynamic batch), the engine cache, threads, and bad input.

Modules here import ``ferry_iree`` inside their tests: the conftest skips them (fails them in
CI) where the plugin is missing.
"""

from __future__ import annotations

import threading

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import ferry
from ferry import zoo
from ferry.backends import BackendBase, check_options, explain, known_backends
from ferry.errors import ExecutionError, FerryError, InvalidInputError


def several_outputs() -> ir.Model:
    """One input, four outputs of four kinds: float, int64 (ArgMax), bool, a float scalar."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]),
        helper.make_tensor_value_info("arg", TensorProto.INT64, ["N"]),
        helper.make_tensor_value_info("pos", TensorProto.BOOL, ["N", 4]),
        helper.make_tensor_value_info("total", TensorProto.FLOAT, []),
    ]
    nodes = [
        helper.make_node("Relu", ["x"], ["y"], name="relu"),
        helper.make_node("ArgMax", ["x"], ["arg"], axis=1, keepdims=0, name="argmax"),
        helper.make_node("Greater", ["x", "y"], ["pos"], name="greater"),
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0, name="sum"),
    ]
    graph = helper.make_graph(nodes, "several", [x], outputs)
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _reference(model: ir.Model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return ferry.load(model, backends=["onnxruntime"], cache_dir=False).run(feeds)


# ------------------------------------------------------------------------- without compiling


def test_registered_through_the_entry_point(iree: BackendBase) -> None:
    from ferry_iree import IreeBackend

    assert "iree" in known_backends()
    assert isinstance(iree, IreeBackend)
    assert iree.available()
    assert iree.version.startswith("3.13")
    assert iree.precisions == ("fp32",)
    assert iree.engine_cache is True and iree.ranked_inputs and iree.dynamic_shapes
    assert "ferry-iree" in iree.install_hint


def test_devices_name_the_cpu_and_its_features(iree: BackendBase) -> None:
    (cpu,) = iree.devices()
    assert (cpu.name, cpu.kind) == ("cpu", "cpu")
    assert "local-task" in cpu.properties["drivers"]
    assert "sse2" in cpu.properties["cpu_features"] or cpu.properties["cpu_features"]


def test_options_are_checked(iree: BackendBase) -> None:
    check_options(iree, {"target_cpu": "generic", "threads": 2})
    with pytest.raises(InvalidInputError, match=r"target_cpu.*str"):
        check_options(iree, {"target_cpu": 3})
    with pytest.raises(InvalidInputError, match=r"unknown option 'cores'.*target_cpu"):
        check_options(iree, {"cores": 2})
    with pytest.raises(InvalidInputError, match="precision 'fp16'"):
        check_options(iree, {"precision": "fp16"})


def test_the_compiled_form_round_trips_and_a_stranger_is_refused() -> None:
    from ferry_iree import Engine
    from ferry_iree._blob import pack, unpack

    engine = Engine(b"\x00vmfb", "main", ("a", "b"), ("y",))
    assert unpack(pack(engine)) == engine
    with pytest.raises(ValueError, match="not a ferry IREE engine"):
        unpack(b"something else")


def test_compiler_messages_become_one_line() -> None:
    from ferry_iree._compile import compiler_reason

    legalize = (
        "Error invoking IREE compiler tool iree-compile\nDiagnostics:\n<stdin>:4:10: error: "
        "failed to legalize operation 'torch.operator' that was explicitly marked illegal: "
        '%1 = "torch.operator"(%arg0) <{name = "onnx.STFT"}> : (...)'
    )
    assert compiler_reason(legalize) == (
        "failed to legalize onnx.STFT: IREE has no lowering for it in this form"
    )
    crash = "Error invoking IREE compiler tool iree-compile\nError code: -11\nStack dump:"
    assert compiler_reason(crash) == "iree-compile crashed (signal 11) on it"


# ------------------------------------------------------------------------------- compiling


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "digits_cnn"])
def test_zoo_models_match_onnxruntime_at_two_batches(name: str) -> None:
    model = zoo.build(name)
    session = ferry.load(model, backends=["iree"], cache_dir=False)
    assert [p.backend for p in session.plan.partitions] == ["iree"]
    for batch in (1, 3):  # one module, compiled once, at both batches (a symbolic batch)
        feeds = zoo.example_inputs(name, batch=batch)
        got, want = session.run(feeds), _reference(model, feeds)
        for key, value in want.items():
            np.testing.assert_allclose(got[key], value, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_several_outputs_of_several_dtypes_are_named() -> None:
    model = several_outputs()
    session = ferry.load(model, backends=["iree"], cache_dir=False)
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)}
    got, want = session.run(feeds), _reference(model, feeds)
    assert list(got) == ["y", "arg", "pos", "total"]
    for key, value in want.items():
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
        np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-5)
    only = session.run(feeds, outputs=["arg"])
    assert list(only) == ["arg"]


@pytest.mark.slow
def test_scalar_inputs_and_uint8_outputs() -> None:
    """Scalars stay 0-d on the way in (IREE checks ranks); uint8, which IREE's signless integers
    return as int8, comes back as the model declares it."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [5])
    lo = helper.make_tensor_value_info("lo", TensorProto.FLOAT, [])
    hi = helper.make_tensor_value_info("hi", TensorProto.FLOAT, [])
    q = helper.make_tensor_value_info("q", TensorProto.UINT8, [5])
    nodes = [
        helper.make_node("Clip", ["x", "lo", "hi"], ["c"], name="clip"),
        helper.make_node("Cast", ["c"], ["q"], to=TensorProto.UINT8, name="cast"),
    ]
    graph = helper.make_graph(nodes, "scalars", [x, lo, hi], [q])
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    feeds = {
        "x": np.array([0, 3, 130, 200, 255], np.float32),
        "lo": np.array(2, np.float32),
        "hi": np.array(250, np.float32),
    }
    got = ferry.load(model, backends=["iree"], cache_dir=False).run(feeds)["q"]
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, _reference(model, feeds)["q"])


@pytest.mark.slow
def test_a_second_load_compiles_nothing(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ferry_iree import _backend

    model = zoo.build("digits_cnn")
    feeds = zoo.example_inputs("digits_cnn", batch=2)
    first = ferry.load(model, backends=["iree"], cache_dir=tmp_path)
    assert first.engine_origins == ["compiled"]
    calls: list[str] = []
    real = _backend.compile_mlir
    monkeypatch.setattr(
        _backend, "compile_mlir", lambda *a, **k: calls.append("compile") or real(*a, **k)
    )
    second = ferry.load(model, backends=["iree"], cache_dir=tmp_path)
    assert second.engine_origins == ["loaded"]
    assert calls == []  # neither a trial nor a build: the trials are remembered too
    np.testing.assert_array_equal(second.run(feeds)["logits"], first.run(feeds)["logits"])


@pytest.mark.slow
def test_one_thread_and_calls_from_several_threads_at_once() -> None:
    model = zoo.build("digits_cnn")
    feeds = [zoo.example_inputs("digits_cnn", batch=2, seed=s) for s in range(4)]
    one = ferry.load(model, backends=["iree"], threads=1, cache_dir=False)
    want = [one.run(f)["logits"] for f in feeds]
    shared = ferry.load(model, backends=["iree"], cache_dir=False)
    got: dict[int, np.ndarray] = {}

    def call(i: int) -> None:
        for _ in range(5):
            got[i] = shared.run(feeds[i])["logits"]

    workers = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    for i in range(4):
        np.testing.assert_allclose(got[i], want[i], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_bad_input_is_one_clear_error() -> None:
    from ferry_iree import IreePartition

    model = zoo.build("digits_cnn")
    session = ferry.load(model, backends=["iree"], cache_dir=False)
    good = zoo.example_inputs("digits_cnn", batch=1)
    (name,) = good
    with pytest.raises(InvalidInputError, match=name):
        session.run({name: good[name].astype(np.int32)})
    with pytest.raises(InvalidInputError, match=name):
        session.run({name: good[name][0]})
    # The partition itself, called past ferry's checks, names the shapes IREE refused.
    partition = session._single
    assert isinstance(partition, IreePartition)
    with pytest.raises(ExecutionError, match=r"iree: the module refused inputs .*float32\[1, 1, 9"):
        partition.run({name: np.zeros((1, 1, 9, 9), np.float32)})
    with pytest.raises(InvalidInputError, match="missing input"):
        partition.run({})


def cubic_resize(*nodes: object) -> ir.Model:
    """x [1, 1, 4, 4] -> ``nodes`` around a cubic Resize with exclude_outside=1 (``r`` -> ``s``),
    which passes IREE's op table but which IREE's compiler has no lowering for."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 8, 8])
    weights = [
        helper.make_tensor("roi", TensorProto.FLOAT, [0], []),
        helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, 2, 2]),
    ]
    resize = helper.make_node(
        "Resize", ["r", "roi", "scales"], ["s"], mode="cubic", exclude_outside=1, name="resize"
    )
    graph = helper.make_graph([*nodes, resize], "refused", [x], [y], initializer=weights)  # type: ignore[list-item]
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.slow
def test_a_refused_node_carries_iree_reason_and_runs_elsewhere() -> None:
    model = cubic_resize(
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Sigmoid", ["s"], ["y"], name="sigmoid"),
    )
    report = explain(model, backends=["iree", "onnxruntime"])
    verdicts = {v.node: v for v in report.nodes}
    reason = str(verdicts["resize"].reasons.get("iree", ""))
    assert "failed to legalize onnx.Resize" in reason, verdicts["resize"]
    session = ferry.load(model, backends=["iree", "onnxruntime"], cache_dir=False)
    placed = {n: p.backend for p in session.plan.partitions for n in p.nodes}
    assert placed["resize"] == "onnxruntime"
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 1, 4, 4)).astype(np.float32)}
    np.testing.assert_allclose(session.run(feeds)["y"], _reference(model, feeds)["y"], atol=1e-5)
    # Where ferry asks by rules and lets the engine veto (validate), IREE vetoes it alike.
    from ferry.backends import get_backend

    vetoed = get_backend("iree").validate(report.model, ["resize", "relu"])
    assert list(vetoed) == ["resize"]


@pytest.mark.slow
def test_compile_names_the_op_iree_refuses(iree: BackendBase) -> None:
    """Forced onto IREE (no trial), the compile error names the op and the node."""
    from ferry.backends import CompileSpec
    from ferry.plan import Plan

    model = cubic_resize(helper.make_node("Identity", ["x"], ["r"], name="same"))
    model.graph.outputs[0] = next(v for n in model.graph for v in n.outputs if v.name == "s")
    plan = Plan.whole_graph(model, "iree")
    with pytest.raises(FerryError, match=r"onnx\.Resize.*node 'resize'"):
        iree.compile(CompileSpec(plan.partitions[0], model))
