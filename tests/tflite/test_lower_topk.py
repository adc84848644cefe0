"""Top-k and gathers by element, as end-to-end detectors have them inside: the flat scores
ranked (TopK), each index split into box and class (integer Div and Mod), the boxes picked
(GatherElements). Each graph is built here, exported, and verified in LiteRT (XNNPACK and the
reference kernels) against ONNX Runtime by ``export_tflite``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper
from tflite_graphs import export, model, opcodes, weights

pytest.importorskip("ai_edge_litert", reason="LiteRT verifies the exports")

N = helper.make_node


def _i64(*values: int) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def _detector(k: int = 10, classes: int = 5) -> object:
    """Conv heads -> boxes [1, 64, 4] and scores [1, 64, C]; top-k of the flat scores; each
    index split into its box (Div) and class (Mod); the boxes picked by GatherElements."""
    nodes = [
        N("Conv", ["x", "wb"], ["b4"], pads=[1, 1, 1, 1]),
        N("Reshape", ["b4", "s_boxes"], ["b3"]),
        N("Transpose", ["b3"], ["boxes"], perm=[0, 2, 1]),  # [1, 64, 4]
        N("Conv", ["x", "ws"], ["s4"], pads=[1, 1, 1, 1]),
        N("Sigmoid", ["s4"], ["sig"]),
        N("Reshape", ["sig", "s_scores"], ["s3"]),
        N("Transpose", ["s3"], ["scores"], perm=[0, 2, 1]),  # [1, 64, C]
        N("Reshape", ["scores", "s_flat"], ["flat"]),  # [1, 64 * C]
        N("TopK", ["flat", "k"], ["top", "idx"], axis=-1),
        N("Div", ["idx", "c"], ["box_i"]),
        N("Mod", ["idx", "c"], ["label"]),
        N("Unsqueeze", ["box_i", "minus1"], ["box_col"]),
        N("Expand", ["box_col", "s_pick"], ["pick"]),  # [1, k, 4]
        N("GatherElements", ["boxes", "pick"], ["picked"], axis=1),
    ]
    inits = {
        "wb": weights(4, 3, 3, 3),
        "ws": weights(classes, 3, 3, 3),
        "s_boxes": _i64(1, 4, 64),
        "s_scores": _i64(1, classes, 64),
        "s_flat": _i64(1, 64 * classes),
        "k": _i64(k),
        "c": _i64(classes),
        "minus1": _i64(-1),
        "s_pick": _i64(1, k, 4),
    }
    return model(nodes, {"x": [1, 3, 8, 8]}, ["top", "label", "picked"], inits)


def test_detector_tail_topk_div_mod_gather_elements(tmp_path: Path) -> None:
    result = export(_detector(), tmp_path)
    ops = opcodes(result)
    assert {"TOPK_V2", "GATHER_ND", "FLOOR_DIV", "FLOOR_MOD"} <= set(ops)
    assert result.report.passed


def test_topk_smallest(tmp_path: Path) -> None:
    nodes = [N("TopK", ["x", "k"], ["v", "i"], axis=1, largest=0)]
    proto = model(nodes, {"x": [2, 7, 3]}, ["v", "i"], {"k": _i64(3)})
    ops = opcodes(export(proto, tmp_path))
    assert ops.count("NEG") == 2 and "TOPK_V2" in ops


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements_runtime_indices_each_axis(tmp_path: Path, axis: int) -> None:
    """Indices computed at run time (an ArgMax's, tiled), negative ones wrapped."""
    nodes = [
        N(
            "ArgMax",
            [
                "x",
            ],
            ["am"],
            axis=axis,
            keepdims=1,
        ),
        N("Sub", ["am", "one"], ["shifted"]),  # may be -1: counted from the end
        N("GatherElements", ["x", "shifted"], ["y"], axis=axis),
    ]
    proto = model(nodes, {"x": [3, 4, 5]}, ["y"], {"one": _i64(1)})
    assert "GATHER_ND" in opcodes(export(proto, tmp_path))


def test_gather_elements_constant_indices(tmp_path: Path) -> None:
    idx = np.asarray([[0, -1, 2], [1, 0, -3]], dtype=np.int64)
    nodes = [N("GatherElements", ["x", "idx"], ["y"], axis=1)]
    proto = model(nodes, {"x": [2, 4]}, ["y"], {"idx": idx})
    assert "GATHER_ND" in opcodes(export(proto, tmp_path))


@pytest.mark.parametrize("fmod", [0, 1])
def test_integer_div_and_mod_of_negative_numbers(tmp_path: Path, fmod: int) -> None:
    """ONNX's integer Div truncates toward zero; Mod takes the divisor's sign (fmod=0) or the
    dividend's (fmod=1): on negative dividends and divisors, where floor and trunc differ."""
    nodes = [
        N("Div", ["a", "b"], ["q"]),
        N("Mod", ["a", "b"], ["r"], fmod=fmod),
        N("Div", ["a", "three"], ["q3"]),
    ]
    types = {"a": TensorProto.INT64, "b": TensorProto.INT64}
    proto = model(
        nodes, {"a": [2, 6], "b": [2, 6]}, ["q", "r", "q3"], {"three": _i64(-3)}, input_types=types
    )
    a = np.asarray([[-7, -6, -1, 0, 5, 7], [9, -9, 4, -4, 13, -13]], dtype=np.int64)
    b = np.asarray([[2, -2, 3, 5, -3, 3], [4, 4, -4, -3, 5, -5]], dtype=np.int64)
    export(proto, tmp_path, samples={"a": a, "b": b})


def test_float_mod_takes_the_dividends_sign(tmp_path: Path) -> None:
    nodes = [N("Mod", ["a", "b"], ["r"], fmod=1), N("Mod", ["a", "c"], ["rc"], fmod=1)]
    proto = model(nodes, {"a": [2, 5], "b": [2, 5]}, ["r", "rc"], {"c": np.float32(-1.5)})
    a = np.asarray([[-7.5, -6, -1, 0.25, 5], [9, -9.5, 4, -4, 13]], dtype=np.float32)
    b = np.asarray([[2, -2, 3, 5, -3], [4, 4, -4.5, -3, 5]], dtype=np.float32)
    assert "FLOOR_MOD" in opcodes(export(proto, tmp_path, samples={"a": a, "b": b}))


def test_gather_nd_runtime_and_constant_coordinates(tmp_path: Path) -> None:
    """GatherND (batch_dims 0): coordinates computed at run time (an ArgMax's, some negative
    after a Sub) and constant ones with negatives."""
    nodes = [
        N("ArgMax", ["x"], ["am"], axis=2, keepdims=1),  # [3, 4, 1]: along the last axis
        N("Sub", ["am", "one"], ["col"]),
        N("GatherND", ["rows", "col"], ["picked"]),  # rows [5, 6]: coordinates of rank 1
        N("GatherND", ["x", "fixed"], ["fixed_y"]),
    ]
    inits = {
        "one": _i64(1),
        "rows": weights(5, 6),
        "fixed": np.asarray([[0, -1], [2, 1], [-3, 0]], dtype=np.int64),
    }
    proto = model(nodes, {"x": [3, 4, 5]}, ["picked", "fixed_y"], inits)
    assert opcodes(export(proto, tmp_path)).count("GATHER_ND") == 2
