"""The decoder as one ONNX graph, written with onnx_ir from a :class:`DecoderConfig` and its
weights (ferry writes the graph; it does not trace a model).

I/O is Hugging Face optimum's layout, so existing ONNX decoders read the same: ``input_ids``,
``attention_mask`` (past + new, 1 = attend), ``position_ids`` and ``past_key_values.{i}.key/value``
in; ``logits`` and ``present.{i}.key/value`` out. The same graph serves the prompt (past of length
0) and every new token; causal, padding and sliding-window masks are computed inside.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import onnx_ir as ir

from ferry.errors import InvalidInputError
from ferry.generate._graph_attention import (
    FusedInputs,
    Masks,
    Rope,
    apply_rope,
    attend,
    attend_fused,
    build_fused_inputs,
    build_masks,
    build_rope,
)
from ferry.generate._graph_ops import MS_DOMAIN, OPSET, Builder
from ferry.generate._graph_quant import Quantizer

if TYPE_CHECKING:
    from ferry.generate._config import DecoderConfig

__all__ = ["FLAVOURS", "PRECISIONS", "build_decoder"]

#: "standard": plain ONNX ops every engine reads; "ort": onnxruntime's contrib operators.
FLAVOURS = ("standard", "ort")
#: Weight precisions the graph builder writes.
PRECISIONS = ("fp32", "fp16", "bf16", "int8", "int4")


class WeightLike(Protocol):
    """One tensor of :class:`~ferry.generate.DecoderWeights` (the part the graph reads)."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    def float(self) -> np.ndarray: ...

    def blocks(self) -> Any: ...


class WeightsLike(Protocol):
    """:class:`~ferry.generate.DecoderWeights`, as the graph reads it."""

    def __getitem__(self, name: str) -> WeightLike: ...

    def __contains__(self, name: object) -> bool: ...


