"""``ferry.optimize`` as a whole: what survives it (symbolic dims, If/Loop bodies, functions,
external data, Constant-node weights), idempotence, ``--fix-shapes``, and never worse: a result
that computes something else, runs slower or that a pass failed on is refused and the input kept.
Also ``ferry optimize`` (the command), ``ferry.load(optimize=...)`` and a served model's
``optimize``."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import ferry
import models
from ferry.cli.main import cli
from ferry.errors import InvalidInputError, ModelLoadError
from ferry.graph import save_model
from ferry.optimizer import optimize
from optimizer.check import ops, run_ort

RNG = np.random.default_rng(1)


def conv_bn(batch: str | int = "N", *, constant_node_weight: bool = False) -> onnx.ModelProto:
    """x -> Conv -> BatchNormalization -> Relu -> Cast(float) -> Flatten -> y: what an exporter
    leaves (a BatchNorm to fold, a no-op Cast), with a symbolic batch. The same weights each call."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"]),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("Cast", ["r"], ["rc"], to=TensorProto.FLOAT),
        helper.make_node("Flatten", ["rc"], ["y"]),
    ]
    weights = {
        "g": rng.uniform(0.5, 2, 4),
        "b": rng.standard_normal(4),
        "m": rng.standard_normal(4),
        "v": rng.uniform(0.5, 2, 4),
    }
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()]
    if constant_node_weight:
        nodes.insert(0, helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(w)))
    else:
        inits.append(numpy_helper.from_array(w, "w"))
    graph = helper.make_graph(
        nodes,
        "conv_bn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 256])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


X = {"x": RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)}


def test_folds_and_keeps_the_interface() -> None:
    result = optimize(conv_bn(), measure=False, example_inputs=X)
    assert result.accepted and result.report.parity.passed
    assert ops(result.model) == {"Conv": 1, "Relu": 1, "Reshape": 1}
    (x,) = result.model.graph.inputs
    assert x.name == "x" and str(x.shape[0]) == "N"  # the symbolic batch survives
    assert [o.name for o in result.model.graph.outputs] == ["y"]
    report = result.report
    assert report.nodes_before == 5 and report.nodes_after == 3
    assert report.parameters_after < report.parameters_before  # BatchNorm's 16 folded away
    assert report.changed_ops()[0] in (("BatchNormalization", 1, 0), ("Cast", 1, 0))


def test_constant_node_weights_fold_too() -> None:
    result = optimize(conv_bn(constant_node_weight=True), measure=False, example_inputs=X)
    assert ops(result.model) == {"Conv": 1, "Relu": 1, "Reshape": 1}
    # The Constant node's 108 weights count, and BatchNorm's 16 fold into a bias of 4.
    assert result.report.parameters_before == 108 + 16
    assert result.report.parameters_after < result.report.parameters_before


def test_idempotent_to_the_byte() -> None:
    once = optimize(conv_bn(), level="extended", verify=False, measure=False).model
    twice = optimize(once, level="extended", verify=False, measure=False).model
    assert ir.to_proto(once).SerializeToString() == ir.to_proto(twice).SerializeToString()


