from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

import ferry
import models
from ferry.errors import (
    BackendUnavailableError,
    ExecutionError,
    InvalidInputError,
    UnsupportedOpError,
)
from ferry.plan import Plan

RNG = np.random.default_rng(0)


def raw_ort(model: onnx.ModelProto | Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)


def test_run_matches_raw_onnxruntime(mlp_path: Path) -> None:
    session = ferry.load(mlp_path)
    for batch in (1, 3, 17):
        x = RNG.standard_normal((batch, 16)).astype(np.float32)
        out = session.run({"x": x})
        assert list(out) == ["y"]
        np.testing.assert_array_equal(out["y"], raw_ort(mlp_path, {"x": x})[0])


def test_specs_keep_symbolic_dims() -> None:
    session = ferry.load(models.two_inputs())
    assert [(s.name, s.shape, s.dtype) for s in session.inputs] == [
        ("a", ("batch", 4), np.dtype("float32")),
        ("b", ("batch", 4), np.dtype("float32")),
        ("k", (), np.dtype("int64")),
    ]
    assert [(s.name, s.dtype) for s in session.outputs] == [("sum", np.float32), ("mask", np.bool_)]
    assert session.input_names == ["a", "b", "k"] and session.output_names == ["sum", "mask"]
    assert "a: float32 [batch, 4]" in repr(session)


def _two_inputs_feeds(batch: int = 2) -> dict[str, np.ndarray]:
    a = RNG.standard_normal((batch, 4)).astype(np.float32)
    b = RNG.standard_normal((batch, 4)).astype(np.float32)
    return {"a": a, "b": b, "k": np.array(3, dtype=np.int64)}


def test_multiple_inputs_outputs_and_requested_outputs() -> None:
    model = models.two_inputs()
    session = ferry.load(model)
    feeds = _two_inputs_feeds()
    out = session.run(feeds)
    expected = raw_ort(model, feeds)
    np.testing.assert_array_equal(out["sum"], expected[0])
    np.testing.assert_array_equal(out["mask"], expected[1])
    only = session.run(feeds, outputs=["mask"])
    assert list(only) == ["mask"]
    assert list(session.run(feeds, outputs="sum")) == ["sum"]
    with pytest.raises(InvalidInputError, match=r"unknown output 'nope'.*'sum', 'mask'"):
        session.run(feeds, outputs=["nope"])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: f.pop("b"), r"missing input 'b'; the model takes 'a' \(float32 \[batch, 4\]\)"),
        (lambda f: f.update(c=f["a"]), r"unknown input 'c'; the model takes 'a'"),
        (
            lambda f: f.update(a=f["a"].astype(np.float64)),
            r"input 'a' must be float32, got float64",
        ),
        (lambda f: f.update(k=np.array(3, dtype=np.int32)), r"input 'k' must be int64, got int32"),
        (
            lambda f: f.update(a=f["a"][0]),
            r"input 'a' must have 2 dims \[batch, 4\], got shape \[4\]",
        ),
        (lambda f: f.update(a=np.zeros((2, 5), np.float32)), r"input 'a' dim 1 must be 4, got 5"),
        (lambda f: f.update(b=np.zeros((3, 4), np.float32)), r"dim 'batch' must be the same size"),
        (lambda f: f.update(a=[[1.0] * 4] * 2), r"input 'a' must be float32, got float64"),
        (lambda f: f.update(a=object()), r"input 'a' must be float32, got object"),
    ],
)
def test_bad_inputs_are_named(change, message: str) -> None:
    session = ferry.load(models.two_inputs())
    feeds = _two_inputs_feeds()
    change(feeds)
    with pytest.raises(InvalidInputError, match=message):
        session.run(feeds)


def test_inputs_must_be_a_mapping() -> None:
    session = ferry.load(models.mlp())
    with pytest.raises(InvalidInputError, match="must be a dict"):
        session.run([np.zeros((1, 16), np.float32)])  # type: ignore[arg-type]


def test_array_likes_of_the_right_dtype_are_accepted() -> None:
    session = ferry.load(models.two_inputs())
    feeds = _two_inputs_feeds()
    feeds["k"] = np.int64(2)  # a numpy scalar, not an ndarray
    assert session.run(feeds)["sum"].shape == (2, 4)


def test_optional_initializer_inputs_can_be_overridden() -> None:
    session = ferry.load(models.initializer_as_input())
    assert [s.name for s in session.inputs] == ["x"]
    x = np.zeros((2, 4), np.float32)
    np.testing.assert_array_equal(session.run({"x": x})["y"], np.full((2, 4), 10.0, np.float32))
    out = session.run({"x": x, "bias": np.ones(4, np.float32)})["y"]
    np.testing.assert_array_equal(out, np.ones((2, 4), np.float32))
    with pytest.raises(InvalidInputError, match="'bias' must be float32"):
        session.run({"x": x, "bias": np.ones(4)})


def test_ir3_initializer_inputs_are_constants() -> None:
    # Before IR 4 every initializer was listed as an input; engines treat them as constants.
    session = ferry.load(models.initializer_as_input(ir_version=3))
    x = np.zeros((2, 4), np.float32)
    np.testing.assert_array_equal(session.run({"x": x})["y"], np.full((2, 4), 10.0, np.float32))
    with pytest.raises(InvalidInputError, match="unknown input 'bias'"):
        session.run({"x": x, "bias": np.ones(4, np.float32)})


