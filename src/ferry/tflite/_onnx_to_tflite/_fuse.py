"""Peephole passes on the written TFLite subgraph, after every node is lowered.

Before -> After::

    CONV_2D -> RELU                     ->  CONV_2D(fused_activation_function=RELU)
    FULLY_CONNECTED(no bias) -> ADD(b)  ->  FULLY_CONNECTED(bias=b)
    ADD(x, 3, RELU6) -> MUL(x) -> MUL(1/6)  ->  HARD_SWISH(x)
    RESHAPE -> RESHAPE                  ->  RESHAPE
    ops whose results nobody reads      ->  (removed)
    float32 weight (fp16 export)        ->  float16 weight -> DEQUANTIZE
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection

import numpy as np

from ferry.tflite._onnx_to_tflite._builder import FLOAT16, FLOAT32, Builder

__all__ = [
    "FUSABLE",
    "cleanup",
    "fuse_activations",
    "fuse_bias",
    "fuse_hard_swish",
    "weights_to_fp16",
]

#: TFLite activation codes (ActivationFunctionType) of the ops that can be fused.
_ACTIVATIONS = {"RELU": 1, "RELU_N1_TO_1": 2, "RELU6": 3}

#: Ops with a fused_activation_function option that LiteRT's float kernels (and XNNPACK) apply.
FUSABLE = {
    "ADD", "SUB", "MUL", "DIV", "CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED",
    "AVERAGE_POOL_2D", "MAX_POOL_2D", "CONCATENATION",
}  # fmt: skip


def _readers(b: Builder) -> dict[int, list[int]]:
    found: dict[int, list[int]] = defaultdict(list)
    for k, op in enumerate(b.operators):
        for i in op.inputs:
            if i >= 0:
                found[i].append(k)
    return found


def _drop(b: Builder, gone: Collection[int]) -> None:
    if gone:
        b.operators = [op for k, op in enumerate(b.operators) if k not in gone]


def fuse_activations(b: Builder, outputs: Collection[int]) -> int:
    """Fold RELU / RELU6 / RELU_N1_TO_1 into the op before them when nothing else reads that op's
    result. Returns how many were fused."""
    readers = _readers(b)
    producer = {o: k for k, op in enumerate(b.operators) for o in op.outputs}
    gone: set[int] = set()
    for k, op in enumerate(b.operators):
        code = _ACTIVATIONS.get(op.opcode)
        if code is None:
            continue
        source = op.inputs[0]
        p = producer.get(source)
        if p is None or p in gone or source in outputs or len(readers[source]) != 1:
            continue
        before = b.operators[p]
        if before.opcode not in FUSABLE or before.options.get("fused_activation_function", 0) != 0:
            continue
        if "fused_activation_function" not in before.options:
            continue
        if b.tensors[source].type != b.tensors[op.outputs[0]].type:
            continue
        if (b.tensors[source].quant is None) != (b.tensors[op.outputs[0]].quant is None):
            continue
        before.options["fused_activation_function"] = code
        before.outputs = (op.outputs[0], *before.outputs[1:])
        producer[op.outputs[0]] = p
        gone.add(k)
    _drop(b, gone)
    return len(gone)


def _scalar(b: Builder, index: int) -> float | None:
    data = b.tensors[index].data
    if data is None or data.size != 1 or b.tensors[index].type != FLOAT32:
        return None
    return float(data.reshape(()))


def fuse_hard_swish(b: Builder, outputs: Collection[int]) -> int:
    """HardSwish written out as exporters write it for opsets before 14, as one HARD_SWISH.

    Before -> After::

        t = ADD(x, 3, RELU6); u = MUL(x, t); y = MUL(u, 1/6)     ->  y = HARD_SWISH(x)
        t = ADD(x, 3, RELU6); u = MUL(t, 1/6); y = MUL(x, u)     ->  y = HARD_SWISH(x)
    """
    readers = _readers(b)
    gone: set[int] = set()

    def sole(t: int) -> int | None:
        users = readers.get(t, [])
        return users[0] if len(users) == 1 and t not in outputs else None

    def other(op_index: int, mine: int) -> int | None:
        ins = b.operators[op_index].inputs
        if len(ins) != 2 or mine not in ins:
            return None
        return ins[1] if ins[0] == mine else ins[0]

    for k, op in enumerate(b.operators):
        if op.opcode != "ADD" or op.options.get("fused_activation_function") != 3 or k in gone:
            continue
        x, three = op.inputs
        if _scalar(b, three) != 3.0:
            x, three = three, x
        if _scalar(b, three) != 3.0 or b.tensors[x].type != FLOAT32:
            continue
        t = op.outputs[0]
        first = sole(t)
        if first is None or b.operators[first].opcode != "MUL":
            continue
        u = b.operators[first].outputs[0]
        second = sole(u)
        if second is None or b.operators[second].opcode != "MUL":
            continue
        p1, p2 = other(first, t), other(second, u)
        sixth = p2 if p1 == x else (p1 if p2 == x else None)
        value = _scalar(b, sixth) if sixth is not None else None
        if value is None or abs(value * 6 - 1) > 1e-6:
            continue
        if any(b.operators[i].options.get("fused_activation_function", 0) for i in (first, second)):
            continue
        final = b.operators[second]
        final.opcode, final.inputs, final.options = "HARD_SWISH", (x,), {}
        gone.update({k, first})
    _drop(b, gone)
    return len(gone) // 2


def fuse_bias(b: Builder, outputs: Collection[int]) -> int:
    """Fold an ADD of a constant vector over the last axis into the FULLY_CONNECTED before it
    (MatMul + Add as exporters write a linear layer)."""
    readers = _readers(b)
    producer = {o: k for k, op in enumerate(b.operators) for o in op.outputs}
    gone: set[int] = set()
    for k, op in enumerate(b.operators):
        if op.opcode != "ADD" or op.options.get("fused_activation_function", 0) != 0:
            continue
        for mine, other in ((0, 1), (1, 0)):
            source, bias = op.inputs[mine], op.inputs[other]
            p = producer.get(source)
            if p is None or p in gone or source in outputs or len(readers[source]) != 1:
                continue
            fc = b.operators[p]
            if fc.opcode != "FULLY_CONNECTED" or len(fc.inputs) < 3 or fc.inputs[2] >= 0:
                continue
            data = b.tensors[bias].data
            units = b.tensors[fc.inputs[1]].shape[0]
            if data is None or b.tensors[bias].type != FLOAT32 or b.tensors[source].type != FLOAT32:
                continue
            if data.size not in (1, units) or (data.ndim and data.shape[-1] not in (1, units)):
                continue
            if b.tensors[op.outputs[0]].shape != b.tensors[source].shape:
                continue  # the ADD broadcasts the result itself: not a bias
            vector = np.broadcast_to(data.reshape(-1), (units,)).astype(np.float32)
            fc.inputs = (fc.inputs[0], fc.inputs[1], b.const(vector, b.tensors[bias].name))
            fc.outputs = (op.outputs[0],)
            producer[op.outputs[0]] = p
            gone.add(k)
            break
    _drop(b, gone)
    return len(gone)


def cleanup(b: Builder, outputs: Collection[int]) -> None:
    """Merge RESHAPE chains and remove ops whose results nobody reads."""
    readers = _readers(b)
    producer = {o: k for k, op in enumerate(b.operators) for o in op.outputs}
    for op in b.operators:
        if op.opcode != "RESHAPE":
            continue
        p = producer.get(op.inputs[0])
        if p is not None and b.operators[p].opcode == "RESHAPE":
            op.inputs = (b.operators[p].inputs[0], *op.inputs[1:])
    while True:
        readers = _readers(b)
        dead = {
            k
            for k, op in enumerate(b.operators)
            if not any(readers.get(o) or o in outputs for o in op.outputs)
        }
        if not dead:
            return
        _drop(b, dead)


def weights_to_fp16(b: Builder, minimum: int = 16) -> int:
    """Store float32 constants of ``minimum``+ elements as float16 with a DEQUANTIZE to float32
    in front of the ops (how TFLite's converter writes float16 weights: half the size, the same
    float kernels; XNNPACK folds the DEQUANTIZE at load). Returns how many were converted."""
    readers = _readers(b)
    converted = []
    for index, t in enumerate(b.tensors):
        if t.data is None or t.type != FLOAT32 or t.data.size < minimum or not readers.get(index):
            continue
        converted.append(index)
    dequantize = []
    for index in converted:
        t = b.tensors[index]
        assert t.data is not None
        half = b.tensor(f"{t.name}/fp16", FLOAT16, t.shape, data=t.data.astype(np.float16))
        t.data = None  # the float32 tensor is now computed, by the DEQUANTIZE
        dequantize.append((half, index))
    ops = b.operators
    b.operators = []
    for half, index in dequantize:
        b.op("DEQUANTIZE", [half], [index])
    b.operators.extend(ops)
    return len(converted)
