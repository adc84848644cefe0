"""The placement cost on the kit's models: fragmentation, and boundary bytes that match what the
model really computes.

OpenVINO ahead of ONNX Runtime: models OpenVINO takes whole cost nothing; the dynamic-int8 CRNN
(``captcha_ocr_dynint8``, whose DynamicQuantizeLinear nodes OpenVINO refuses) fragments. Predicted
boundary sizes are checked against the tensors ONNX Runtime computes on the kit's inputs.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import onnxruntime as ort
import pytest

import kit_models
from ferry.backends import (
    LARGE_BOUNDARY_BYTES,
    LARGE_BOUNDARY_RATIO,
    MANY_PARTITIONS,
    PlacementReport,
    explain,
)
from ferry.graph import load_model, prepare

BACKENDS = ["openvino", "onnxruntime"]
FALLBACK = "onnxruntime"


def kit_shapes(mid: str) -> dict[str, list[int]]:
    return {i["name"]: list(i["shape"]) for i in kit_models.entry(mid)["inputs"]}


def actual_bytes(mid: str, names: Sequence[str]) -> dict[str, int]:
    """The bytes of the values called ``names`` (of the prepared model, whose names plans use)
    when ONNX Runtime runs the model on the kit's inputs."""
    import onnx_ir as ir

    model = prepare(load_model(kit_models.path(mid)))
    values = {v.name: v for node in model.graph for v in node.outputs}
    outputs = {v.name for v in model.graph.outputs}
    for name in names:
        if name not in outputs:
            model.graph.outputs.append(values[name])
    proto = ir.to_proto(model).SerializeToString()
    session = ort.InferenceSession(proto, providers=["CPUExecutionProvider"])
    got = session.run(list(names), kit_models.feeds(mid))
    return {name: np.asarray(array).nbytes for name, array in zip(names, got)}


def check_sizes(mid: str, report: PlacementReport) -> None:
    """Every boundary size the cost at the kit's shapes predicts is the size ONNX Runtime makes."""
    cost = report.cost(kit_shapes(mid))
    real = actual_bytes(mid, [b.name for b in cost.boundaries])
    predicted = {b.name: b.nbytes for b in cost.boundaries if b.nbytes is not None}
    assert predicted == {name: real[name] for name in predicted}
    assert cost.known_bytes == sum(predicted.values())


@pytest.mark.parametrize("mid", ["open_nsfw", "layout", "captcha_ocr", "table"])
def test_a_model_openvino_takes_whole_costs_nothing(mid: str) -> None:
    report = explain(str(kit_models.path(mid)), BACKENDS)
    for cost in (report.cost(), report.cost(kit_shapes(mid))):
        assert (cost.partitions, cost.engine_calls, cost.boundary_tensors) == (1, 1, 0)
        assert cost.boundary_bytes == 0 and cost.unknown_sizes == () and cost.warnings == ()
        assert [(e.backend, e.partitions) for e in cost.engines] == [("openvino", 1)]
    text = report.format()
    assert "cost: 1 partition, 1 engine call per run, 0 boundary tensors, 0 B per run" in text
    assert "warning:" not in text


def test_dynint8_fragments_no_more_than_its_refused_nodes_need() -> None:
    report = explain(str(kit_models.path("captcha_ocr_dynint8")), BACKENDS)
    # Runs of fallback nodes in topological order (constants travel with their readers).
    runs = 0
    previous = False
    for v in report.nodes:
        if v.note is not None:
            continue
        on_fallback = v.backend == FALLBACK
        runs += on_fallback and not previous
        previous = on_fallback
    refused = [v for v in report.nodes if v.backend == FALLBACK]
    assert refused and all("openvino" in v.reasons for v in refused)
    backends = [p.backend for p in report.plan.partitions]
    on_fallback = backends.count(FALLBACK)
    assert 0 < on_fallback <= runs  # each run of refused nodes: at most one fallback partition
    assert backends.count("openvino") <= on_fallback + 1  # OpenVINO's pieces: between the cuts
    assert all(a != b for a, b in itertools.pairwise(backends))  # neighbours: other engines

    cost = report.cost()
    assert cost.partitions == len(backends) > MANY_PARTITIONS
    assert cost.engine_calls == len(backends)
    quantizers = sum(v.op_type == "DynamicQuantizeLinear" for v in report.nodes)
    (warning,) = cost.warnings
    assert warning.startswith(f"{len(backends)} partitions (more than {MANY_PARTITIONS})")
    assert f"DynamicQuantizeLinear x{quantizers}" in warning
    # The input's width is symbolic: without shapes, sizes are unknown.
    assert cost.boundary_bytes is None and cost.input_bytes is None
    assert cost.unknown_sizes
    text = report.format()
    assert "bytes depend on input sizes (give --shape)" in text
    assert f"\nwarning: {warning}\n" in text


def test_dynint8_bytes_at_the_kit_shapes() -> None:
    mid = "captcha_ocr_dynint8"
    report = explain(str(kit_models.path(mid)), BACKENDS)
    unsized = report.cost()
    cost = report.cost(kit_shapes(mid))
    assert cost.input_bytes == 1 * 1 * 64 * 160 * 4
    # What stays unknown comes out of ops no shape inference knows (com.microsoft's
    # DynamicQuantizeLSTM): fewer than before, each produced by a partition holding one.
    assert len(cost.unknown_sizes) < len(unsized.unknown_sizes)
    contrib = {v.partition for v in report.nodes if "::" in v.op_type}
    by_name = {b.name: b for b in cost.boundaries}
    assert all(by_name[name].producer in contrib for name in cost.unknown_sizes)
    assert cost.known_bytes > 0
    check_sizes(mid, report)
    if cost.known_bytes > max(LARGE_BOUNDARY_RATIO * cost.input_bytes, LARGE_BOUNDARY_BYTES):
        assert any("cross engines per run" in w for w in cost.warnings)
    assert f"at least {cost.known_bytes / 2**20:.1f} MiB per run" in report.format(kit_shapes(mid))


@pytest.mark.parametrize(
    ("mid", "force_cpu"), [("orientation", "GlobalAveragePool"), ("table", "Add")]
)
def test_symbolic_sizes_come_from_the_given_shapes(mid: str, force_cpu: str) -> None:
    """Models with symbolic input dims, cut by force_cpu: no bytes without shapes; exact bytes,
    derived dims included, at the kit's shapes."""
    report = explain(str(kit_models.path(mid)), BACKENDS, force_cpu=[force_cpu])
    assert report.cost().boundary_bytes is None
    cost = report.cost(kit_shapes(mid))
    assert cost.unknown_sizes == () and cost.boundary_bytes is not None
    assert all(all(isinstance(d, int) for d in b.shape or (None,)) for b in cost.boundaries)
    check_sizes(mid, report)
    assert cost.boundary_bytes == cost.known_bytes
