"""Recurrent layers (LSTM, GRU), unrolled over the sequence length the export fixes.

TFLite's UNIDIRECTIONAL_SEQUENCE_LSTM keeps its state in variable tensors that carry over from
one invocation to the next (a second call on the same input gives another answer unless the app
resets them), and TFLite has no GRU kernel. ONNX's layers start from ``initial_h`` on every call,
so they are written out step by step, stateless, in ops every delegate runs:

Before -> After (per direction)::

    LSTM(X[T,B,I], W, R, B)  ->  FULLY_CONNECTED over all steps (X W^T + Wb + Rb), UNPACK;
                                 per step: FULLY_CONNECTED(h, R), ADD, SPLIT, 3 LOGISTIC,
                                 TANH, MUL, MUL, ADD, TANH, MUL; PACK the steps
    GRU(X, W, R, B)          ->  the same with the GRU's gates (z, r, h; linear_before_reset)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import onnx_ir as ir

from ferry.tflite._onnx_to_tflite._builder import FLOAT32
from ferry.tflite._onnx_to_tflite._context import Lowering, attr
from ferry.tflite._unsupported import Unsupported

__all__ = ["MAX_STEPS", "OPS"]

#: Steps (sequence length x directions) beyond which a recurrent layer is not unrolled.
MAX_STEPS = 1024

_FC = {"fused_activation_function": 0, "weights_format": 0, "keep_num_dims": False,
       "asymmetric_quantize_inputs": False}  # fmt: skip
_NONE = {"fused_activation_function": 0}

_DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh")}


class _Rnn:
    """The parts every recurrent layer shares: its attributes checked, its input projected."""

    def __init__(self, cx: Lowering, node: ir.Node, gates: int) -> None:
        self.cx = cx
        self.node = node
        x = node.inputs[0]
        if x is None:
            raise Unsupported("the input is missing")
        self.x = x
        direction = attr(node, "direction", "forward")
        self.direction = direction.decode() if isinstance(direction, bytes) else str(direction)
        self.dirs = 2 if self.direction == "bidirectional" else 1
        self.hidden = int(attr(node, "hidden_size"))
        self.layout = int(attr(node, "layout", 0))
        activations = attr(node, "activations", None)
        if activations is not None:
            names = tuple(a.decode() if isinstance(a, bytes) else str(a) for a in activations)
            expected = _DEFAULT_ACTIVATIONS[node.op_type] * self.dirs
            if names != expected:
                raise Unsupported(f"activations {list(names)} (the defaults are lowered)")
        if attr(node, "clip", None) is not None:
            raise Unsupported("clip")
        if len(node.inputs) > 4 and node.inputs[4] is not None:
            raise Unsupported("sequence_lens (every sequence must run the full length)")
        shape = cx.shape(x)
        self.steps, self.batch = (shape[0], shape[1]) if self.layout == 0 else (shape[1], shape[0])
        if self.steps * self.dirs > MAX_STEPS:
            raise Unsupported(
                f"{self.steps} steps x {self.dirs} directions (at most {MAX_STEPS} are unrolled)"
            )
        self.w = self._weight(1, "W")
        self.r = self._weight(2, "R")
        bias_v = node.inputs[3] if len(node.inputs) > 3 else None
        found = cx.const(bias_v) if bias_v is not None else None
        if bias_v is not None and found is None:
            raise Unsupported("the bias B is computed at run time")
        self.b = (
            found
            if found is not None
            else np.zeros((self.dirs, 2 * gates * self.hidden), np.float32)
        )
        self.name = node.name or node.op_type

    def _weight(self, k: int, what: str) -> np.ndarray:
        value = self.node.inputs[k] if len(self.node.inputs) > k else None
        found = self.cx.const(value)
        if found is None:
            raise Unsupported(f"the weights {what} are computed at run time")
        return found.astype(np.float32)

    def initial(self, k: int, d: int) -> int | None:
        """The tensor of initial state input ``k`` for direction ``d`` ([B, H]); None if zero."""
        value = self.node.inputs[k] if len(self.node.inputs) > k else None
        if value is None:
            return None
        found = self.cx.const(value)
        if found is not None:
            part = found[d] if self.layout == 0 else found[:, d]
            if not part.any():
                return None
            return self.cx.constant(
                np.ascontiguousarray(part.astype(np.float32)), f"{self.name}/init{k}"
            )
        perm = (0, 1, 2) if self.layout == 0 else (1, 0, 2)
        whole = self.cx.get(value, perm)
        part = self.tensor(f"init{k}_{d}", (self.batch, self.hidden))
        begin = self.cx.ints([d, 0, 0], "begin")
        size = self.cx.ints([1, self.batch, self.hidden], "size")
        sliced = self.tensor(f"init{k}_{d}/slice", (1, self.batch, self.hidden))
        self.cx.emit("SLICE", [whole, begin, size], [sliced])
        self.cx.emit("RESHAPE", [sliced, self.cx.ints((self.batch, self.hidden))], [part])
        return part

    def tensor(self, suffix: str, shape: tuple[int, ...]) -> int:
        return self.cx.temp(f"{self.name}/{suffix}", FLOAT32, shape)

    def op(self, opcode: str, ins: list[int], shape: tuple[int, ...], suffix: str,
           options: Mapping[str, object] | None = None) -> int:  # fmt: skip
        out = self.tensor(suffix, shape)
        self.cx.emit(opcode, ins, [out], options)
        return out

    def projected(self, d: int, weights: np.ndarray, bias: np.ndarray, tag: str) -> list[int]:
        """``X weights^T + bias`` for every step of direction ``d``, ``[B, rows]`` each."""
        cx = self.cx
        t, bsz, rows = self.steps, self.batch, weights.shape[0]
        source = cx.get(self.x, (0, 1, 2) if self.layout == 0 else (1, 0, 2))
        size = cx.shape(self.x)[2]
        flat = self.op("RESHAPE", [source, cx.ints((t * bsz, size))], (t * bsz, size), f"x{d}")
        w_t = cx.weight(np.ascontiguousarray(weights), f"{self.name}/W{tag}{d}", self.node, axis=0)
        b_t = cx.bias(bias, f"{self.name}/Wb{tag}{d}", self.node, source=flat, weight=w_t)
        xw = self.op("FULLY_CONNECTED", [flat, w_t, b_t], (t * bsz, rows), f"xw{tag}{d}", _FC)
        cube = self.op(
            "RESHAPE", [xw, cx.ints((t, bsz, rows))], (t, bsz, rows), f"xw{tag}{d}/steps"
        )
        if t == 1:
            return [self.op("RESHAPE", [cube, cx.ints((bsz, rows))], (bsz, rows), f"xw{tag}{d}/0")]
        steps = [self.tensor(f"xw{tag}{d}/{i}", (bsz, rows)) for i in range(t)]
        cx.emit("UNPACK", [cube], steps, {"num": t, "axis": 0})
        return steps

    def finish(self, outputs: list[list[int]], last: list[list[int]]) -> None:
        """Write Y (every step's h) and the final states from per-direction lists of tensors:
        ``outputs[d][t]`` is h at step t (in time order), ``last[k][d]`` state k's final value."""
        self.cx.notes.append(
            f"{self.node.op_type} {self.name}: unrolled over its {self.steps} steps x "
            f"{self.dirs} direction(s), stateless (TFLite's sequence kernels keep their state "
            "from one call to the next)"
        )
        cx = self.cx
        node = self.node
        t, bsz, h = self.steps, self.batch, self.hidden
        y = node.outputs[0] if node.outputs else None
        if y is not None and (y.uses() or y.is_graph_output()):
            per_dir = []
            for d in range(self.dirs):
                per_dir.append(
                    self.op(
                        "PACK", outputs[d], (t, bsz, h), f"y{d}", {"values_count": t, "axis": 0}
                    )
                )
            # Y is [T, D, B, H] (layout 0) or [B, T, D, H] (layout 1); the tensor is [T, D, B, H].
            held = (0, 1, 2, 3) if self.layout == 0 else (1, 2, 0, 3)
            dest = cx.output(y, held)
            cx.emit("PACK", per_dir, [dest], {"values_count": self.dirs, "axis": 1})
        for k, finals in enumerate(last, 1):
            value = node.outputs[k] if len(node.outputs) > k else None
            if value is None or not (value.uses() or value.is_graph_output()):
                continue
            state = (0, 1, 2) if self.layout == 0 else (1, 0, 2)
            cx.emit(
                "PACK", finals, [cx.output(value, state)], {"values_count": self.dirs, "axis": 0}
            )

    def order(self, d: int) -> range:
        reverse = self.direction == "reverse" or d == 1
        return range(self.steps - 1, -1, -1) if reverse else range(self.steps)


def _lstm(cx: Lowering, node: ir.Node) -> None:
    if attr(node, "input_forget", 0):
        raise Unsupported("input_forget=1 (coupled gates)")
    if len(node.inputs) > 7 and node.inputs[7] is not None:
        raise Unsupported("peephole weights P")
    rnn = _Rnn(cx, node, 4)
    hsz, bsz = rnn.hidden, rnn.batch
    outputs: list[list[int]] = []
    finals: list[list[int]] = [[], []]
    for d in range(rnn.dirs):
        g = 4 * hsz
        bias = (rnn.b[d, :g] + rnn.b[d, g:]).astype(np.float32)
        xw = rnn.projected(d, rnn.w[d], bias, "")
        r_t = cx.weight(np.ascontiguousarray(rnn.r[d]), f"{rnn.name}/R{d}", node, axis=0)
        h = rnn.initial(5, d)
        c = rnn.initial(6, d)
        steps: dict[int, int] = {}
        for t in rnn.order(d):
            s = f"{d}/{t}"
            gates = xw[t]
            if h is not None:
                rec = rnn.op("FULLY_CONNECTED", [h, r_t, -1], (bsz, g), f"hr{s}", _FC)
                gates = rnn.op("ADD", [gates, rec], (bsz, g), f"gates{s}", _NONE)
            # ONNX orders the gates i, o, f, c: three sigmoids, then the cell's tanh.
            parts = [rnn.tensor(f"{name}_in{s}", (bsz, hsz)) for name in "iofc"]
            cx.emit("SPLIT", [cx.ints([1], "axis"), gates], parts, {"num_splits": 4})
            i, o, f = (rnn.op("LOGISTIC", [p], (bsz, hsz), f"{n}{s}") for p, n in zip(parts, "iof"))
            cand = rnn.op("TANH", [parts[3]], (bsz, hsz), f"cand{s}")
            new = rnn.op("MUL", [i, cand], (bsz, hsz), f"ic{s}", _NONE)
            if c is not None:
                kept = rnn.op("MUL", [f, c], (bsz, hsz), f"fc{s}", _NONE)
                new = rnn.op("ADD", [kept, new], (bsz, hsz), f"c{s}", _NONE)
            c = new
            tc = rnn.op("TANH", [c], (bsz, hsz), f"tc{s}")
            h = rnn.op("MUL", [o, tc], (bsz, hsz), f"h{s}", _NONE)
            steps[t] = h
        assert h is not None and c is not None
        outputs.append([steps[t] for t in range(rnn.steps)])
        finals[0].append(h)
        finals[1].append(c)
    rnn.finish(outputs, finals)


def _gru(cx: Lowering, node: ir.Node) -> None:
    rnn = _Rnn(cx, node, 3)
    hsz, bsz = rnn.hidden, rnn.batch
    before_reset = bool(attr(node, "linear_before_reset", 0))
    outputs: list[list[int]] = []
    finals: list[list[int]] = [[]]
    for d in range(rnn.dirs):
        wb, rb = rnn.b[d, : 3 * hsz], rnn.b[d, 3 * hsz :]
        # z and r: one projection, Rb's parts added to Wb's; h: its own projection (Rb's h part
        # stays inside the reset gate's product, when linear_before_reset).
        xzr = rnn.projected(
            d, rnn.w[d][: 2 * hsz], (wb[: 2 * hsz] + rb[: 2 * hsz]).astype(np.float32), "zr"
        )
        xh = rnn.projected(d, rnn.w[d][2 * hsz :], wb[2 * hsz :].astype(np.float32), "h")
        r_zr = cx.weight(
            np.ascontiguousarray(rnn.r[d][: 2 * hsz]), f"{rnn.name}/Rzr{d}", node, axis=0
        )
        r_h = cx.weight(
            np.ascontiguousarray(rnn.r[d][2 * hsz :]), f"{rnn.name}/Rh{d}", node, axis=0
        )
        rb_t = cx.bias(rb[2 * hsz :].astype(np.float32), f"{rnn.name}/Rbh{d}", node)
        h = rnn.initial(5, d)
        steps: dict[int, int] = {}
        for t in rnn.order(d):
            s = f"{d}/{t}"
            zr_in = xzr[t]
            if h is not None:
                rec = rnn.op("FULLY_CONNECTED", [h, r_zr, -1], (bsz, 2 * hsz), f"hzr{s}", _FC)
                zr_in = rnn.op("ADD", [zr_in, rec], (bsz, 2 * hsz), f"zr_in{s}", _NONE)
            zr = rnn.op("LOGISTIC", [zr_in], (bsz, 2 * hsz), f"zr{s}")
            z, r = rnn.tensor(f"z{s}", (bsz, hsz)), rnn.tensor(f"r{s}", (bsz, hsz))
            cx.emit("SPLIT", [cx.ints([1], "axis"), zr], [z, r], {"num_splits": 2})
            if h is None:
                hh = rb_t  # R h + Rb with h = 0, in either form
            elif before_reset:
                hh = rnn.op("FULLY_CONNECTED", [h, r_h, rb_t], (bsz, hsz), f"hh{s}", _FC)
            else:
                reset = rnn.op("MUL", [r, h], (bsz, hsz), f"rh{s}", _NONE)
                hh = rnn.op("FULLY_CONNECTED", [reset, r_h, rb_t], (bsz, hsz), f"hh{s}", _FC)
            if before_reset:
                hh = rnn.op("MUL", [r, hh], (bsz, hsz), f"rhh{s}", _NONE)
            n_in = rnn.op("ADD", [xh[t], hh], (bsz, hsz), f"n_in{s}", _NONE)
            n = rnn.op("TANH", [n_in], (bsz, hsz), f"n{s}")
            # h' = (1 - z) * n + z * h = n + z * (h - n)
            if h is None:
                zn = rnn.op("MUL", [z, n], (bsz, hsz), f"zn{s}", _NONE)
                h = rnn.op("SUB", [n, zn], (bsz, hsz), f"h{s}", _NONE)
            else:
                diff = rnn.op("SUB", [h, n], (bsz, hsz), f"hn{s}", _NONE)
                zd = rnn.op("MUL", [z, diff], (bsz, hsz), f"zd{s}", _NONE)
                h = rnn.op("ADD", [n, zd], (bsz, hsz), f"h{s}", _NONE)
            steps[t] = h
        assert h is not None
        outputs.append([steps[t] for t in range(rnn.steps)])
        finals[0].append(h)
    rnn.finish(outputs, finals)


OPS: dict[str, Callable[[Lowering, ir.Node], None]] = {"LSTM": _lstm, "GRU": _gru}
