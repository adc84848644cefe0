"""``ferry.load(model, backends=[...])`` and ``backends="auto"`` on real exported models.

CNNs and a transformer block from the zoo, and a small SSD-style detector exported from PyTorch
with ONNX post-processing (NonMaxSuppression, GatherND: data-dependent output shapes). Each runs
partitioned across OpenVINO and ONNX Runtime, split further by force, and through ``auto``, and
must match ONNX Runtime on the unpartitioned model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ferry
from ferry.backends import get_backend, place
from ferry.errors import InvalidInputError
from ferry.graph import prepare

pytestmark = pytest.mark.torch


def openvino_available() -> bool:
    try:
        return get_backend("openvino").available()
    except Exception:
        return False


needs_openvino = pytest.mark.skipif(not openvino_available(), reason="openvino is not installed")


def tiny_detector() -> ir.Model:
    """A small SSD-style detector: conv backbone, box and class heads over 8x8 anchors decoded to
    corner boxes, then NonMaxSuppression and a GatherND of the kept boxes (dynamic batch)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    anchors_per_cell, classes, cells = 2, 3, 8

    class Detector(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = nn.Sequential(
                nn.Conv2d(3, 16, 3, stride=2, padding=1),
                nn.BatchNorm2d(16),
                nn.ReLU(),
                nn.Conv2d(16, 32, 3, stride=2, padding=1),
                nn.ReLU(),
            )
            self.box_head = nn.Conv2d(32, anchors_per_cell * 4, 1)
            self.cls_head = nn.Conv2d(32, anchors_per_cell * classes, 1)
            ys, xs = torch.meshgrid(torch.arange(cells), torch.arange(cells), indexing="ij")
            centers = torch.stack([(xs + 0.5) / cells, (ys + 0.5) / cells], -1).reshape(-1, 1, 2)
            sizes = torch.tensor([[0.2, 0.2], [0.35, 0.15]])
            self.register_buffer("centers", centers.expand(-1, anchors_per_cell, 2).reshape(-1, 2))
            self.register_buffer("sizes", sizes.repeat(cells * cells, 1))

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            features = self.backbone(x)
            n = x.shape[0]
            deltas = self.box_head(features).permute(0, 2, 3, 1).reshape(n, -1, 4)
            logits = self.cls_head(features).permute(0, 2, 3, 1).reshape(n, -1, classes)
            center = self.centers + 0.1 * deltas[..., :2] * self.sizes
            size = self.sizes * torch.exp(0.2 * deltas[..., 2:])
            boxes = torch.cat([center - size / 2, center + size / 2], -1)  # x1, y1, x2, y2
            return boxes, torch.sigmoid(logits).transpose(1, 2)  # scores [N, C, A]

    module = Detector().eval()
    x = torch.randn(2, 3, 32, 32)
    program = torch.onnx.export(
        module,
        (x,),
        dynamo=True,
        input_names=["image"],
        output_names=["boxes", "scores"],
        dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},),
        opset_version=18,
    )
    assert program is not None
    proto = program.model_proto
    # Post-processing as detectors ship it: NMS, then the kept boxes.
    graph = proto.graph
    graph.initializer.extend(
        [
            helper.make_tensor("max_per_class", TensorProto.INT64, [1], [5]),
            helper.make_tensor("iou", TensorProto.FLOAT, [1], [0.5]),
            helper.make_tensor("score_min", TensorProto.FLOAT, [1], [0.3]),
            helper.make_tensor("pick", TensorProto.INT64, [2], [0, 2]),
        ]
    )
    graph.node.extend(
        [
            helper.make_node(
                "NonMaxSuppression",
                ["boxes", "scores", "max_per_class", "iou", "score_min"],
                ["selected"],
                name="nms",
            ),
            helper.make_node("Gather", ["selected", "pick"], ["box_index"], name="pick", axis=1),
            helper.make_node("GatherND", ["boxes", "box_index"], ["kept_boxes"], name="kept"),
        ]
    )
    del graph.output[:]
    graph.output.extend(
        [
            helper.make_tensor_value_info("selected", TensorProto.INT64, ["k", 3]),
            helper.make_tensor_value_info("kept_boxes", TensorProto.FLOAT, ["k", 4]),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", classes, 128]),
        ]
    )
    onnx.checker.check_model(proto)
    return prepare(ir.from_proto(proto))


@pytest.fixture(scope="module")
def models() -> dict[str, ir.Model]:
    from ferry import zoo

    built = {name: prepare(zoo.build(name)) for name in ("digits_cnn", "mobilenet_v2")}
    built["transformer_block"] = prepare(zoo.build("transformer_block"))
    built["detector"] = tiny_detector()
    return built


