"""ONNX -> TFLite lowering for export: the model prepared with the optimizer, then lowered.

Before -> After::

    model.onnx (NCHW, symbolic batch, BatchNorms, shape arithmetic)
        -> prepared copy (names, types; batch fixed; BatchNorm folded; shapes static)
        -> one TFLite subgraph of builtin ops, NHWC inside, ONNX's layout at the edges

The model is prepared the way every ferry verb prepares one (:func:`ferry.graph.prepare`, then
the optimizer's basic pipeline at fixed input sizes), then lowered by the core in
:mod:`ferry.tflite` (its ``_onnx_to_tflite`` package).

Inputs with a default (initializers the model also lists as inputs, IR >= 4: a streaming
model's state, ``state:<variable>``) are inputs of the ``.tflite`` file too: TFLite has no
optional inputs, and freezing the default would drop what the caller may give (the state of the
previous call). The app feeds the default on the first call (:func:`optional_inputs`). A model
that lists *every* initializer as an input (IR 3 required it; legacy exporters and PyTorch's
``keep_initializers_as_inputs`` still do it at IR 4) lists its weights, not a state: they are
constants of the file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from ferry.errors import UnsupportedOpError
from ferry.graph import load_model, prepare, reduced_precision
from ferry.tflite import (
    PRECISIONS,
    TRANSLATORS,
    IOInfo,
    Lowered,
    TFLiteModel,
    check_precision,
    infer_shapes,
    is_qdq,
    lower_prepared,
    prepare_static,
    static_inputs,
)

__all__ = [
    "PRECISIONS",
    "TRANSLATORS",
    "IOInfo",
    "Lowered",
    "ModelSource",
    "is_dynamic_int8",
    "lower_model",
    "optional_inputs",
    "source_precision",
    "to_tflite_model",
]

ModelSource = str | os.PathLike[str] | ir.Model | onnx.ModelProto

_ORT_MOBILE_HINT = (
    "The model cannot be exported to .tflite as it is; ONNX Runtime Mobile runs every "
    "ONNX op: ferry export MODEL --target ort-mobile -o DIR"
)


def to_tflite_model(
    model: ModelSource,
    *,
    shapes: Mapping[str, Sequence[int]] | None = None,
    precision: str | None = None,
    nhwc_io: bool = False,
) -> TFLiteModel:
    """Lower an ONNX model to TFLite (plain data; :func:`ferry.tflite.write_tflite` writes it).

    See :func:`lower_model`; this returns its model only.
    """
    return lower_model(model, shapes=shapes, precision=precision, nhwc_io=nhwc_io).model


def lower_model(
    model: ModelSource,
    *,
    shapes: Mapping[str, Sequence[int]] | None = None,
    precision: str | None = None,
    nhwc_io: bool = False,
) -> Lowered:
    """Lower an ONNX model to TFLite.

    Args:
        model: a path, an ``onnx_ir.Model`` or an ``onnx.ModelProto``; never modified.
        shapes: input sizes to export at (``{"x": (1, 3, 224, 224)}``); inputs not named keep
            their static sizes, a symbolic first dim (the batch) becomes 1.
        precision: ``fp32``; ``fp16`` (weights stored as float16, dequantized at load);
            ``int8`` (a QDQ model, made by ``ferry quantize --target tflite`` or any other
            static quantizer: integer kernels); None: the source's own
            (:func:`source_precision`).
        nhwc_io: the 4-D inputs and outputs the model has in NCHW are NHWC in the file
            (channels last, as cameras give images): the transposes at the edges disappear.
            Those already channels-last (a TensorFlow model's) stay as they are.

    Raises:
        InvalidInputError: an unknown precision, a size that does not fit an input, an input
            with a dynamic dim other than the batch (pass its size in ``shapes``), a float model
            for ``int8``.
        UnsupportedOpError: nodes TFLite cannot run, every one named with the reason.
    """
    source = load_model(model)
    precision = precision or source_precision(source)
    check_precision(source, precision)
    undone = None
    if is_dynamic_int8(source):
        source, undone = _float_computation(source)
    fixed, batch = static_inputs(source, shapes or {})
    work = _prepared(source, fixed, precision)
    try:
        lowered = lower_prepared(
            work, precision=precision, nhwc_io=nhwc_io, fixed=fixed, batch=batch
        )
    except UnsupportedOpError as e:
        if not e.ops:
            raise
        raise UnsupportedOpError(f"{e}\n{_ORT_MOBILE_HINT}", e.ops) from e
    if undone is not None:
        lowered.notes.append(undone)
    defaults = optional_inputs(source)
    if defaults:
        lowered.notes.append(
            f"inputs with a default in the ONNX model, required by the .tflite file (feed the "
            f"default on the first call, then what the last call returned): {', '.join(defaults)}"
        )
    return lowered


def is_dynamic_int8(model: ir.Model) -> bool:
    """Whether the model is quantized dynamically (DynamicQuantizeLinear, ConvInteger,
    MatMulInteger) and not statically: TFLite's integer kernels take static parameters only, so
    it is exported as the float computation it stands for."""
    kinds = reduced_precision(model).kinds
    return "dynamic int8" in kinds and "static QDQ" not in kinds


def _float_computation(model: ir.Model) -> tuple[ir.Model, str]:
    """A dynamic int8 model's float graph (``ferry.optimizer.quantize.dequantized``: its
    weights as stored, dequantized) and the report's line about it.

    Raises:
        InvalidInputError: quantization that cannot be undone (QOperator ops and the like).
    """
    from ferry.optimizer.quantize import dequantized

    work, _ = dequantized(model)
    return work, (
        "dynamic int8 model: exported as the float computation it stands for (its int8 "
        "weights dequantized as stored; activations no longer rounded at run time), checked "
        "against the int8 model within the int8 budget"
    )


def source_precision(model: ir.Model) -> str:
    """The precision a model is exported at when none is asked: ``int8`` for a QDQ model (its
    activations quantized, whoever quantized it: TFLite's integer kernels run it as it is),
    else ``fp32``."""
    return "int8" if is_qdq(model) else "fp32"


def optional_inputs(model: ir.Model) -> dict[str, np.ndarray]:
    """The inputs the caller may leave out, with their defaults: initializers that the model
    also lists as inputs, from IR 4 on (before, every initializer was listed and is a constant).

    A model listing every one of its initializers as an input lists its weights (an exporter's
    legacy layout), not a state the caller carries from call to call: none is optional then.
    """
    if model.ir_version < 4 or _weights_listed_as_inputs(model):
        return {}
    found = {}
    for value in model.graph.inputs:
        init = model.graph.initializers.get(value.name or "")
        if init is not None and init.const_value is not None:
            found[value.name or ""] = init.const_value.numpy()
    return found


def _weights_listed_as_inputs(model: ir.Model) -> bool:
    """Whether the model lists every initializer (more than one) among its inputs."""
    inits = model.graph.initializers
    listed = sum((v.name or "") in inits for v in model.graph.inputs)
    return len(inits) > 1 and listed == len(inits)


def _prepared(model: ir.Model, fixed: Mapping[str, tuple[int, ...]], precision: str) -> ir.Model:
    """The named, typed, optimized copy at static sizes; every value's shape inferred."""
    from ferry.optimizer import FixInputShapesPass, pipeline, rule_context

    work = prepare(model)
    # Inputs with a default are inputs of the file: drop the default, keep the input.
    optional = optional_inputs(work)
    for name in optional:
        work.graph.initializers.pop(name).const_value = None
    # Weights also listed as inputs (IR 3, legacy exporters) are constants: no longer inputs.
    for value in list(work.graph.inputs):
        if (value.name or "") in work.graph.initializers and value.name not in optional:
            work.graph.inputs.remove(value)
    if fixed:
        FixInputShapesPass(fixed)(work)
    if precision == "int8":
        # The QDQ model keeps its structure (the optimizer would merge weights into float
        # constants): only shape arithmetic is folded, so that every size is known.
        return prepare_static(work, {})
    pipeline(rule_context(work, "basic", None, fix_shapes=True))(work)
    infer_shapes(work)
    work.graph.sort()
    return work