def test_input_model_and_file_are_untouched(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(conv_bn(), path)
    before = path.read_bytes()
    model = ir.load(path)
    nodes = len(model.graph)
    optimize(path, measure=False)
    optimize(model, measure=False)
    assert path.read_bytes() == before and len(model.graph) == nodes


def if_and_loop() -> onnx.ModelProto:
    """An If whose branches and a Loop whose body hold foldable leftovers."""
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one_v")

    def branch(name: str, op: str) -> onnx.GraphProto:
        return helper.make_graph(
            [
                helper.make_node("Identity", ["x"], [f"{name}_i"]),
                helper.make_node("Cast", [f"{name}_i"], [f"{name}_c"], to=TensorProto.FLOAT),
                helper.make_node(op, [f"{name}_c", "x"], [f"{name}_out"]),
            ],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [2, 3])],
        )

    body = helper.make_graph(
        [
            helper.make_node("Constant", [], ["one"], value=one),
            helper.make_node("Mul", ["one", "acc_in"], ["scaled"]),
            helper.make_node("Add", ["scaled", "x"], ["acc_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [2, 3]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [2, 3]),
        ],
    )
    graph = helper.make_graph(
        [
            helper.make_node(
                "If",
                ["flag"],
                ["chosen"],
                then_branch=branch("t", "Add"),
                else_branch=branch("e", "Mul"),
            ),
            helper.make_node("Loop", ["trips", "", "chosen"], ["looped"], body=body),
        ],
        "control",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
            helper.make_tensor_value_info("trips", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("looped", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("flag", [True, False])
def test_if_and_loop_bodies_survive_and_shrink(flag: bool) -> None:
    proto = if_and_loop()
    onnx.checker.check_model(proto, full_check=True)
    feeds = {
        "x": RNG.standard_normal((2, 3)).astype(np.float32),
        "flag": np.array(flag),
        "trips": np.array(3, np.int64),
    }
    result = optimize(proto, level="extended", example_inputs=feeds, measure=False)
    assert result.accepted, result.report.refused
    assert result.report.nodes_after < result.report.nodes_before
    assert {"If", "Loop"} <= set(ops(result.model))
    (want,) = run_ort(proto, feeds)
    (got,) = run_ort(result.model, feeds)
    np.testing.assert_array_equal(got, want)


def with_function() -> onnx.ModelProto:
    """A model-local function (``custom.Scale``) called from the graph: kept, not broken."""
    fn = helper.make_function(
        "custom",
        "Scale",
        ["a"],
        ["b"],
        [
            helper.make_node("Constant", [], ["two"], value_float=2.0),
            helper.make_node("Mul", ["a", "two"], ["b"]),
        ],
        [helper.make_opsetid("", 17)],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["x"], ["xi"]),
            helper.make_node("Scale", ["xi"], ["s"], domain="custom"),
            helper.make_node("Relu", ["s"], ["y"]),
        ],
        "fn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
        functions=[fn],
    )
    model.ir_version = 8
    return model


def test_functions_survive() -> None:
    feeds = {"x": RNG.standard_normal((2, 3)).astype(np.float32)}
    result = optimize(with_function(), example_inputs=feeds, measure=False)
    assert result.accepted, result.report.refused
    assert ("custom", "Scale", "") in result.model.functions
    assert ops(result.model) == {"Scale": 1, "Relu": 1}  # the Identity gone, the call kept


def test_external_data_survives(tmp_path: Path) -> None:
    source = tmp_path / "ext.onnx"
    save_model(ir.from_proto(conv_bn()), source, external_data=True)
    assert (tmp_path / "ext.onnx.data").is_file()
    result = optimize(source, measure=False, example_inputs=X)
    assert result.accepted
    out = result.save(tmp_path / "out" / "opt.onnx", external_data=True)
    (want,) = run_ort(conv_bn(), X)
    got = ferry.load(out).run(X)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_fix_shapes_makes_shapes_static() -> None:
    result = optimize(conv_bn(), fix_shapes={"x": (2, 3, 8, 8)}, measure=False)
    assert result.accepted
    assert result.model.graph.inputs[0].shape == ir.Shape([2, 3, 8, 8])
    assert result.report.fixed_shapes == {"x": (2, 3, 8, 8)}
    assert result.report.parity.inputs["x"] == (2, 3, 8, 8)


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        ({"z": (1, 3, 8, 8)}, "not an input of the model"),
        ({"x": (1, 3, 8)}, "has rank 3, but the input has rank 4"),
        ({"x": (1, 4, 8, 8)}, "dim 1 is fixed at 3 in the model, not 4"),
        ({"x": (0, 3, 8, 8)}, "must be positive"),
    ],
)
def test_fix_shapes_that_do_not_fit(shapes: dict[str, tuple[int, ...]], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        optimize(conv_bn(), fix_shapes=shapes)


def test_unknown_level_and_target() -> None:
    with pytest.raises(InvalidInputError, match="unknown optimization level 'max'"):
        optimize(conv_bn(), level="max")
    with pytest.raises(InvalidInputError, match="unknown optimization target 'tpu'"):
        optimize(conv_bn(), target="tpu")


class _Break(ir.passes.InPlacePass):
    """A pass gone wrong: it changes a weight."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        w = model.graph.initializers["w"]
        w.const_value = ir.tensor(w.const_value.numpy() + 1)  # type: ignore[union-attr]
        return ir.passes.PassResult(model, modified=True)


def test_wrong_result_is_refused_and_input_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    import ferry.optimizer._optimize as opt

    monkeypatch.setattr(opt, "pipeline", lambda ctx: _Break())
    proto = conv_bn()
    result = optimize(proto, example_inputs=X, measure=False)
    assert not result.accepted
    assert "computes something else" in (result.report.refused or "")
    (want,) = run_ort(proto, X)
    np.testing.assert_array_equal(run_ort(result.model, X)[0], want)  # the input, as it was
    forced = optimize(proto, example_inputs=X, measure=False, force=True)
    assert forced.accepted and forced.report.forced
    assert not np.array_equal(run_ort(forced.model, X)[0], want)


def test_slower_result_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import ferry.runtime

    monkeypatch.setattr(ferry.runtime, "block_medians", lambda runs, budget: [0.010, 0.012])
    result = optimize(conv_bn(), example_inputs=X)
    assert not result.accepted
    latency = result.report.latency
    assert latency is not None and latency.slower
    assert "runs slower" in (result.report.refused or "")
    assert "10.000 ms -> 12.000 ms" in latency.summary()


def test_latency_is_measured_at_real_sizes_or_not_at_all() -> None:
    measured = optimize(conv_bn(), example_inputs=X)
    assert measured.report.latency is not None and measured.report.latency.inputs == {
        "x": (2, 3, 8, 8)
    }
    # A symbolic spatial dim: timed at a size found by running the model (never skipped, so a
    # slower result cannot slip through), and the report says which and how.
    proto = conv_bn()
    proto.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "H"
    proto.graph.output[0].type.tensor_type.shape.dim[1].dim_param = "F"
    found = optimize(proto)
    latency = found.report.latency
    assert latency is not None and latency.skipped is None, latency
    height = latency.inputs["x"][2]
    assert f"x 2x3x{height}x8" in latency.summary() or f"x 1x3x{height}x8" in latency.summary()
    assert "found by running the model" in latency.summary()


def test_a_failing_pass_keeps_the_input(monkeypatch: pytest.MonkeyPatch) -> None:
    import ferry.optimizer._optimize as opt

    class _Crash(ir.passes.InPlacePass):
        def call(self, model: ir.Model) -> ir.passes.PassResult:
            raise RuntimeError("pattern matcher exploded")

    monkeypatch.setattr(opt, "pipeline", lambda ctx: _Crash())
    result = optimize(conv_bn(), example_inputs=X)
    assert not result.accepted
    assert "pipeline failed (RuntimeError: pattern matcher exploded)" in (
        result.report.refused or ""
    )


# -- the command ---------------------------------------------------------------------------------


def ferry_cli(*args: str | Path) -> Any:
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_cli_writes_and_reports(tmp_path: Path) -> None:
    source = tmp_path / "m.onnx"
    onnx.save(conv_bn(), source)
    np.save(tmp_path / "x.npy", X["x"])
    out = tmp_path / "opt.onnx"
    result = ferry_cli("optimize", source, "-o", out, "--input", f"x={tmp_path / 'x.npy'}")
    if result.exit_code == 3:  # a loaded machine can time the smaller graph slower
        assert "runs slower" in result.output and not out.exists()
        return
    assert result.exit_code == 0, result.output
    assert "BatchNormalization" in result.output and "nodes" in result.output
    assert "parity ok" in result.output and "latency on onnxruntime" in result.output
    assert len(onnx.load(out).graph.node) == 3  # Conv, Relu, Flatten as a Reshape


def test_cli_refusal_writes_nothing_and_exits_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ferry.optimizer._optimize as opt

    monkeypatch.setattr(opt, "pipeline", lambda ctx: _Break())
    source = tmp_path / "m.onnx"
    onnx.save(conv_bn(), source)
    out = tmp_path / "opt.onnx"
    result = ferry_cli("optimize", source, "-o", out, "--shape", "x=2,3,8,8", "--no-measure")
    assert result.exit_code == 3
    assert "not written" in result.output and "--force" in result.output
    assert not out.exists()
    forced = ferry_cli("optimize", source, "-o", out, "--no-measure", "--force", "--report", "-")
    assert forced.exit_code == 0 and out.exists()
    assert json.loads(forced.stdout)["forced"] is True


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fix-shapes", "x=1x3x8"], "has rank 3"),
        (["--fix-shapes", "x=1xthree"], "bad shape"),
        (["--fix-shapes", "x=0x3x8x8"], "sizes must be positive"),
        (["--fix-shapes", "x"], "expects NAME=VALUE"),
        (["--level", "max"], "Invalid value for '--level'"),
    ],
)
def test_cli_bad_options(tmp_path: Path, args: list[str], message: str) -> None:
    source = tmp_path / "m.onnx"
    onnx.save(conv_bn(), source)
    result = ferry_cli("optimize", source, "-o", tmp_path / "o.onnx", *args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_cli_bad_files(tmp_path: Path) -> None:
    corrupt = tmp_path / "bad.onnx"
    corrupt.write_bytes(b"\x08\x07garbage" * 10)
    result = ferry_cli("optimize", corrupt, "-o", tmp_path / "o.onnx")
    assert result.exit_code == 2 and "error:" in result.output and "Traceback" not in result.output
    source = tmp_path / "m.onnx"
    onnx.save(conv_bn(), source)
    result = ferry_cli("optimize", source, "-o", source)
    assert result.exit_code == 2 and "refusing to overwrite the input model" in result.output


# -- ferry.load and ferry serve -----------------------------------------------------------------


def test_load_optimize(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    source = tmp_path / "m.onnx"
    onnx.save(conv_bn(), source)
    session = ferry.load(source, optimize=True, example_inputs=X)
    assert "BatchNormalization" not in ops(session.model)
    (want,) = run_ort(conv_bn(), X)
    np.testing.assert_allclose(session.run(X)["y"], want, rtol=1e-4, atol=1e-5)
    with pytest.raises(InvalidInputError, match="optimize must be True, False, 'basic' or"):
        ferry.load(source, optimize="fast")


def test_load_optimize_refused_runs_the_model_as_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import ferry.optimizer._optimize as opt

    monkeypatch.setattr(opt, "pipeline", lambda ctx: _Break())
    source = tmp_path / "m.onnx"
    onnx.save(conv_bn(), source)
    with caplog.at_level(logging.WARNING):
        session = ferry.load(source, optimize="extended", example_inputs=X)
    assert "optimization not applied" in caplog.text
    (want,) = run_ort(conv_bn(), X)
    np.testing.assert_allclose(session.run(X)["y"], want, rtol=1e-5, atol=1e-6)


def test_serve_optimizes_per_model(tmp_path: Path) -> None:
    from ferry.serving import ModelRepository
    from ferry.serving._config import ConfigError, parse_config

    assert parse_config({"optimize": "extended"}, "m").optimize == "extended"
    with pytest.raises(ConfigError, match="'optimize' must be one of none, basic, extended"):
        parse_config({"optimize": "fast"}, "m")
    for name, level in (("plain", None), ("opt", "basic")):
        folder = tmp_path / name / "1"
        folder.mkdir(parents=True)
        onnx.save(conv_bn(), folder / "model.onnx")
        if level:
            (tmp_path / name / "config.json").write_text(json.dumps({"optimize": level}))

    async def body() -> dict[str, Any]:
        repository = ModelRepository(tmp_path, warmup=False)
        await repository.start()
        try:
            return {n: repository.get(n).loaded.sessions[0].model for n in ("plain", "opt")}
        finally:
            await repository.stop()

    served = asyncio.run(body())
    assert "BatchNormalization" in ops(served["plain"])
    assert "BatchNormalization" not in ops(served["opt"])
    with pytest.raises(InvalidInputError, match="optimize must be one of none, basic, extended"):
        ModelRepository(tmp_path, optimize="max")


def test_load_of_a_missing_model_says_so() -> None:
    with pytest.raises(ModelLoadError, match="model file not found"):
        optimize("/nonexistent/model.onnx")


def test_zoo_mlp_fixture_optimizes(tmp_path: Path) -> None:
    """A model of the test fixtures (Gemm, MatMul, Softmax): nothing to remove, nothing broken."""
    result = optimize(models.mlp(), level="extended", measure=False)
    assert result.accepted and result.report.nodes_after <= result.report.nodes_before


def test_target_engine_missing_still_optimizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Optimizing here for a TensorRT machine: the rules run, the timing is left to that machine."""
    import ferry.runtime
    from ferry.errors import BackendUnavailableError

    real_load = ferry.runtime.load

    def load(source: Any, **kwargs: Any) -> Any:
        if kwargs.get("backends") == "tensorrt":
            raise BackendUnavailableError("tensorrt needs an NVIDIA GPU")
        return real_load(source, **kwargs)

    monkeypatch.setattr(ferry.runtime, "load", load)
    result = optimize(conv_bn(), target="tensorrt", example_inputs=X)
    assert result.accepted and result.report.parity.passed
    latency = result.report.latency
    assert latency is not None and "tensorrt is not available here" in (latency.skipped or "")