def test_string_inputs() -> None:
    session = ferry.load(models.strings())
    out = session.run({"text": np.array(["a", "bc"])})["out"]
    assert list(out) == ["a", "bc"]
    with pytest.raises(InvalidInputError, match="must be string"):
        session.run({"text": np.array([1.0])})


def test_control_flow_model_runs() -> None:
    session = ferry.load(models.with_if())
    x = np.ones((3, 4), np.float32)
    np.testing.assert_array_equal(session.run({"x": x})["y"], 2 * x)
    np.testing.assert_array_equal(session.run({"x": -x})["y"], x)


def test_external_data_model_runs_from_file_and_from_memory(tmp_path: Path) -> None:
    path = models.save_external(models.mlp(), tmp_path / "ext.onnx")
    x = RNG.standard_normal((2, 16)).astype(np.float32)
    expected = raw_ort(models.mlp(), {"x": x})[0]
    np.testing.assert_array_equal(ferry.load(path).run({"x": x})["y"], expected)
    in_memory = ir.load(path)  # external tensors, handed over without a path
    np.testing.assert_array_equal(ferry.load(in_memory).run({"x": x})["y"], expected)


def test_engine_failure_is_an_execution_error() -> None:
    session = ferry.load(models.reshape_to([5, -1]))
    assert session.run({"x": np.zeros((5, 2), np.float32)})["y"].shape == (5, 2)
    with pytest.raises(ExecutionError, match="onnxruntime failed"):
        session.run({"x": np.zeros((3, 3), np.float32)})


def test_unsupported_ops_are_all_reported() -> None:
    with pytest.raises(UnsupportedOpError) as info:
        ferry.load(models.custom_ops())
    err = info.value
    assert sorted(err.ops) == [
        ("Rellu", "typo"),
        ("acme::FancyAct", "fancy1"),
        ("acme::FancyAct", "fancy2"),
    ]
    assert "acme::FancyAct x2" in str(err) and "Rellu x1" in str(err)


def test_unknown_backend_and_bad_threads() -> None:
    with pytest.raises(BackendUnavailableError, match="unknown backend 'nope'.*onnxruntime"):
        ferry.load(models.mlp(), backends=["nope"])
    with pytest.raises(InvalidInputError, match="threads"):
        ferry.load(models.mlp(), threads=0)
    with pytest.raises(InvalidInputError, match="backends is empty"):
        ferry.load(models.mlp(), backends=[])


def test_threads_option_reaches_the_engine() -> None:
    session = ferry.load(models.mlp(), threads=1, backends="onnxruntime")
    compiled = session._compiled[0]
    assert compiled.session.get_session_options().intra_op_num_threads == 1  # type: ignore[attr-defined]


def test_load_never_changes_the_source(tmp_path: Path) -> None:
    proto = models.mlp()
    for node in proto.graph.node:
        node.name = ""  # ferry names nodes for its plan, but on its own copy
    path = tmp_path / "unnamed.onnx"
    onnx.save(proto, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    model = ir.load(path)
    session = ferry.load(model)
    assert all(n.name for n in session.model.graph)
    assert all(not n.name for n in model.graph)
    ferry.load(path).run({"x": np.zeros((1, 16), np.float32)})
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def test_plan_is_one_partition_and_round_trips(tmp_path: Path) -> None:
    session = ferry.load(models.mlp())
    plan = session.plan
    assert plan.backends == ["onnxruntime"]
    assert len(plan.partitions) == 1
    (part,) = plan.partitions
    assert part.nodes == ("fc1", "relu", "fc2", "softmax")
    assert (part.inputs, part.outputs) == (("x",), ("y",))
    plan.save(tmp_path / "plan.json")
    assert Plan.load(tmp_path / "plan.json") == plan
    again = ferry.load(models.mlp(), plan=Plan.load(tmp_path / "plan.json"))
    x = np.ones((1, 16), np.float32)
    np.testing.assert_array_equal(again.run({"x": x})["y"], session.run({"x": x})["y"])


def test_plan_json_errors() -> None:
    with pytest.raises(ferry.FerryError, match="not valid JSON"):
        Plan.from_json("{")
    with pytest.raises(ferry.FerryError, match="format"):
        Plan.from_json('{"format": 99}')
    with pytest.raises(ferry.FerryError, match="malformed plan"):
        Plan.from_json('{"format": 1, "partitions": []}')


def test_run_is_thread_safe() -> None:
    session = ferry.load(models.mlp())
    xs = [RNG.standard_normal((2, 16)).astype(np.float32) for _ in range(8)]
    expected = [session.run({"x": x})["y"] for x in xs]
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for _ in range(50):
                np.testing.assert_array_equal(session.run({"x": xs[i]})["y"], expected[i])
        except BaseException as e:  # collected and re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_a_model_changed_after_loading_runs_as_changed(mlp_path: Path) -> None:
    from ferry.graph import load_model

    model = load_model(mlp_path)
    softmax = next(n for n in model.graph if n.op_type == "Softmax")
    softmax.attributes["axis"] = ir.AttrInt64("axis", 0)  # softmax over the batch instead
    x = RNG.standard_normal((3, 16)).astype(np.float32)
    changed = ferry.load(model).run({"x": x})["y"]
    assert np.allclose(changed.sum(axis=0), 1.0, atol=1e-5)
    assert not np.allclose(changed, ferry.load(mlp_path).run({"x": x})["y"])