def build_decoder(
    config: DecoderConfig,
    weights: WeightsLike,
    *,
    precision: str = "fp32",
    flavour: str = "standard",
    accuracy_level: int = 0,
) -> ir.Model:
    """Write the decoder graph.

    Args:
        config: The model's hyper-parameters.
        weights: Its tensors by canonical name ("embed", "layers.0.q", ...).
        precision: "fp32"; "fp16"/"bf16": the embedding and projections stored in half
            precision and widened to float32 for each product (activations, I/O and the
            key/value cache stay float32); "int4"/"int8": GGUF Q4_0/Q4_1/Q8_0 blocks taken as
            they are and the rest quantized per block of 32, as onnxruntime's MatMulNBits (ort
            flavour) or blocked DequantizeLinear -> MatMul (standard flavour).
        flavour: "standard" (plain ONNX ops) or "ort" (onnxruntime contrib operators).
        accuracy_level: MatMulNBits' accuracy_level for the ort flavour's quantized builds: 0
            multiplies float activations (exact against the dequantized weights); 4 quantizes
            activations to int8 per block as llama.cpp does, faster on CPU. The standard
            flavour leaves it to the engine: onnxruntime fuses DequantizeLinear -> MatMul into
            MatMulNBits at its session option ``session.qdq_matmulnbits_accuracy_level``
            (default 4), OpenVINO quantizes activations unless
            ``DYNAMIC_QUANTIZATION_GROUP_SIZE`` is 0.

    Returns:
        The model; its metadata says "ferry.generative" = "decoder" and carries the config as
        JSON ("ferry.decoder_config") and, for quantized builds, each requantized tensor's max
        absolute error ("ferry.requantization").

    Raises:
        InvalidInputError: An unknown precision or flavour, or a config the graph cannot express.
    """
    if precision not in PRECISIONS:
        raise InvalidInputError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if flavour not in FLAVOURS:
        raise InvalidInputError(f"flavour {flavour!r} is not one of {', '.join(FLAVOURS)}")
    if config.num_heads % config.num_kv_heads:
        raise InvalidInputError(
            f"num_heads {config.num_heads} is not a multiple of num_kv_heads {config.num_kv_heads}"
        )
    b = Builder(fused=flavour == "ort")
    quant = Quantizer(b, precision, accuracy_level)
    kv_shape: list[int | str] = ["batch", config.num_kv_heads, "past_sequence", config.head_dim]
    inputs = [
        ir.val("input_ids", ir.DataType.INT64, ir.Shape(["batch", "sequence"])),
        ir.val("attention_mask", ir.DataType.INT64, ir.Shape(["batch", "total_sequence"])),
        ir.val("position_ids", ir.DataType.INT64, ir.Shape(["batch", "sequence"])),
    ]
    pasts = []
    for i in range(config.num_layers):
        for part in ("key", "value"):
            pasts.append(
                ir.val(f"past_key_values.{i}.{part}", ir.DataType.FLOAT, ir.Shape(kv_shape))
            )
    input_ids, attention_mask, position_ids = inputs

    masks = build_masks(b, input_ids, attention_mask, config)
    fused = build_fused_inputs(b, attention_mask, masks) if b.fused else None
    rope = build_rope(b, position_ids, config)
    # gemma3's sliding layers rotate with their own base
    local_rope = (
        build_rope(b, position_ids, config, local=True) if config.rope_local_theta else rope
    )
    # the float table, unless the embedding gathers from its quantized blocks (then only
    # quantized builds, whose head never reads the float table)
    hidden = quant.embedding(input_ids, weights["embed"])
    embed_value = None
    if hidden is None:
        embed_value = b.init("embed", quant.stored(weights["embed"].float()))
        # a half table is gathered as stored and only the rows widened
        hidden = quant.widened(b.op("Gather", [embed_value, input_ids]))
    if config.embedding_scale != 1.0:
        hidden = b.op("Mul", [hidden, b.const(config.embedding_scale)])
    # Quantized ort builds run the layers on rows [tokens, features]: Q4_1's correction is then
    # one Gemm per product instead of a MatMul and an Add (GroupQueryAttention takes 3D).
    rows = _Rows(b, input_ids) if b.fused and quant.quantized else None
    if rows is not None:
        hidden = rows.flat(hidden, config.hidden_size)
        quant.rows = True

    presents: list[ir.Value] = []
    delta: ir.Value | None = None  # the residual branch not yet added (fused into the next norm)
    for i in range(config.num_layers):
        hidden, delta, key, value = _layer(
            b,
            quant,
            weights,
            config,
            i,
            hidden,
            delta,
            pasts[2 * i],
            pasts[2 * i + 1],
            masks,
            rope,
            local_rope,
            fused,
            rows,
        )
        presents += [key, value]

    hidden, _ = _add_norm(b, weights, config, "final_norm", hidden, delta)
    if rows is not None:
        hidden = rows.unflat(hidden, config.hidden_size)
        quant.rows = False
    # logits_to_keep (optional, default 0 = every position): only the last k positions go
    # through the output head. Generation needs the last one; the head over a whole prompt
    # (128 x 576 x 49,152 for SmolLM2) is a large share of the first token's time and memory.
    keep = ir.val("logits_to_keep", ir.DataType.INT64, ir.Shape([]))
    keep.const_value = ir.tensor(np.array(0, dtype=np.int64), name="logits_to_keep")
    start = b.op("Neg", [b.op("Unsqueeze", [keep, b.ints([0])])])
    hidden = b.op("Slice", [hidden, start, b.ints([np.iinfo(np.int64).max]), b.ints([1])])
    logits = _lm_head(b, quant, weights, config, hidden, embed_value)
    if config.final_softcap:
        cap = float(config.final_softcap)
        logits = b.op(
            "Mul", [b.op("Tanh", [b.op("Mul", [logits, b.const(1.0 / cap)])]), b.const(cap)]
        )
    logits = b.op("Identity", [logits], name="logits")
    logits.dtype = ir.DataType.FLOAT
    logits.shape = ir.Shape(["batch", "kept_sequence", config.vocab_size])
    total_shape = ir.Shape(["batch", config.num_kv_heads, "total_sequence", config.head_dim])
    for i, present in enumerate(presents):
        present.name = f"present.{i // 2}.{'key' if i % 2 == 0 else 'value'}"
        present.dtype = ir.DataType.FLOAT
        present.shape = total_shape

    opsets = {"": OPSET}
    if b.uses_ms:
        opsets[MS_DOMAIN] = 1
    graph = ir.Graph(
        inputs=[*inputs, *pasts, keep],
        outputs=[logits, *presents],
        nodes=b.tape.nodes,
        initializers=[*b.tape.initializers, keep],
        opset_imports=opsets,
        name=f"ferry_{config.architecture}_decoder",
    )
    model = ir.Model(graph, ir_version=10, producer_name="ferry")
    model.metadata_props["ferry.generative"] = "decoder"
    model.metadata_props["ferry.decoder_config"] = json.dumps(config.to_dict())
    model.metadata_props["ferry.precision"] = precision
    model.metadata_props["ferry.flavour"] = flavour
    if quant.errors:
        model.metadata_props["ferry.requantization"] = json.dumps(quant.errors)
    return model


def _norm(
    b: Builder, weights: WeightsLike, config: DecoderConfig, name: str, x: ir.Value
) -> ir.Value:
    weight = weights[name].float()
    if config.norm_plus_one:
        weight = weight + 1.0
    return b.rms_norm(x, weight, config.rms_norm_eps, name)


