"""The LiteRT backend against ONNX Runtime: small graphs built here, compiled through ferry's own
ONNX -> TFLite lowering; the cache round trip, batches, capability reasons, threads, errors,
concurrent runs, and placement with ONNX Runtime for what the lowering cannot lower."""

from __future__ import annotations

import importlib.metadata
import json
import threading
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper
from onnx_ir.passes.common import NameFixPass

pytest.importorskip("ai_edge_litert")

import ferry
from ferry.backends import CompiledPartition, CompileSpec, get_backend, known_backends
from ferry.backends._litert import LiteRTBackend, LiteRTPartition
from ferry.errors import (
    InvalidInputError,
    ModelLoadError,
    UnsupportedOpError,
)
from ferry.graph import prepare
from ferry.parity import compare_outputs
from ferry.plan import Partition

pytestmark = pytest.mark.tflite

RNG = np.random.default_rng(0)


# ---------------------------------------------------------------------------------------------
# Graphs


def _weight(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.3).astype(np.float32), name)


def cnn(extra: str | None = None, batch: int | str = "N") -> onnx.ModelProto:
    """x[N,3,16,16] -> Conv 3x3 -> Relu -> MaxPool -> [extra op] -> Conv 1x1 -> Relu
    -> GlobalAveragePool -> Flatten -> Gemm -> y[N,10]; ``extra`` (an op on the sigmoid of the
    pooled map, e.g. Asin, which the lowering has no translator for) when given."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Sigmoid", ["p1"], ["s1"], name="sigmoid"),
    ]
    middle = "s1"
    if extra is not None:
        nodes.append(helper.make_node(extra, ["s1"], ["e1"], name="extra"))
        middle = "e1"
    nodes += [
        helper.make_node("Conv", [middle, "w2", "b2"], ["c2"], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], transB=1, name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
        [
            _weight("w1", 8, 3, 3, 3),
            _weight("b1", 8),
            _weight("w2", 16, 8, 1, 1),
            _weight("b2", 16),
            _weight("w3", 10, 16),
            _weight("b3", 10),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def spec_for(model: ir.Model | onnx.ModelProto, **options: Any) -> CompileSpec:
    """A whole-model CompileSpec, nodes named first as ferry.load does."""
    if isinstance(model, onnx.ModelProto):
        model = ir.from_proto(model)
    NameFixPass()(model)
    graph = model.graph
    inputs = tuple(v.name or "" for v in graph.inputs if v.name not in graph.initializers)
    outputs = tuple(v.name or "" for v in graph.outputs)
    nodes = tuple(n.name or "" for n in graph)
    return CompileSpec(
        Partition("litert", nodes, inputs, outputs, dict(options)), model, None, options
    )


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def image(batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)}


def assert_matches(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert got.keys() == want.keys()
    for key in want:
        assert got[key].shape == want[key].shape and got[key].dtype == want[key].dtype
    report = compare_outputs(got, want)
    assert report.passed, report


@pytest.fixture(scope="module")
def backend() -> LiteRTBackend:
    b = get_backend("litert")
    assert isinstance(b, LiteRTBackend)
    return b


# ---------------------------------------------------------------------------------------------
# The adapter


def test_registry_and_identity(backend: LiteRTBackend) -> None:
    assert backend.name == "litert" and backend.device == "cpu"
    assert backend.precisions == ("fp32",)
    assert backend.version == importlib.metadata.version("ai-edge-litert")
    assert backend.available()
    assert "ferry[tflite]" in backend.install_hint
    assert "litert" in known_backends()


def test_compile_run_matches_onnxruntime_in_nchw(backend: LiteRTBackend) -> None:
    model = cnn()
    compiled = backend.compile(spec_for(model))
    assert isinstance(compiled, CompiledPartition) and isinstance(compiled, LiteRTPartition)
    feeds = image()
    assert_matches(compiled.run(feeds), ort_run(model, feeds))
    # Asked for a subset of the outputs: only those.
    assert list(compiled.run(feeds, ["y"])) == ["y"]


def test_serialize_load_round_trip(backend: LiteRTBackend) -> None:
    model = cnn()
    spec = spec_for(model)
    compiled = backend.compile(spec)
    blob = compiled.serialize()
    assert blob[4:8] == b"TFL3"  # a .tflite flatbuffer
    loaded = backend.load(blob, spec)
    feeds = image(seed=3)
    first, second = compiled.run(feeds), loaded.run(feeds)
    np.testing.assert_array_equal(first["y"], second["y"])
    assert_matches(second, ort_run(model, feeds))
    with pytest.raises(ModelLoadError, match="LiteRT refuses"):
        backend.load(b"\0" * 64, spec)


def test_batches_other_than_one_are_lowered_again(backend: LiteRTBackend) -> None:
    model = cnn()
    compiled = backend.compile(spec_for(model))
    for batch in (1, 3, 2, 3):
        feeds = image(batch, seed=batch)
        assert_matches(compiled.run(feeds), ort_run(model, feeds))
    # The cached engine stays the one at the default size (batch 1).
    loaded = backend.load(compiled.serialize(), spec_for(model))
    assert loaded.run(image(1))["y"].shape == (1, 10)


def test_fixed_batch_refuses_another(backend: LiteRTBackend) -> None:
    compiled = backend.compile(spec_for(cnn(batch=2)))
    with pytest.raises(InvalidInputError, match=r"input 'x' has shape \[3, 3, 16, 16\]"):
        compiled.run(image(3))
    with pytest.raises(InvalidInputError, match="shape"):
        compiled.run({"x": np.zeros((2, 3, 16), np.float32)})
    with pytest.raises(InvalidInputError, match="missing"):
        compiled.run({})


def test_threads_option(backend: LiteRTBackend) -> None:
    model = cnn()
    feeds = image(seed=5)
    want = ort_run(model, feeds)
    for threads in (1, 2):
        compiled = backend.compile(spec_for(model, threads=threads))
        assert compiled.threads == threads
        assert_matches(compiled.run(feeds), want)
    assert backend.compile(spec_for(model)).threads >= 1
    for bad in (0, "2", True):
        with pytest.raises(InvalidInputError, match="threads"):
            backend.compile(spec_for(model, threads=bad))
    with pytest.raises(InvalidInputError, match="precision"):
        backend.compile(spec_for(model, precision="fp16"))


def test_concurrent_runs_from_four_threads(backend: LiteRTBackend) -> None:
    model = cnn()
    compiled = backend.compile(spec_for(model))
    cases = [image(seed=s) for s in range(8)]
    wants = [ort_run(model, f)["y"] for f in cases]
    errors: list[str] = []

    def worker(k: int) -> None:
        for i in range(20):
            case = (k + i) % len(cases)
            got = compiled.run(cases[case])["y"]
            if not np.allclose(got, wants[case], rtol=1e-4, atol=1e-5):
                errors.append(f"thread {k} run {i}: wrong result for case {case}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


# ---------------------------------------------------------------------------------------------
# Capability and errors


def test_capability_names_the_lowerings_reasons(backend: LiteRTBackend) -> None:
    model = prepare(ir.from_proto(cnn("Asin")))
    names = [n.name or "" for n in model.graph]
    verdicts = backend.capability(model, names)
    assert verdicts["extra"] == "Asin: TFLite has no builtin op for it"
    assert all(verdicts[n] is True for n in names if n != "extra"), verdicts
    assert backend.validate(model, names) == {"extra": verdicts["extra"]}
    # The rules (placement without asking the engine) name the translated ops only.
    assert {r.op_type for r in backend.rules()} >= {"Conv", "Gemm", "Relu"}
    assert "Asin" not in {r.op_type for r in backend.rules()}


def test_capability_refuses_types_it_does_not_exchange(backend: LiteRTBackend) -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["x"], ["d"], to=TensorProto.DOUBLE, name="to_double"),
            helper.make_node("Relu", ["d"], ["y"], name="relu"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [1, 4])],
    )
    model = prepare(ir.from_proto(helper.make_model(graph)))
    verdicts = backend.capability(model, ["to_double", "relu"])
    assert (
        verdicts["to_double"]
        == "output 0 has dtype float64, which the TFLite lowering does not compute"
    )
    assert "float64" in str(verdicts["relu"])


def test_capability_needs_static_sizes_besides_the_batch(backend: LiteRTBackend) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, "H", "W"])],
    )
    model = prepare(ir.from_proto(helper.make_model(graph)))
    verdict = backend.capability(model, ["relu"])["relu"]
    assert isinstance(verdict, str) and "static sizes" in verdict and "'x'" in verdict


def test_compile_unsupported_op_names_the_node(backend: LiteRTBackend) -> None:
    with pytest.raises(UnsupportedOpError, match=r"extra \(Asin\)") as info:
        backend.compile(spec_for(cnn("Asin")))
    assert ("Asin", "extra") in info.value.ops
    assert "litert,onnxruntime" in str(info.value)


# ---------------------------------------------------------------------------------------------
# Through ferry.load and the CLI


def test_load_whole_model_on_litert() -> None:
    model = cnn()
    session = ferry.load(model, backends="litert", cache_dir=False)
    assert [p.backend for p in session.plan.partitions] == ["litert"]
    for batch in (1, 2):
        feeds = image(batch, seed=10 + batch)
        assert_matches(session.run(feeds), ort_run(model, feeds))


def test_load_splits_with_onnxruntime_for_the_rest(tmp_path: Any) -> None:
    model = cnn("Asin")
    session = ferry.load(
        model, backends=["litert", "onnxruntime"], cache_dir=tmp_path, check_pays=False
    )
    backends = [p.backend for p in session.plan.partitions]
    assert backends == ["litert", "onnxruntime", "litert"], backends
    on_ort = [n for p in session.plan.partitions if p.backend == "onnxruntime" for n in p.nodes]
    assert on_ort == ["extra"]
    feeds = image(seed=7)
    assert_matches(session.run(feeds), ort_run(model, feeds))
    # Again, the engines from the cache.
    again = ferry.load(
        model, backends=["litert", "onnxruntime"], cache_dir=tmp_path, check_pays=False
    )
    assert again.engine_origins.count("loaded") == 2
    assert_matches(again.run(feeds), ort_run(model, feeds))


def test_plan_cli_explains_per_node(tmp_path: Any) -> None:
    from ferry.cli.main import cli

    path = tmp_path / "cnn.onnx"
    onnx.save(cnn("Asin"), path)
    args = ["plan", str(path), "--backends", "litert,onnxruntime", "--explain"]
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    nodes = {v["node"]: v for v in found["nodes"]}
    assert nodes["extra"]["backend"] == "onnxruntime"
    assert nodes["extra"]["reasons"]["litert"] == "Asin: TFLite has no builtin op for it"
    assert {v["backend"] for n, v in nodes.items() if n != "extra"} == {"litert"}
    printed = CliRunner().invoke(cli, args)
    assert printed.exit_code == 0 and "litert" in printed.output
