"""A vendor adapter shipped as its own package (``examples/vendor_adapter``) is found through the
``ferry.backends`` entry point and takes exactly the nodes its rules and its SDK's veto allow.

The adapter is an example, never installed into the environment: the ``acme_npu`` fixture
(``tests/conftest.py``) registers it for each test, as installing it would."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

import ferry
from ferry.backends import (
    ENTRY_POINT_GROUP,
    BackendBase,
    DeviceInfo,
    explain,
    get_backend,
    known_backends,
)
from ferry.errors import InvalidInputError

pytestmark = pytest.mark.torch


def test_the_entry_point_registers_the_adapter(acme_npu: str) -> None:
    points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    assert "acme_npu" in {ep.name for ep in points}
    assert "acme_npu" in known_backends()
    backend = get_backend("acme_npu")
    assert type(backend).__module__ == "ferry_acme_npu"  # ferry's own code knows nothing of it
    assert backend.device == "npu" and backend.available()
    assert backend.simulated is True  # so backends="auto" never picks it


def test_the_adapter_is_thin_on_the_base(acme_npu: str) -> None:
    """It fills in the lifecycle's steps (devices, options, rules and veto, compile, load) and
    takes every other default from ``BackendBase``."""
    backend = get_backend(acme_npu)
    cls = type(backend)
    assert [d for d in backend.devices()] == [
        DeviceInfo(
            "npu:0", "npu", {"name": "Acme NPU (simulated)", "cores": "4", "memory": "512 MiB"}
        )
    ]
    spec = backend.options["cores"]
    assert (spec.type, spec.default, spec.choices) == (int, 1, (1, 2, 4))
    assert backend.dynamic_shapes is True
    own = {n for n in vars(cls) if not n.startswith("_")}
    assert own == {
        "name", "device", "precisions", "install_hint", "simulated", "options", "dynamic_shapes",
        "version", "available", "devices", "rules", "validate", "compile", "load",
    }  # fmt: skip
    assert cls.capability is BackendBase.capability  # its rules and veto answer


def test_the_adapter_runs_with_its_cores_option_and_refuses_a_bad_one(acme_npu: str) -> None:
    from ferry import zoo

    model = zoo.build("digits_cnn")
    feeds = zoo.example_inputs("digits_cnn", batch=2)
    session = ferry.load(model, backends=acme_npu, options={acme_npu: {"cores": 2}})
    got = next(iter(session.run(feeds).values()))
    np.testing.assert_allclose(got, ort_outputs(model, feeds)[0], rtol=1e-4, atol=1e-5)
    for bad, said in (
        ({"cores": 3}, "option 'cores' takes an int, one of 1, 2, 4; got 3"),
        ({"cores": "4"}, "got '4' (str)"),
        ({"npu": 1}, "unknown option 'npu'; it takes cores, precision, threads"),
    ):
        with pytest.raises(InvalidInputError) as caught:
            ferry.load(model, backends=acme_npu, options={acme_npu: bad})
        assert str(caught.value).startswith("acme_npu: ") and said in str(caught.value)


def test_the_adapter_is_not_installed() -> None:
    """Outside the fixture nothing knows of it: an example is no part of a user's environment."""
    assert "acme_npu" not in known_backends(), (
        "the example adapter is installed here (pip uninstall ferry-acme-npu); "
        "scripts/setup.sh must not install it"
    )
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution("ferry-acme-npu")


def ort_outputs(model: ir.Model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


@pytest.mark.parametrize("name", ["digits_cnn", "mobilenet_v2"])
def test_partitioned_by_rules_and_veto_and_correct(
    name: str, tmp_path: Path, acme_npu: str
) -> None:
    from ferry import zoo

    model = zoo.build(name)
    report = explain(model, ["acme_npu"])
    groups = _groups(model)
    on_npu = {v.node for v in report.nodes if v.backend == "acme_npu"}
    assert on_npu, "the NPU took nothing"
    for v in report.nodes:
        if v.backend == "acme_npu":
            assert v.op_type in {"Conv", "Relu", "MaxPool", "Add", "Gemm", "Flatten"}
        if v.op_type == "Conv" and groups.get(v.node, 1) > 1:
            # The rules claim every float Conv; the SDK's veto refuses the grouped ones.
            assert v.backend == "onnxruntime"
            assert "grouped (depthwise)" in v.reasons["acme_npu"]
    if name == "mobilenet_v2":
        assert any("grouped (depthwise)" in r for v in report.nodes for r in v.reasons.values())

    cache = tmp_path / "cache"
    feeds = zoo.example_inputs(name, batch=3)
    want = ort_outputs(model, feeds)
    cold = ferry.load(model, backends="acme_npu", cache_dir=cache)
    assert "acme_npu" in cold.plan.backends and "compiled" in cold.engine_origins
    warm = ferry.load(model, backends="acme_npu", cache_dir=cache)
    assert "loaded" in warm.engine_origins and "compiled" not in warm.engine_origins
    for session in (cold, warm):
        got = session.run(feeds)
        np.testing.assert_allclose(next(iter(got.values())), want[0], rtol=1e-4, atol=1e-5)


def _groups(model: ir.Model) -> dict[str, int]:
    """Each Conv's ``group`` by node name, as the partitioner names the nodes."""
    from ferry.graph import prepare

    named = prepare(model)
    return {
        node.name or "": node.attributes["group"].as_int() if "group" in node.attributes else 1
        for node in named.graph
        if node.op_type == "Conv"
    }