def _add_norm(
    b: Builder,
    weights: WeightsLike,
    config: DecoderConfig,
    name: str,
    hidden: ir.Value,
    delta: ir.Value | None,
) -> tuple[ir.Value, ir.Value]:
    """hidden + delta, and its norm: one SkipSimplifiedLayerNormalization in the ort flavour."""
    if delta is None:
        return _norm(b, weights, config, name, hidden), hidden
    if not b.fused:
        total = b.op("Add", [hidden, delta])
        return _norm(b, weights, config, name, total), total
    weight = weights[name].float()
    if config.norm_plus_one:
        weight = weight + 1.0
    normed, _, _, total = b.ops(
        "SkipSimplifiedLayerNormalization",
        [hidden, delta, b.init(name, weight.astype(np.float32))],
        {"epsilon": float(config.rms_norm_eps)},
        num_outputs=4,
        domain=MS_DOMAIN,
    )
    return normed, total


def _layer(
    b: Builder,
    quant: Quantizer,
    weights: WeightsLike,
    config: DecoderConfig,
    i: int,
    hidden: ir.Value,
    delta: ir.Value | None,
    past_key: ir.Value,
    past_value: ir.Value,
    masks: Masks,
    rope: Rope,
    local_rope: Rope,
    fused: FusedInputs | None,
    rows: _Rows | None = None,
) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value]:
    """One pre-norm block (gemma adds post-norms) on hidden + delta; returns the residual, the
    feed-forward's branch still to add, and present k/v. With ``rows``, hidden, delta and the
    projections are 2D [tokens, features] and only attention sees [batch, sequence, ...]."""
    p = f"layers.{i}."
    x, hidden = _add_norm(b, weights, config, p + "attn_norm", hidden, delta)
    names = [p + "q", p + "k", p + "v"]
    sliding = bool(config.sliding_pattern[i]) if i < len(config.sliding_pattern) else False
    layer_rope = local_rope if sliding else rope
    if fused is not None and _rotates_inside(weights, config, layer_rope, names):
        packed = quant.joined(x, [weights[n] for n in names], p + "qkv", names)
        if packed is not None:
            biases = [weights[n + "_bias"].float() for n in names if n + "_bias" in weights]
            if biases:
                packed = b.op("Add", [packed, b.init(p + "qkv_bias", np.concatenate(biases))])
            if rows is not None:
                width = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
                packed = rows.unflat(packed, width)
            bias = fused.sliding_bias if sliding and fused.sliding_bias is not None else fused.bias
            context, key, value = attend_fused(
                b, packed, None, None, past_key, past_value, bias, fused, config, layer_rope
            )
            if rows is not None:
                context = rows.flat(context, config.num_heads * config.head_dim)
            return _feed_forward(b, quant, weights, config, p, hidden, context, key, value)
    if rows is not None:
        # q, k, v stored unalike (or normed per head): this block's projections stay 3D
        x = rows.unflat(x, config.hidden_size)
        quant.rows = False
    projected = quant.linears(x, [weights[n] for n in names], p + "qkv", names)
    q, k, v = (
        _heads(b, weights, config, n, y, heads, flat=fused is not None)
        for n, y, heads in zip(
            names, projected, (config.num_heads, config.num_kv_heads, config.num_kv_heads)
        )
    )
    if fused is not None:
        q = apply_rope(b, q, layer_rope, config.num_heads)
        k = apply_rope(b, k, layer_rope, config.num_kv_heads)
        bias = fused.sliding_bias if sliding and fused.sliding_bias is not None else fused.bias
        context, key, value = attend_fused(b, q, k, v, past_key, past_value, bias, fused, config)
        if rows is not None:
            context = rows.flat(context, config.num_heads * config.head_dim)
            quant.rows = True
        return _feed_forward(b, quant, weights, config, p, hidden, context, key, value)
    q = apply_rope(b, q, layer_rope)
    k = apply_rope(b, k, layer_rope)
    key = b.op("Concat", [past_key, k], {"axis": 2})
    value = b.op("Concat", [past_value, v], {"axis": 2})
    mask = masks.sliding if sliding and masks.sliding is not None else masks.full
    context = attend(b, q, key, value, mask, config)
    return _feed_forward(b, quant, weights, config, p, hidden, context, key, value)


