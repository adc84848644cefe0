"""``ferry plan``: partitions, verdicts, JSON, saving, --verify with bisection, auto, errors."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from click.testing import CliRunner

import ferry
import ferry.backends
import models
from ferry.backends import BackendBase, CompileSpec, OpRule
from ferry.cli.main import cli
from ferry.plan import Plan


def ferry_cli(*args: str | Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


class _Partition:
    def __init__(self, proto: onnx.ModelProto) -> None:
        self.session = ort.InferenceSession(
            proto.SerializeToString(), providers=["CPUExecutionProvider"]
        )

    def run(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        names = list(outputs or [o.name for o in self.session.get_outputs()])
        return dict(zip(names, self.session.run(names, inputs)))

    def serialize(self) -> bytes:
        return b""


class WrongRelu(BackendBase):
    """An engine with a bug: it claims every standard op and computes Relu as Sigmoid."""

    name = "wrongrelu"
    device = "cpu"
    version = "1.0"
    precisions: tuple[str, ...] = ("fp32",)
    install_hint = "nothing to install"

    def available(self) -> bool:
        return True

    def rules(self) -> list[OpRule]:
        return [OpRule(s.name) for s in onnx.defs.get_all_schemas() if s.domain == ""]

    def validate(self, model: ir.Model, nodes: Sequence[str]) -> dict[str, str]:
        return {}

    def compile(self, spec: CompileSpec) -> _Partition:
        proto = ir.to_proto(spec.model)
        for node in proto.graph.node:
            if node.op_type == "Relu":
                node.op_type = "Sigmoid"
        return _Partition(proto)

    def load(self, blob: bytes, spec: CompileSpec) -> _Partition:
        return self.compile(spec)


@pytest.fixture
def wrong(monkeypatch: pytest.MonkeyPatch) -> WrongRelu:
    backend = WrongRelu()
    monkeypatch.setitem(ferry.backends._registry._instances, "wrongrelu", backend)
    monkeypatch.setattr(
        ferry.backends._registry,
        "_BUILTIN",
        {**ferry.backends._registry._BUILTIN, "wrongrelu": "-"},
    )
    return backend


@pytest.fixture
def mlp_file(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.onnx"
    onnx.save(models.mlp(), path)
    return path


def test_plain_ort_plan_text_and_json(mlp_file: Path) -> None:
    code, out, _ = ferry_cli("plan", mlp_file)
    assert code == 0 and "onnxruntime" in out and "4" in out
    code, out, _ = ferry_cli("plan", mlp_file, "--json")
    data = json.loads(out)
    (part,) = data["plan"]["partitions"]
    assert part["backend"] == "onnxruntime" and len(part["nodes"]) == 4
    # --explain says where each node runs even when ONNX Runtime runs them all.
    code, out, _ = ferry_cli("plan", mlp_file, "--explain", "--json")
    data = json.loads(out)
    assert {n["node"]: n["backend"] for n in data["nodes"]} == dict.fromkeys(
        ("fc1", "relu", "fc2", "softmax"), "onnxruntime"
    )
    assert data["boundary_bytes"] == 0
    code, out, _ = ferry_cli("plan", mlp_file, "--explain")
    assert code == 0 and "runs on" in out and "1 partition, 1 engine call" in out


def test_explain_json_gives_every_node_a_verdict_and_boundaries(
    mlp_file: Path, wrong: WrongRelu
) -> None:
    code, out, _ = ferry_cli(
        "plan", mlp_file, "--backends", "wrongrelu", "--force-cpu", "fc2", "--explain", "--json",
        "--min-partition-size", "1",
    )  # fmt: skip
    assert code == 0
    data = json.loads(out)
    placed = {n["node"]: n["backend"] for n in data["nodes"]}
    assert placed == {
        "fc1": "wrongrelu", "relu": "wrongrelu", "fc2": "onnxruntime", "softmax": "wrongrelu"
    }  # fmt: skip
    fc2 = next(n for n in data["nodes"] if n["node"] == "fc2")
    assert "force_cpu" in json.dumps(fc2)
    assert [p["backend"] for p in data["plan"]["partitions"]] == [
        "wrongrelu", "onnxruntime", "wrongrelu"
    ]  # fmt: skip
    # The batch is symbolic; the bytes are those at the inputs used (generated: batch 1).
    assert data["boundary_bytes"] == 48 and data["cost"]["shapes"]["x"][0] == 1

    code, out, _ = ferry_cli(
        "plan", mlp_file, "--backends", "wrongrelu", "--force-cpu", "fc2", "--explain",
        "--min-partition-size", "1",
    )  # fmt: skip
    assert code == 0
    for text in ("runs on", "force_cpu", "3 partitions, 3 engine calls"):
        assert text in out


def test_saved_plan_reloads_and_runs(mlp_file: Path, tmp_path: Path) -> None:
    out_path = tmp_path / "plan.json"
    code, out, _ = ferry_cli("plan", mlp_file, "--force-cpu", "Relu", "-o", out_path)
    assert code == 0 and "saved the plan" in out
    plan = Plan.load(out_path)
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    got = ferry.load(mlp_file, plan=plan).run({"x": x})["y"]
    want = ort.InferenceSession(str(mlp_file)).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_verify_bisects_to_the_first_diverging_node(mlp_file: Path, wrong: WrongRelu) -> None:
    code, out, err = ferry_cli("plan", mlp_file, "--backends", "wrongrelu", "--verify", "--json")
    assert code == 2
    assert "verification failed" in err
    checks = json.loads(out)["verify"]
    bad = [c for c in checks if not c["passed"]]
    assert bad and bad[0]["first_bad_node"] == "relu"

    # With Relu kept on ONNX Runtime, every partition on the buggy engine is correct.
    code, out, err = ferry_cli(
        "plan", mlp_file, "--backends", "wrongrelu", "--force-cpu", "Relu", "--verify",
        "--min-partition-size", "1",
    )  # fmt: skip
    assert code == 0, err
    assert "NO" not in out


@pytest.mark.openvino
def test_verify_openvino_passes(mlp_file: Path) -> None:
    pytest.importorskip("openvino")
    code, out, err = ferry_cli("plan", mlp_file, "--backends", "openvino,onnxruntime", "--verify")
    assert code == 0, err
    assert "openvino" in out and "yes" in out


def test_auto_shows_what_it_measured(mlp_file: Path) -> None:
    code, out, err = ferry_cli("plan", mlp_file, "--backends", "auto", "--budget", "0.3", "--json")
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    labels = [c["label"] for c in data["auto"]["candidates"]]
    assert "onnxruntime fp32" in labels and data["auto"]["chosen"] in labels
    code, out, err = ferry_cli("plan", mlp_file, "--backends", "auto", "--budget", "0.3")
    assert code == 0 and "cached choice" in out  # the first run stored its choice


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backends", "nosuchengine"], "unknown backend 'nosuchengine'"),
        (["--backends", "auto,onnxruntime"], "'auto' picks the engines itself"),
        (["--tolerance", "abc"], "tolerance"),
    ],
)
def test_user_errors_are_one_line(mlp_file: Path, args: list[str], message: str) -> None:
    code, _, err = ferry_cli("plan", mlp_file, *args)
    assert code == 2
    assert message in err and "Traceback" not in err


def _image_model(folder: Path) -> Path:
    """x[batch, 3, h, w] -> Conv -> Relu: sizes only the user knows."""
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [y], [w])
    folder.mkdir()
    path = folder / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_auto_finds_sizes_or_measures_at_those_given(tmp_path: Path) -> None:
    path = _image_model(tmp_path / "artifact")
    # No sizes given: auto measures at sizes found to run, and says which (issue 31).
    code, out, err = ferry_cli("plan", path, "--backends", "auto", "--budget", "0.2")
    assert code == 0, err
    assert "inputs: x 1x3x224x224" in out and "at x=1x3x224x224" in out
    code, out, err = ferry_cli(
        "plan", path, "--backends", "auto", "--budget", "0.2", "--shape", "x=1,3,64,48", "--json"
    )
    assert code == 0, err
    assert json.loads(out)["auto"]["inputs"] == {"x": [1, 3, 64, 48]}
    # Sizes saved in the artifact are used when none are given.
    (path.parent / "ferry.json").write_text(json.dumps({"shapes": {"x": [1, 3, 32, 40]}}))
    code, out, err = ferry_cli("plan", path.parent, "--backends", "auto", "--budget", "0.2")
    assert code == 0, err
    assert "measured on random data at x=1x3x32x40" in out and "--remeasure" not in out
    code, out, _ = ferry_cli("plan", path.parent, "--backends", "auto", "--budget", "0.2")
    assert "cached choice" in out and "--remeasure" in out
    code, out, _ = ferry_cli(
        "plan", path.parent, "--backends", "auto", "--budget", "0.2", "--remeasure", "--exact"
    )
    assert code == 0 and "cached choice" not in out
    assert "bf16" not in out  # --exact: fp32 candidates only
