"""Attention in standard ONNX ops: the causal/padding/sliding masks, rotary position embedding
computed in-graph from position_ids, and grouped-query attention over past + new keys.

Shapes: B batch, S new tokens, T = past + S, h heads, d head width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

from ferry.errors import InvalidInputError
from ferry.generate._graph_ops import MS_DOMAIN

if TYPE_CHECKING:
    from ferry.generate._config import DecoderConfig
    from ferry.generate._graph_ops import Builder


@dataclass(frozen=True)
class Masks:
    """Boolean attend-masks, [B, 1, 1, S, T] so they broadcast over (kv head, group)."""

    full: ir.Value
    sliding: ir.Value | None
    #: Each row's last attended slot, int32 [B] (GroupQueryAttention's seqlens_k).
    last_slot: ir.Value


@dataclass(frozen=True)
class Rope:
    """cos/sin tables: [B, 1, S, d/2, 1] (interleaved) or [B, 1, S, d] (halves, concatenated
    twice); or, fused (onnxruntime's RotaryEmbedding), [context, d/2] caches and the positions."""

    cos: ir.Value
    sin: ir.Value
    interleaved: bool
    rotary_dim: int
    position_ids: ir.Value | None = None


def build_masks(
    b: Builder, input_ids: ir.Value, attention_mask: ir.Value, config: DecoderConfig
) -> Masks:
    """Causal + padding masks from the shapes and attention_mask.

    A query's slot is counted back from the row's last attended slot (the new tokens are that
    row's last S slots), independent of position_ids, so left-padded rows whose positions restart
    at 0 still mask causally by slot. The mask may be wider than past + S: slots after the last
    1 are empty, as when the past is a buffer allocated once up to the context and written in
    place (GroupQueryAttention sharing past and present).
    """
    seq = b.op("Shape", [input_ids], {"start": 1, "end": 2})  # [1]
    total = b.op("Squeeze", [b.op("Shape", [attention_mask], {"start": 1, "end": 2}), b.ints([0])])
    slots = b.op("Range", [b.ints(0), total, b.ints(1)])  # [T]
    # The last attended slot per row: argmax of mask * (slot + 1) (0 for an all-zero row).
    ranked = b.op("Mul", [attention_mask, b.op("Add", [slots, b.ints(1)])])
    last = b.op("ArgMax", [ranked], {"axis": 1, "keepdims": 1})  # [B, 1]
    first_new = b.op("Sub", [b.op("Add", [last, b.ints(1)]), seq])  # [B, 1]
    offsets = b.op("Range", [b.ints(0), b.op("Squeeze", [seq, b.ints([0])]), b.ints(1)])  # [S]
    qpos = b.op("Unsqueeze", [b.op("Add", [first_new, offsets]), b.ints([2])])  # [B, S, 1]
    kpos = b.op("Unsqueeze", [slots, b.ints([0, 1])])  # [1, 1, T]
    causal = b.op("LessOrEqual", [kpos, qpos])  # [B, S, T]
    causal = b.op("Unsqueeze", [causal, b.ints([1, 2])])  # [B, 1, 1, S, T]
    pad = b.op("Cast", [attention_mask], {"to": ir.DataType.BOOL})
    pad = b.op("Unsqueeze", [pad, b.ints([1, 2, 3])])  # [B, 1, 1, 1, T]
    last_slot = b.op("Cast", [b.op("Squeeze", [last, b.ints([1])])], {"to": ir.DataType.INT32})
    full = b.op("And", [causal, pad], name="attn_mask")
    sliding = None
    if config.sliding_window and any(config.sliding_pattern):
        # HF's rule: key k is visible to query q when q - k < window.
        distance = b.op("Sub", [qpos, kpos])  # [B, S, T]
        near = b.op("Less", [distance, b.ints(int(config.sliding_window))])
        near = b.op("Unsqueeze", [near, b.ints([1, 2])])
        sliding = b.op("And", [b.op("And", [causal, near]), pad], name="attn_mask_sliding")
    return Masks(full, sliding, last_slot)


def inv_freq(config: DecoderConfig, *, local: bool = False) -> np.ndarray:
    """theta^(-2i/d), with the checkpoint's rope scaling ("linear", "llama3") applied.

    local: the sliding-window layers' table (gemma3: its own base, never scaled).
    """
    d = config.head_dim
    theta = config.rope_local_theta if local and config.rope_local_theta else config.rope_theta
    freq = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    scaling = {} if local else config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in ("default", None):
        pass
    elif kind == "linear":
        freq = freq / float(scaling["factor"])
    elif kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old = float(scaling.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / freq
        scaled = np.where(wavelen > old / low, freq / factor, freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        freq = np.where(medium, smoothed, scaled)
    else:
        raise InvalidInputError(
            f"rope scaling {kind!r} is not supported; supported: default, linear, llama3"
        )
    return freq.astype(np.float32)


def build_rope(
    b: Builder, position_ids: ir.Value, config: DecoderConfig, *, local: bool = False
) -> Rope:
    """cos/sin of position * inv_freq, once for every layer (local: the sliding layers')."""
    if b.fused:
        # onnxruntime's RotaryEmbedding reads cos/sin per position from a [context, d/2] cache.
        positions = np.arange(config.context_length, dtype=np.float32)
        angles = positions[:, None] * inv_freq(config, local=local)[None, :]  # float32, as HF
        suffix = "_local" if local else ""
        return Rope(
            b.init("rope_cos_cache" + suffix, np.cos(angles).astype(np.float32)),
            b.init("rope_sin_cache" + suffix, np.sin(angles).astype(np.float32)),
            config.rope_interleaved,
            config.head_dim,
            position_ids,
        )
    pos = b.op("Cast", [position_ids], {"to": ir.DataType.FLOAT})
    pos = b.op("Unsqueeze", [pos, b.ints([1, 3])])  # [B, 1, S, 1]
    table = b.init(
        "rope_inv_freq_local" if local else "rope_inv_freq", inv_freq(config, local=local)
    )
    angles = b.op("Mul", [pos, table])  # [B, 1, S, d/2]
    cos = b.op("Cos", [angles])
    sin = b.op("Sin", [angles])
    if config.rope_interleaved:
        cos = b.op("Unsqueeze", [cos, b.ints([-1])])  # [B, 1, S, d/2, 1]
        sin = b.op("Unsqueeze", [sin, b.ints([-1])])
    else:
        cos = b.op("Concat", [cos, cos], {"axis": -1})
        sin = b.op("Concat", [sin, sin], {"axis": -1})
    return Rope(cos, sin, config.rope_interleaved, config.head_dim)


def apply_rope(b: Builder, x: ir.Value, rope: Rope, heads: int = 0) -> ir.Value:
    """Rotate x [B, h, S, d]: pairs (2i, 2i+1) when interleaved, else halves (HF's rotate_half)."""
    d = rope.rotary_dim
    if rope.position_ids is not None:
        # 3D [B, S, heads*d] (GroupQueryAttention's layout) needs num_heads; 4D does not
        attrs = {"interleaved": int(rope.interleaved)}
        if heads:
            attrs["num_heads"] = heads
        return b.op(
            "RotaryEmbedding", [x, rope.position_ids, rope.cos, rope.sin], attrs, domain=MS_DOMAIN
        )
    if rope.interleaved:
        pairs = b.op("Reshape", [x, b.ints([0, 0, 0, d // 2, 2])])
        even = b.op("Slice", [pairs, b.ints([0]), b.ints([1]), b.ints([-1])])
        odd = b.op("Slice", [pairs, b.ints([1]), b.ints([2]), b.ints([-1])])
        new_even = b.op("Sub", [b.op("Mul", [even, rope.cos]), b.op("Mul", [odd, rope.sin])])
        new_odd = b.op("Add", [b.op("Mul", [odd, rope.cos]), b.op("Mul", [even, rope.sin])])
        rotated = b.op("Concat", [new_even, new_odd], {"axis": -1})
        return b.op("Reshape", [rotated, b.ints([0, 0, 0, d])])
    first = b.op("Slice", [x, b.ints([0]), b.ints([d // 2]), b.ints([-1])])
    second = b.op("Slice", [x, b.ints([d // 2]), b.ints([d]), b.ints([-1])])
    turned = b.op("Concat", [b.op("Neg", [second]), first], {"axis": -1})
    return b.op("Add", [b.op("Mul", [x, rope.cos]), b.op("Mul", [turned, rope.sin])])


def attend(
    b: Builder,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    mask: ir.Value,
    config: DecoderConfig,
) -> ir.Value:
    """Grouped-query attention: q [B, h, S, d] against k, v [B, kv, T, d] -> [B, S, h*d].

    Queries are grouped [B, kv, h/kv, S, d] so each kv head broadcasts over its group instead of
    being repeated in memory; the scores and softmax stay in float32.
    """
    h, kv, d = config.num_heads, config.num_kv_heads, config.head_dim
    grouped = b.op("Reshape", [q, b.ints([0, kv, h // kv, -1, d])])
    grouped = b.op("Mul", [grouped, b.const(config.query_scale)])
    keys_t = b.op("Transpose", [b.op("Unsqueeze", [k, b.ints([2])])], {"perm": [0, 1, 2, 4, 3]})
    scores = b.op("MatMul", [grouped, keys_t])  # [B, kv, h/kv, S, T]
    if config.attn_softcap:
        cap = float(config.attn_softcap)
        scores = b.op(
            "Mul", [b.op("Tanh", [b.op("Mul", [scores, b.const(1.0 / cap)])]), b.const(cap)]
        )
    # Where, not an additive mask: a fully masked row (a left-pad query) stays finite.
    lowest = b.const(np.finfo(np.float32).min)
    scores = b.op("Where", [mask, scores, lowest])
    probs = b.op("Softmax", [scores], {"axis": -1})
    context = b.op("MatMul", [probs, b.op("Unsqueeze", [v, b.ints([2])])])  # [B, kv, h/kv, S, d]
    context = b.op("Reshape", [context, b.ints([0, h, -1, d])])
    context = b.op("Transpose", [context], {"perm": [0, 2, 1, 3]})
    return b.op("Reshape", [context, b.ints([0, 0, h * d])])


@dataclass(frozen=True)
class FusedInputs:
    """What onnxruntime's GroupQueryAttention reads besides q/k/v: every row's length counted in
    slots (T - 1, pads included) and T, with padding, causality and windows left to an additive
    bias [B, 1, S, T] built from the same masks as the standard form."""

    seqlens_k: ir.Value
    total: ir.Value
    bias: ir.Value
    sliding_bias: ir.Value | None


def build_fused_inputs(b: Builder, attention_mask: ir.Value, masks: Masks) -> FusedInputs:
    """GroupQueryAttention's lengths and biases, once for every layer.

    Each row's length is its last attended slot + 1, pads included: left padding is then masked
    by the bias, not by GroupQueryAttention's right-padding convention, so the optimum layout's
    masks carry over; and with a past buffer allocated up to the context (past and present
    sharing it), the mask is as wide as the buffer and the length still says where to write.
    """
    # T is the longest row's length, not the mask's width: GroupQueryAttention attends over T
    # slots in every row (a batch decoding in a pool 2,048 slots wide spent 285 of 430 ms a
    # step there at 16 rows), and the bias is cut to T with it.
    seqlens = masks.last_slot
    longest = b.op("ReduceMax", [b.op("Cast", [seqlens], {"to": ir.DataType.INT64})])  # [1]
    ends = b.op("Add", [longest, b.ints([1])])  # [1]
    total32 = b.op("Cast", [b.op("Squeeze", [ends, b.ints([0])])], {"to": ir.DataType.INT32})

    def bias(mask: ir.Value) -> ir.Value:
        four = b.op("Squeeze", [mask, b.ints([1])])  # [B, 1, S, T]
        four = b.op("Slice", [four, b.ints([0]), ends, b.ints([3])])
        return b.op("Where", [four, b.const(0.0), b.const(np.finfo(np.float32).min)])

    sliding = bias(masks.sliding) if masks.sliding is not None else None
    return FusedInputs(seqlens, total32, bias(masks.full), sliding)


def attend_fused(
    b: Builder,
    q: ir.Value,
    k: ir.Value | None,
    v: ir.Value | None,
    past_key: ir.Value,
    past_value: ir.Value,
    bias: ir.Value,
    fused: FusedInputs,
    config: DecoderConfig,
    rope: Rope | None = None,
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """onnxruntime's GroupQueryAttention on rotated q [B, S, h*d], k, v [B, S, kv*d] and the past
    [B, kv, P, d]: the context [B, S, h*d] and present key/value [B, kv, T, d].

    With ``rope`` (its fused tables), q is q, k and v packed [B, S, (h + 2 kv) d] and k, v are
    None: GroupQueryAttention rotates q and k itself, by slot (one node for what took a Split
    and two RotaryEmbeddings: fewer nodes per token).
    """
    attrs: dict[str, int | float] = {
        "num_heads": config.num_heads,
        "kv_num_heads": config.num_kv_heads,
        "scale": float(config.query_scale),
    }
    if config.attn_softcap:
        attrs["softcap"] = float(config.attn_softcap)
    cos = sin = None
    if rope is not None:
        attrs["do_rotary"] = 1
        attrs["rotary_interleaved"] = int(rope.interleaved)
        # By slot, not position_ids: a left-padded row's positions restart at 0 while its slots
        # do not, and GroupQueryAttention rotates a batch's prompt by slot whatever it is given;
        # rotary depends only on the distance between positions, which slots keep.
        cos, sin = rope.cos, rope.sin
    out, key, value = b.ops(
        "GroupQueryAttention",
        [q, k, v, past_key, past_value, fused.seqlens_k, fused.total, cos, sin, None, bias],
        attrs,
        num_outputs=3,
        domain=MS_DOMAIN,
    )
    return out, key, value