class _Rows:
    """Reshapes between [batch, sequence, width] and rows [batch * sequence, width]."""

    def __init__(self, b: Builder, input_ids: ir.Value) -> None:
        self.b = b
        self.batch_sequence = b.op("Shape", [input_ids])  # [B, S]
        self._shapes: dict[int, ir.Value] = {}

    def flat(self, x: ir.Value, width: int) -> ir.Value:
        """[..., width] as rows [-1, width]."""
        return self.b.op("Reshape", [x, self.b.ints([-1, width])])

    def unflat(self, x: ir.Value, width: int) -> ir.Value:
        """Rows [B * S, width] as [B, S, width] (B, S from input_ids; one shape per width)."""
        if width not in self._shapes:
            self._shapes[width] = self.b.op(
                "Concat", [self.batch_sequence, self.b.ints([width])], {"axis": 0}
            )
        return self.b.op("Reshape", [x, self._shapes[width]])


def _rotates_inside(
    weights: WeightsLike, config: DecoderConfig, rope: Rope, names: list[str]
) -> bool:
    """GroupQueryAttention can take q, k, v packed and rotate them itself: whole-width rotary
    on heads a multiple of 16 wide (its rotary kernel's rule), no per-head norm between the
    projection and the rotation, biases on all three or none."""
    biased = [n + "_bias" in weights for n in names]
    return (
        rope.position_ids is not None
        and rope.rotary_dim == config.head_dim
        and config.head_dim % 16 == 0
        and not any(n + "_norm" in weights for n in names)
        and (all(biased) or not any(biased))
    )


def _feed_forward(
    b: Builder,
    quant: Quantizer,
    weights: WeightsLike,
    config: DecoderConfig,
    p: str,
    hidden: ir.Value,
    context: ir.Value,
    key: ir.Value,
    value: ir.Value,
) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value]:
    """The attention output projection and the gated feed-forward of one block."""
    out = quant.linear(context, weights[p + "o"], p + "o")
    if p + "post_attn_norm" in weights:
        out = _norm(b, weights, config, p + "post_attn_norm", out)
    x, hidden = _add_norm(b, weights, config, p + "ffn_norm", hidden, out)
    gate, up = quant.linears(
        x, [weights[p + "gate"], weights[p + "up"]], p + "gate_up", [p + "gate", p + "up"]
    )
    if config.activation == "silu":
        act = b.op("Mul", [gate, b.op("Sigmoid", [gate])])
    elif config.activation == "gelu_tanh":
        act = b.op("Gelu", [gate], {"approximate": "tanh"})
    else:
        raise InvalidInputError(f"activation {config.activation!r} is not one of silu, gelu_tanh")
    out = quant.linear(b.op("Mul", [act, up]), weights[p + "down"], p + "down")
    if p + "post_ffn_norm" in weights:
        out = _norm(b, weights, config, p + "post_ffn_norm", out)
    return hidden, out, key, value


def _heads(
    b: Builder,
    weights: WeightsLike,
    config: DecoderConfig,
    name: str,
    y: ir.Value,
    heads: int,
    *,
    flat: bool = False,
) -> ir.Value:
    """A projected q/k/v (+ bias, + per-head RMSNorm) split into [B, heads, S, d], or kept
    [B, S, heads*d] when flat (GroupQueryAttention's layout)."""
    if name + "_bias" in weights:
        y = b.op("Add", [y, b.init(name + "_bias", weights[name + "_bias"].float())])
    if flat and name + "_norm" not in weights:
        return y
    y = b.op("Reshape", [y, b.ints([0, 0, heads, config.head_dim])])
    if name + "_norm" in weights:
        y = _norm(b, weights, config, name + "_norm", y)
    if flat:
        return b.op("Reshape", [y, b.ints([0, 0, heads * config.head_dim])])
    return b.op("Transpose", [y], {"perm": [0, 2, 1, 3]})


def _lm_head(
    b: Builder,
    quant: Quantizer,
    weights: WeightsLike,
    config: DecoderConfig,
    hidden: ir.Value,
    embed_value: ir.Value | None,
) -> ir.Value:
    """The output projection; tied to the embedding, it reads the same initializer (fp32)."""
    tied = "lm_head" not in weights
    source = weights["embed"] if tied else weights["lm_head"]
    if quant.quantized:
        return quant.linear(hidden, source, "lm_head")
    # Gemm with transB reads the (vocab, hidden) matrix as stored: no transposed copy, and a
    # tied head shares the embedding's initializer.
    flat = b.op("Reshape", [hidden, b.ints([-1, config.hidden_size])])
    if tied and embed_value is not None:
        weight = embed_value
    else:
        weight = b.init("lm_head", quant.stored(source.float()))
    logits = b.op("Gemm", [flat, quant.widened(weight)], {"transB": 1})
    out_shape = b.op(
        "Concat",
        [b.op("Shape", [hidden], {"start": 0, "end": 2}), b.ints([config.vocab_size])],
        {"axis": 0},
    )
    return b.op("Reshape", [logits, out_shape])
