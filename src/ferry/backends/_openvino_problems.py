"""What OpenVINO's CPU plugin is known to get wrong on ONNX: the one list of it, with reasons.

Each entry was found by ONNX's node test cases (``python -m ferry.conformance rules openvino``)
and answers cases where OpenVINO converts an op but computes something else, or cannot convert
a form of it. The rule generator narrows the measured table with it; placement refuses exactly
these when it asks OpenVINO about a whole model (``OpenVINOBackend.capability``): what the tests
merely did not cover is left to the engine.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FLOATS", "INTS", "OVERRIDES", "UINTS", "narrow", "op_schema"]

FLOATS = ("float16", "float32")
INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
UINTS = ("uint8", "uint16", "uint32", "uint64")

# What the test data cannot tell: each entry answers failing cases the derived rule would accept.
#   exclude: the op is not claimed, with the reason.   since: lowest opset claimed.
#   inputs: per-index dtypes, intersected with the derived ones.   max_rank: rank limit.
#   attrs: {name: {"allow"|"deny": values}} (absent attributes take the schema's default).
#   absent: input indices that must be left out.   nonempty: refuse inputs with a zero-size dim
#       (a dynamic dim that is 0 at run time cannot be seen: a known gap, listed in NOTES).
#   variants: several rules, each the derived one narrowed by its own entries.
#   why: the failing cases behind the entry (kept in the generated table as "note").
OVERRIDES: dict[str, dict[str, Any]] = {
    "Attention": {
        "exclude": "wrong results with sliding windows, past key/values with a causal "
        "mask, grouped-query heads 4:1 and softmax_precision (test_attention_*window*, "
        "*_with_past_and_present_qk_matmul_bias_*_mask_causal, *_gqa_*)"
    },
    "BitShift": {
        "inputs": {0: UINTS, 1: UINTS},
        "why": "signed inputs, and shifts >= the bit width, differ from ONNX "
        "(test_bitshift_*_negative_*, *_shift_ge_width, *_overflow)",
    },
    "Col2Im": {
        "exclude": "3-D images fail to convert (test_col2im_5d); the rule cannot see "
        "image_shape's length"
    },
    "DFT": {
        "exclude": "one-sided and inverse-real transforms give wrong shapes, the axis input "
        "wrong values (test_dft_rfft, *_irfft, test_dft_axis)"
    },
    "DequantizeLinear": {
        "since": 13,
        "attrs": {"block_size": {"allow": (0,)}},
        "why": "per-axis before opset 13 and blocked quantization do not convert",
    },
    "Dropout": {"absent": (2,), "why": "training_mode does not convert (test_training_dropout*)"},
    "DynamicQuantizeLinear": {
        "exclude": "rounds differently from ONNX (test_dynamicquantizelinear)"
    },
    "GRU": {"attrs": {"layout": {"deny": (1,)}}, "why": "batch-first layout differs (*_batchwise)"},
    "GridSample": {
        "since": 20,
        "max_rank": 4,
        "why": "opset 16's mode names and volumetric (5-D) sampling do not convert",
    },
    "LSTM": {
        "attrs": {"layout": {"deny": (1,)}},
        "absent": (7,),
        "why": "batch-first layout and peepholes differ (test_lstm_batchwise, *_with_peepholes)",
    },
    "MaxPool": {
        "attrs": {"ceil_mode": {"deny": (1,)}},
        "why": "ceil_mode keeps a window that starts in the padding "
        "(test_maxpool_2d_ceil_output_size_reduce_by_one)",
    },
    "Mod": {
        "variants": [
            {"inputs": {0: INTS, 1: INTS}},
            {"inputs": {0: FLOATS, 1: FLOATS}, "attrs": {"fmod": {"allow": (1,)}}},
        ],
        "why": "float Mod with fmod=0 does not convert (test_mod_*_fmod_0*)",
    },
    "NonMaxSuppression": {
        "exclude": "keeps a box whose IoU equals the threshold "
        "(test_nonmaxsuppression_iou_threshold_boundary)"
    },
    "OneHot": {"since": 11, "why": "opset 9 semantics of negative indices differ"},
    "Pad": {
        "attrs": {"mode": {"deny": ("wrap",)}},
        "why": "mode wrap does not convert (test_wrap_pad)",
    },
    "QuantizeLinear": {
        "since": 13,
        "attrs": {"block_size": {"allow": (0,)}},
        "why": "per-axis before opset 13 and blocked quantization do not convert",
    },
    "RNN": {"attrs": {"layout": {"deny": (1,)}}, "why": "batch-first layout differs (*_batchwise)"},
    "ReduceMax": {"nonempty": True, "why": "an empty reduction gives 0, not -inf (*_empty_set)"},
    "ReduceMin": {"nonempty": True, "why": "an empty reduction gives 0, not inf (*_empty_set)"},
    "Resize": {
        "attrs": {
            "antialias": {"deny": (1,)},
            "coordinate_transformation_mode": {
                "deny": ("tf_crop_and_resize", "half_pixel_symmetric", "align_corners")
            },
            "exclude_outside": {"deny": (1,)},
            "keep_aspect_ratio_policy": {"allow": ("stretch",)},
        },
        "why": "antialias, exclude_outside, aspect-ratio policies, half_pixel_symmetric and "
        "downsampling with align_corners differ; tf_crop_and_resize does not convert",
    },
    "RoiAlign": {
        "attrs": {"mode": {"deny": ("max",)}},
        "why": "mode max differs (test_roialign_mode_max)",
    },
    "Softmax": {
        "since": 13,
        "why": "opset 11's flattening semantics differ (test_softmax_* at 11)",
    },
    "SpaceToDepth": {
        "attrs": {"mode": {"deny": ("CRD",)}},
        "why": "CRD mode differs (test_spacetodepth_crd_mode_example)",
    },
    "TopK": {
        "exclude": "returns a different index than ONNX among equal values "
        "(test_top_k_same_values*)"
    },
}


def narrow(base: dict[str, Any], override: dict[str, Any], schema: Any) -> dict[str, Any]:
    """A rule's limits from an override's entries (attribute defaults from the op's schema)."""
    from onnx import helper

    rule = dict(base)
    if "inputs" in override:
        rule["inputs"] = {i: tuple(t) for i, t in override["inputs"].items()}
    for k in ("since", "max_rank", "nonempty"):
        if k in override:
            rule[k] = override[k]
    if override.get("dynamic") is False:
        rule["dynamic"] = False
    if "absent" in override:
        rule["absent"] = tuple(override["absent"])
    if "attrs" in override:
        attrs = {}
        for name, limit in override["attrs"].items():
            proto = schema.attributes[name].default_value if schema is not None else None
            default = (
                helper.get_attribute_value(proto) if proto is not None and proto.type else None
            )
            if isinstance(default, bytes):
                default = default.decode()
            attrs[name] = {**limit, "default": default}
        rule["attrs"] = attrs
    if "why" in override:
        rule["note"] = override["why"]
    return rule


def op_schema(domain: str, op_type: str, opset: int) -> Any:
    import onnx.defs

    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except Exception:
        return None
