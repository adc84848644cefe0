"""The adapter lifecycle in the public API: devices and their properties, a context with
validated options, capability asked of the engine by trial (the rules as prefilter, answers
remembered per node signature), and ``ferry info --backends`` listing it all."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import numpy as np
import onnx_ir as ir
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import ferry
from ferry.backends import (
    BackendBase,
    DeviceInfo,
    OpRule,
    OptionSpec,
    check_options,
    explain,
    get_backend,
    trial_capability,
)
from ferry.cli.main import cli
from ferry.errors import BackendUnavailableError, InvalidInputError
from ferry.graph import prepare

# --------------------------------------------------------------------------------------------
# Devices


class Quiet(BackendBase):
    name = "quiet"
    sdk = "numpy"


def test_devices_default_to_the_backend_device_when_available() -> None:
    assert Quiet().devices() == [DeviceInfo("cpu", "cpu", {})]

    class Gpu(Quiet):
        device = "cuda"

    class Npu(Quiet):
        device = "npu"

    class Absent(Quiet):
        sdk = "ferry_no_such_engine_sdk"

    assert [d.kind for d in Gpu().devices()] == ["gpu"]
    assert [(d.name, d.kind) for d in Npu().devices()] == [("npu", "npu")]
    assert Absent().devices() == []  # nothing to run on where the engine is absent


def test_onnxruntime_reports_its_providers() -> None:
    import onnxruntime

    (cpu, *_) = get_backend("onnxruntime").devices()
    assert (cpu.name, cpu.kind) == ("cpu", "cpu")
    assert cpu.properties["providers"] == ", ".join(onnxruntime.get_available_providers())


def test_openvino_reports_its_devices_with_their_full_names() -> None:
    try:
        backend = get_backend("openvino")
    except BackendUnavailableError as e:
        pytest.skip(str(e))
    import openvino

    devices = backend.devices()
    assert [d.name for d in devices] == [d.lower() for d in openvino.Core().available_devices]
    cpu = next(d for d in devices if d.name == "cpu")
    assert cpu.properties["full_device_name"]
    assert "FP32" in cpu.properties["optimization_capabilities"]


def test_litert_reports_the_cpu() -> None:
    try:
        backend = get_backend("litert")
    except BackendUnavailableError as e:
        pytest.skip(str(e))
    (cpu,) = backend.devices()
    assert cpu.kind == "cpu" and int(cpu.properties["cores"]) >= 1


def test_tensorrt_names_each_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through cuda-python's device properties (a stand-in runtime here: no GPU on this tier)."""
    from types import SimpleNamespace

    from ferry.backends import _cuda, _tensorrt

    class Runtime:
        cudaError_t = SimpleNamespace(cudaSuccess=0)

        def cudaGetDeviceCount(self) -> tuple[int, int]:
            return 0, 2

        def cudaGetDeviceProperties(self, index: int) -> tuple[int, SimpleNamespace]:
            name = b"NVIDIA H200\0\0\0" if index == 0 else "NVIDIA L4"
            return 0, SimpleNamespace(name=name, major=9, minor=index, totalGlobalMem=3 << 30)

    runtime = Runtime()
    monkeypatch.setattr(_cuda, "cudart", lambda: runtime)
    monkeypatch.setattr(_tensorrt, "cudart", lambda: runtime)
    monkeypatch.setattr(_tensorrt.TensorRTBackend, "available", lambda self: True)
    assert _tensorrt.TensorRTBackend().devices() == [
        DeviceInfo(
            "cuda:0",
            "gpu",
            {"name": "NVIDIA H200", "compute_capability": "9.0", "memory": "3072 MiB"},
        ),
        DeviceInfo(
            "cuda:1",
            "gpu",
            {"name": "NVIDIA L4", "compute_capability": "9.1", "memory": "3072 MiB"},
        ),
    ]


# --------------------------------------------------------------------------------------------
# Options


