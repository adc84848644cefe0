"""Translate subgraph 0 of a TFLite model into an ``onnx_ir.Model``.

Every operator is translated in the file's order (TFLite stores them in execution order). An op
that cannot be translated is recorded and the walk goes on, so that one error lists every
unsupported op; ops downstream of a failed one are only checked for a translator.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from ferry._version import __version__
from ferry.errors import ConversionError, FerryError, UnsupportedOpError, list_ops
from ferry.tflite._schema import TFLiteModel, TFLiteOperator, TFLiteSubgraph
from ferry.tflite._tflite_to_onnx import (  # noqa: F401  (each fills TRANSLATORS)
    _ops_conv,
    _ops_elementwise,
    _ops_rnn,
    _ops_shape,
)
from ferry.tflite._tflite_to_onnx._builder import Builder
from ferry.tflite._tflite_to_onnx._ops import CONTROL_FLOW, CUSTOM_TRANSLATORS, TRANSLATORS
from ferry.tflite._tflite_to_onnx._state import State, find_state
from ferry.tflite._unsupported import Unsupported

__all__ = ["DEFAULT_OPSET", "input_dims", "translate"]

logger = logging.getLogger(__name__)

#: The opset written: 18 has Resize with ``axes`` (NHWC resize without transposes) and
#: Reduce*/Split with axes as inputs.
DEFAULT_OPSET = 18
# 16-bit QuantizeLinear (int16 activations) arrived in opset 21.
_OPSET_16BIT = 21
_IR_VERSIONS = {18: 8, 21: 10}


def input_dims(
    subgraph: TFLiteSubgraph,
    index: int,
    input_shapes: Mapping[str, Sequence[int | str]] | None = None,
    dynamic_axes: Mapping[str, Mapping[int, str]] | None = None,
) -> list[int | str]:
    """The declared shape of graph input ``index``: TFLite's, open dims made symbolic.

    ``input_shapes`` replaces a shape whole; ``dynamic_axes`` names dims symbolic.
    """
    t = subgraph.tensors[index]
    dims: list[int | str] = [
        d if d is not None else f"{t.name}_dim{i}" for i, d in enumerate(t.dims)
    ]
    if input_shapes and t.name in input_shapes:
        dims = list(input_shapes[t.name])
    for axis, name in ((dynamic_axes or {}).get(t.name) or {}).items():
        if 0 <= axis < len(dims):
            dims[axis] = name
    return dims


def translate(
    model: TFLiteModel,
    source: str,
    *,
    input_shapes: Mapping[str, Sequence[int | str]] | None = None,
    dynamic_axes: Mapping[str, Mapping[int, str]] | None = None,
    state: State | None = None,
) -> ir.Model:
    """Translate ``model``'s main subgraph.

    Resource variables (``_state``, found by :func:`find_state` when not given) become graph
    inputs ``state:<name>``, after the model's own, with their initial values as defaults, and
    graph outputs ``state_out:<name>``, after the model's own.

    Raises:
        UnsupportedOpError: listing every op that cannot be translated, with counts.
        ConversionError: the model is inconsistent in a way the reader did not catch.
    """
    sg = model.subgraphs[0]
    opset = _OPSET_16BIT if _has_16bit_activations(sg) else DEFAULT_OPSET
    if state is None:
        state = find_state(model)
    b = Builder(sg, opset, state)
    for index in sg.inputs:
        try:
            b.add_input(index, input_dims(sg, index, input_shapes, dynamic_axes))
        except Unsupported as e:
            raise ConversionError(
                f"{source}: graph input {sg.tensors[index].name!r}: {e}"
            ) from None
    for variable in state.inputs:
        assert variable.read is not None
        t = sg.tensors[variable.read]
        dims = [
            d if d is not None else f"{variable.input_name}_dim{i}" for i, d in enumerate(t.dims)
        ]
        try:
            b.add_input(variable.read, dims, name=variable.input_name, default=variable.default(sg))
        except (Unsupported, ValueError) as e:
            raise ConversionError(f"{source}: state variable {variable.name!r}: {e}") from None

    problems: list[tuple[TFLiteOperator, str]] = []
    failed: set[int] = set()
    for op in sg.operators:
        b.op = op
        translator = (
            CUSTOM_TRANSLATORS.get(op.custom_code or "")
            if op.opcode == "CUSTOM"
            else TRANSLATORS.get(op.opcode)
        )
        reason = _why_unsupported(op) if translator is None else None
        # A READ_VARIABLE after an ASSIGN_VARIABLE reads the tensor assigned.
        reads = [*op.inputs, *(state.aliases[o] for o in op.outputs if o in state.aliases)]
        if translator is None or any(i in failed for i in reads if i >= 0):
            # Downstream of a failed op only the translator's existence can be checked.
            if reason is not None:
                problems.append((op, reason))
            failed.update(op.outputs)
            continue
        try:
            translator(b, op)
        except Unsupported as e:
            problems.append((op, str(e)))
            failed.update(op.outputs)
            continue
        except FerryError:
            raise
        except (IndexError, KeyError, ValueError, TypeError, ArithmeticError) as e:
            # Translators trust what the reader checked; an op with too few inputs or options
            # that contradict its tensors' shapes lands here.
            raise ConversionError(
                f"{source}: op {_op_label(sg, op)} ({op.display_name}) does not fit its "
                f"tensors ({type(e).__name__}: {e}); the file may be corrupt"
            ) from e
        unbound = [i for i in op.outputs if i >= 0 and not b.is_bound(i)]
        if unbound:
            # Only optional outputs may stay unbound (none of the translated ops has any).
            logger.debug("%s left outputs %s unbound", op.opcode, unbound)
    b.op = None
    if problems:
        raise UnsupportedOpError(_message(source, sg, problems), ops=_op_list(sg, problems))

    try:
        b.finish_outputs()
    except Unsupported as e:
        raise ConversionError(f"{source}: a graph output cannot be expressed: {e}") from None
    graph = ir.Graph(
        b.inputs,
        b.outputs,
        nodes=b.nodes,
        initializers=b.initializers,
        opset_imports={"": opset},
        name=sg.name or "main",
    )
    result = ir.Model(
        graph,
        ir_version=_IR_VERSIONS[opset],
        producer_name="ferry",
        producer_version=__version__,
        doc_string=f"Converted from TFLite ({source})",
    )
    # Transposes whose NCHW consumer read the NCHW form directly, and the like, are dead now.
    RemoveUnusedNodesPass()(result)
    return result


def _has_16bit_activations(sg: TFLiteSubgraph) -> bool:
    return any(t.quant is not None and t.type == 7 and t.data is None for t in sg.tensors)


def _why_unsupported(op: TFLiteOperator) -> str:
    if op.opcode in CONTROL_FLOW:
        return (
            "control flow (it runs other subgraphs); ferry converts subgraph 0 without "
            "control flow only"
        )
    if op.opcode == "CUSTOM":
        if (op.custom_code or "").startswith("Flex"):
            return (
                "a TensorFlow op run by the Flex delegate (Select TF ops); re-export the model "
                "with TFLite builtin ops only"
            )
        return "a custom op; ferry has no translation for it"
    if op.opcode.startswith("BUILTIN_"):
        return "a builtin op newer than the TFLite schema ferry reads"
    return "no ONNX translation for this op yet"


def _op_list(
    sg: TFLiteSubgraph, problems: list[tuple[TFLiteOperator, str]]
) -> list[tuple[str, str]]:
    return [(op.display_name, _op_label(sg, op)) for op, _ in problems]


def _op_label(sg: TFLiteSubgraph, op: TFLiteOperator) -> str:
    outputs = [sg.tensors[i].name for i in op.outputs if i >= 0]
    return f"#{op.index} -> {outputs[0]}" if outputs else f"#{op.index}"


def _message(source: str, sg: TFLiteSubgraph, problems: list[tuple[TFLiteOperator, str]]) -> str:
    reasons: dict[str, set[str]] = {}
    for op, why in problems:
        reasons.setdefault(op.display_name, set()).add(why)
    total = len(problems)
    return (
        f"{source}: {total} TFLite op{'s' if total != 1 else ''} cannot be converted to ONNX: "
        + list_ops(
            _op_list(sg, problems),
            reasons={name: "; ".join(sorted(whys)) for name, whys in reasons.items()},
        )
    )