def feeds_for(name: str, batch: int) -> dict[str, np.ndarray]:
    from ferry import zoo

    if name == "detector":
        rng = np.random.default_rng(batch)
        return {"image": rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)}
    return zoo.example_inputs(name, batch=batch, seed=batch)


def ort_outputs(model: ir.Model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def assert_matches(got: dict[str, Any], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for name, expected in want.items():
        if expected.dtype.kind in "iub":
            np.testing.assert_array_equal(got[name], expected, err_msg=name)
        else:
            np.testing.assert_allclose(got[name], expected, rtol=1e-4, atol=1e-5, err_msg=name)


NAMES = ["digits_cnn", "mobilenet_v2", "transformer_block", "detector"]


@needs_openvino
@pytest.mark.parametrize("name", NAMES)
def test_openvino_then_onnxruntime(models: dict[str, ir.Model], name: str) -> None:
    model = models[name]
    # The split runs as placed (whether it pays is checked below): this tests running it.
    session = ferry.load(
        model, backends=["openvino", "onnxruntime"], cache_dir=False, check_pays=False
    )
    assert "openvino" in session.plan.backends  # the engine really took part of the graph
    for batch in (1, 3):
        feeds = feeds_for(name, batch)
        assert_matches(session.run(feeds), ort_outputs(model, feeds))


def _timed(split_ms: float, alone_ms: float) -> Any:
    """A stand-in for the pays check's block timer giving the split and ONNX Runtime alone these times."""

    def time_in_blocks(runs: list[Any], feeds: Any, budget_s: float) -> None:
        for candidate, session in runs:
            session.run(dict(feeds))  # both really run
            candidate.latency_ms = split_ms if candidate.label == "plan" else alone_ms

    return time_in_blocks


@needs_openvino
@pytest.mark.parametrize(("split_ms", "alone_ms", "kept"), [(9.0, 4.0, False), (3.0, 4.0, True)])
def test_a_split_runs_only_where_it_pays(
    models: dict[str, ir.Model],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    caplog: pytest.LogCaptureFixture,
    split_ms: float,
    alone_ms: float,
    kept: bool,
) -> None:
    from ferry.runtime import _pays

    monkeypatch.setenv("FERRY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_pays, "time_in_blocks", _timed(split_ms, alone_ms))
    model = models["detector"]  # OpenVINO refuses its NonMaxSuppression: two partitions
    session = ferry.load(model, backends="openvino,onnxruntime", cache_dir=False)
    split = len(session.plan.partitions) > 1 and "openvino" in session.plan.backends
    assert split == kept
    if not kept:
        assert "running ONNX Runtime alone" in caplog.text and "9 ms" in caplog.text
    feeds = feeds_for("detector", 1)
    assert_matches(session.run(feeds), ort_outputs(model, feeds))
    # The verdict is cached: the next load does not time again.
    monkeypatch.setattr(_pays, "time_in_blocks", _timed(alone_ms, split_ms))
    again = ferry.load(model, backends="openvino,onnxruntime", cache_dir=False)
    assert again.plan == session.plan
    # Named alone, the engine runs what it can and is not second-guessed.
    alone = ferry.load(model, backends="openvino", cache_dir=False)
    assert "openvino" in alone.plan.backends


@needs_openvino
def test_an_engine_that_takes_the_model_whole_runs_only_where_it_pays(
    models: dict[str, ir.Model], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from ferry.runtime import _pays

    monkeypatch.setenv("FERRY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_pays, "time_in_blocks", _timed(2.0, 1.0))
    model = models["digits_cnn"]
    offered = ferry.load(model, backends="openvino,onnxruntime", cache_dir=False)
    assert offered.plan.backends == ["onnxruntime"]  # ONNX Runtime listed, and faster
    named = ferry.load(model, backends="openvino", cache_dir=False)
    assert named.plan.backends == ["openvino"]  # named alone: run as asked
    kept = ferry.load(model, backends="openvino,onnxruntime", cache_dir=False, check_pays=False)
    assert kept.plan.backends == ["openvino"]


@needs_openvino
def test_a_split_at_unknown_sizes_learns_on_the_first_call(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Sizes unknown: live placement starts on ONNX Runtime alone and checks the plan on the
    first real call (here slower: kept off, with a warning); ``placement="fixed"`` keeps the
    plan unchecked, with a warning, as before."""
    from ferry.runtime import LiveSession, _live_trial, _pays

    def call_timer(session: Any, inputs: Any, outputs: Any) -> tuple[Any, float]:
        alone = session.plan.backends == ["onnxruntime"]
        return session.run(inputs, outputs), 4.0 if alone else 9.0

    monkeypatch.setenv("FERRY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_pays, "time_in_blocks", _timed(9.0, 4.0))
    monkeypatch.setattr(_live_trial, "_timed", call_timer)
    model = tiny_detector()
    model.graph.inputs[0].shape = ir.Shape(["batch", 3, "h", "w"])
    session = ferry.load(model, backends="openvino,onnxruntime", cache_dir=False)
    assert isinstance(session, LiveSession) and session.plan.backends == ["onnxruntime"]
    image = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    for _ in range(100):  # a bucket on trial is decided by its calls
        session.run({"image": image})
        if session.placement_settled(0.05):
            break
    assert session.placement_settled(1), session.placement_report()
    (bucket,) = session.placement_report()["buckets"]
    assert bucket["plan"] == "onnxruntime" and "running ONNX Runtime alone" in caplog.text
    fixed = ferry.load(model, backends="openvino,onnxruntime", cache_dir=False, placement="fixed")
    assert "openvino" in fixed.plan.backends
    assert "not checked whether the plan" in caplog.text and "shapes=" in caplog.text
    sized = ferry.load(
        model, backends="openvino,onnxruntime", cache_dir=False, shapes={"image": (1, 3, 32, 32)}
    )
    assert sized.plan.backends == ["onnxruntime"]


@needs_openvino
@pytest.mark.parametrize(
    ("name", "force"),
    [
        ("digits_cnn", ["Relu"]),
        ("mobilenet_v2", ["Add"]),
        ("transformer_block", ["Softmax"]),
        ("detector", ["Sigmoid", "NonMaxSuppression"]),
    ],
)
def test_forced_split_gives_several_partitions_and_the_same_outputs(
    models: dict[str, ir.Model], name: str, force: list[str]
) -> None:
    model = models[name]
    plan = place(model, ["openvino"], force_cpu=force, min_partition_size=1)
    backends = [p.backend for p in plan.partitions]
    assert len(plan.partitions) >= 3 and {"openvino", "onnxruntime"} <= set(backends), backends
    session = ferry.load(model, plan=plan, cache_dir=False)
    feeds = feeds_for(name, 2)
    assert_matches(session.run(feeds), ort_outputs(model, feeds))


def test_detector_on_onnxruntime_alone(models: dict[str, ir.Model]) -> None:
    model = models["detector"]
    session = ferry.load(model)
    feeds = feeds_for("detector", 2)
    got, want = session.run(feeds), ort_outputs(model, feeds)
    assert_matches(got, want)
    assert got["selected"].shape[0] > 0  # the thresholds keep some boxes: NMS is exercised


@pytest.mark.parametrize("name", ["digits_cnn", "detector"])
def test_auto_runs_the_choice_correctly_and_caches_it(
    models: dict[str, ir.Model], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ferry.runtime import _load as load_mod

    monkeypatch.setattr(load_mod, "AUTO_BUDGET_S", 0.3)
    model = models[name]
    first = ferry.load(model, backends="auto", cache_dir=False)
    feeds = feeds_for(name, 2)
    assert_matches(first.run(feeds), ort_outputs(model, feeds))
    # The second load reuses the cached choice: the same plan, without measuring again.
    from ferry.runtime import _auto as auto

    monkeypatch.setattr(auto, "candidates", _no_candidates)
    second = ferry.load(model, backends="auto", cache_dir=False)
    assert second.plan == first.plan


def _no_candidates(*args: object, **kwargs: object) -> list[object]:
    raise AssertionError("auto measured again instead of using its cached choice")


def test_auto_cannot_be_combined_with_engines(models: dict[str, ir.Model]) -> None:
    with pytest.raises(InvalidInputError, match="'auto' picks the engines itself"):
        ferry.load(models["digits_cnn"], backends=["auto", "onnxruntime"])


@needs_openvino
def test_per_backend_options_reach_the_engine(models: dict[str, ir.Model]) -> None:
    model = models["digits_cnn"]
    session = ferry.load(
        model, backends="openvino", options={"openvino": {"threads": 1}}, cache_dir=False
    )
    parts = [p for p in session.plan.partitions if p.backend == "openvino"]
    assert parts and all(p.options["threads"] == 1 for p in parts)
    feeds = feeds_for("digits_cnn", 2)
    assert_matches(session.run(feeds), ort_outputs(model, feeds))