class Npu(BackendBase):
    name = "npu_test"
    sdk = "numpy"
    option_keys: frozenset[str] | None = frozenset({"ignored_once_options_are_declared"})
    options: Mapping[str, OptionSpec] = MappingProxyType(
        {
            "cores": OptionSpec("cores", int, 1, (1, 2, 4), "cores to use"),
            "scale": OptionSpec("scale", float, 1.0, None, "a float"),
            "fast": OptionSpec("fast", bool, False, None, "a flag"),
            "mode": OptionSpec("mode", str, "a", ("a", "b"), "a word"),
        }
    )


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"core": 2}, "npu_test: unknown option 'core'; it takes cores, fast, mode, precision, "),
        ({"cores": 3}, "npu_test: option 'cores' takes an int, one of 1, 2, 4; got 3"),
        ({"cores": "2"}, "npu_test: option 'cores' takes an int, one of 1, 2, 4; got '2' (str)"),
        ({"cores": True}, "option 'cores' takes an int, one of 1, 2, 4; got True (bool)"),
        ({"scale": "x"}, "npu_test: option 'scale' takes a float; got 'x' (str)"),
        ({"fast": 1}, "npu_test: option 'fast' takes a bool; got 1 (int)"),
        ({"mode": "c"}, "npu_test: option 'mode' takes a str, one of 'a', 'b'; got 'c'"),
        ({"ignored_once_options_are_declared": 1}, "unknown option"),
    ],
)
def test_declared_options_are_checked_in_one_line(given: dict[str, object], expected: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        check_options(Npu(), given)
    message = str(caught.value)
    assert expected in message and "\n" not in message


def test_valid_options_pass_and_option_keys_still_work() -> None:
    check_options(Npu(), {"cores": 4, "scale": 2, "fast": True, "mode": "b", "threads": 1})

    class Keys(Quiet):
        option_keys: frozenset[str] | None = frozenset({"workspace"})

    check_options(Keys(), {"workspace": "anything", "threads": 2})
    with pytest.raises(InvalidInputError, match="unknown option 'cores'; it takes precision"):
        check_options(Keys(), {"cores": 1})


def test_options_given_to_load_are_checked_before_compiling(acme_npu: str) -> None:
    with pytest.raises(InvalidInputError, match=r"acme_npu: option 'cores' takes an int"):
        ferry.load(_relu_chain(2), backends=acme_npu, options={acme_npu: {"cores": 3}})


# --------------------------------------------------------------------------------------------
# Capability by trial


def _relu_chain(count: int, tail: Sequence[str] = ("Add", "Sigmoid")) -> ir.Model:
    """``count`` identical Relus, then an Add of a weight, then a Sigmoid; named and typed."""
    nodes, previous = [], "x"
    for i in range(count):
        nodes.append(helper.make_node("Relu", [previous], [f"r{i}"], name=f"relu{i}"))
        previous = f"r{i}"
    if "Add" in tail:
        nodes.append(helper.make_node("Add", [previous, "w"], ["added"], name="add"))
        previous = "added"
    if "Sigmoid" in tail:
        nodes.append(helper.make_node("Sigmoid", [previous], ["s"], name="sigmoid"))
        previous = "s"
    nodes.append(helper.make_node("Identity", [previous], ["y"], name="out"))
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])],
        [numpy_helper.from_array(np.ones((1, 8), np.float32), "w")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return prepare(ir.from_proto(proto))


class Tried(BackendBase):
    """An engine asked by trial: it refuses Add (with a two-line message) and counts trials."""

    name = "tried"
    sdk = "numpy"

    def __init__(self) -> None:
        self.trials: list[ir.Model] = []

    def rules(self) -> Sequence[OpRule]:
        return [OpRule("Relu"), OpRule("Add"), OpRule("Identity")]

    def capability(self, model: ir.Model, nodes: Sequence[str]) -> dict[str, bool | str]:
        return trial_capability(self, model, nodes)

    def trial(self, model: ir.Model) -> None:
        self.trials.append(model)
        (node,) = model.graph
        if node.op_type == "Add":
            raise RuntimeError("  error: 'Add' with a broadcast weight is not lowered  \nat x.mlir")


def test_trial_is_asked_once_per_node_signature() -> None:
    model = _relu_chain(50)
    backend = Tried()
    names = [node.name or "" for node in model.graph]
    verdicts = trial_capability(backend, model, names)
    assert all(verdicts[f"relu{i}"] is True for i in range(50))
    ops = sorted(next(iter(m.graph)).op_type for m in backend.trials)
    assert ops == ["Add", "Identity", "Relu"]  # fifty identical Relus cost one trial
    trial_capability(backend, model, names)
    assert len(backend.trials) == 3  # remembered across calls, in-process
    assert len(Tried().trials) == 0  # ...per backend
    other = Tried()
    trial_capability(other, model, names)
    assert len(other.trials) == 3


def test_a_refused_node_carries_the_engines_first_line_and_rules_prefilter() -> None:
    model = _relu_chain(3)
    backend = Tried()
    verdicts = trial_capability(backend, model, [node.name or "" for node in model.graph])
    assert verdicts["add"] == "error: 'Add' with a broadcast weight is not lowered"
    assert verdicts["sigmoid"] == "Sigmoid is not supported"  # the rules refused it: not tried
    assert "Sigmoid" not in {next(iter(m.graph)).op_type for m in backend.trials}


def test_the_trial_model_is_the_node_alone_with_its_weight_as_initializer() -> None:
    model = _relu_chain(1)
    backend = Tried()
    trial_capability(backend, model, ["add"])
    (alone,) = backend.trials
    assert [v.name for v in alone.graph.inputs] == ["r0"]  # the weight is not fed
    assert list(alone.graph.initializers) == ["w"]
    (x,) = alone.graph.inputs
    assert x.dtype == ir.DataType.FLOAT and x.shape is not None and len(x.shape) == 2
    assert [v.name for v in alone.graph.outputs] == ["added"]
    assert alone.opset_imports[""] == 17


def test_a_constant_node_input_reaches_the_engine_as_a_weight() -> None:
    graph = helper.make_graph(
        [
            helper.make_node(
                "Constant", [], ["c"], name="const", value=numpy_helper.from_array(np.ones(8, "f"))
            ),
            helper.make_node("Add", ["x", "c"], ["y"], name="add_const"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    backend = Tried()
    verdicts = trial_capability(backend, prepare(ir.from_proto(proto)), ["add_const"])
    assert verdicts["add_const"] != True  # noqa: E712 (Tried refuses every Add: it was asked)
    (alone,) = backend.trials
    assert [n.op_type for n in alone.graph] == ["Add"]
    assert list(alone.graph.initializers) == ["c"] and [v.name for v in alone.graph.inputs] == ["x"]


def test_without_rules_every_node_is_tried() -> None:
    class NoRules(Tried):
        def rules(self) -> Sequence[OpRule]:
            raise NotImplementedError

    backend = NoRules()
    verdicts = trial_capability(backend, _relu_chain(2), ["relu0", "add", "sigmoid"])
    assert verdicts == {"relu0": True, "add": verdicts["add"], "sigmoid": True}
    assert "not lowered" in str(verdicts["add"]) and len(backend.trials) == 3


def test_an_engine_that_cannot_be_tried_keeps_its_rules_answer() -> None:
    class Untried(Tried):
        def trial(self, model: ir.Model) -> None:
            raise NotImplementedError

    model = _relu_chain(2)
    verdicts = trial_capability(Untried(), model, ["relu0", "add", "sigmoid"])
    assert verdicts == {"relu0": True, "add": True, "sigmoid": "Sigmoid is not supported"}

    class Neither(Untried):
        def rules(self) -> Sequence[OpRule]:
            raise NotImplementedError

    verdicts = trial_capability(Neither(), model, ["relu0", "add"])
    assert verdicts == dict.fromkeys(["relu0", "add"], "tried declares no op rules")


def test_the_engines_reason_reaches_placement() -> None:
    report = explain(_relu_chain(4), [Tried(), get_backend("onnxruntime")])
    by_node = {v.node: v for v in report.nodes}
    assert by_node["relu1"].backend == "tried"
    assert by_node["add"].backend == "onnxruntime"
    assert "'Add' with a broadcast weight is not lowered" in by_node["add"].reasons["tried"]


# --------------------------------------------------------------------------------------------
# ferry info --backends


def test_info_lists_builtin_and_plugin_backends(acme_npu: str) -> None:
    result = CliRunner().invoke(cli, ["info", "--backends"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "onnxruntime  available, version" in result.output
    assert "providers: " in result.output
    assert "acme_npu  available, version 0.1.0, simulated" in result.output
    assert "device npu:0 (npu): name: Acme NPU (simulated)" in result.output
    assert "cores: int, one of 1, 2, 4 (default 1)" in result.output

    result = CliRunner().invoke(cli, ["info", "--backends", "--json"], catch_exceptions=False)
    rows = {row["name"]: row for row in json.loads(result.output)}
    assert rows["onnxruntime"]["devices"][0]["name"] == "cpu"
    assert rows["acme_npu"]["devices"] == [
        {
            "name": "npu:0",
            "kind": "npu",
            "properties": {"name": "Acme NPU (simulated)", "cores": "4", "memory": "512 MiB"},
        }
    ]
    assert all(row["available"] or row["reason"] for row in rows.values())


def test_info_without_a_model_says_what_to_give() -> None:
    result = CliRunner().invoke(cli, ["info"])
    assert result.exit_code != 0
    assert "ferry info needs a MODEL" in result.output and "--backends" in result.output
