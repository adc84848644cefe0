"""ONNX -> ONNX: move to another opset, infer shapes, and check the result.

Before -> After::

    model (any opset, shapes partly declared) -> model (target opset, inferred value shapes, checked)
"""

from __future__ import annotations

import logging

import onnx
import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass
from onnxscript.version_converter import ConvertVersionPass

from ferry.errors import ConversionError

__all__ = ["MIN_OPSET", "check_model", "convert_onnx", "max_opset"]

logger = logging.getLogger(__name__)

#: The oldest default-domain opset ferry converts to; older ones lack ops every exporter emits.
MIN_OPSET = 7


def max_opset() -> int:
    """The newest default-domain opset the installed onnx package knows."""
    return int(onnx.defs.onnx_opset_version())


def convert_onnx(model: ir.Model, *, opset: int | None = None) -> ir.Model:
    """Convert ``model`` in place to ``opset`` (if given), infer shapes and check it.

    Args:
        model: the model; callers pass a copy they own, it is changed in place.
        opset: the default-domain opset to convert to; None keeps the model's own.

    Returns:
        ``model``, converted and checked.

    Raises:
        ConversionError: the opset is out of range, an op cannot be converted, or the result fails
            ONNX's checker.
    """
    current = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
    if opset is not None and opset != current:
        newest = max_opset()
        if not MIN_OPSET <= opset <= newest:
            raise ConversionError(
                f"opset {opset} is out of range: ferry converts to opsets {MIN_OPSET}..{newest}"
            )
        # onnxscript warns each time it hands an op to onnx's C++ converter; that is routine here.
        converter_log = logging.getLogger("onnxscript.version_converter")
        level = converter_log.level
        converter_log.setLevel(logging.ERROR)
        try:
            ConvertVersionPass(target_version=opset, fallback=True)(model)
        except Exception as e:  # the converters raise their own types; all mean "cannot convert"
            raise ConversionError(
                f"cannot convert from opset {current} to {opset}: {_short(e)}; try a nearer opset"
            ) from e
        finally:
            converter_log.setLevel(level)
        reached = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
        if reached != opset:
            raise ConversionError(
                f"cannot convert from opset {current} to {opset}: the version converter has no "
                "adapter for some op in this model; try a nearer opset"
            )
    ShapeInferencePass(strict_mode=False)(model)
    check_model(model)
    return model


def check_model(model: ir.Model) -> None:
    """Run ONNX's checker (with strict shape inference); raise ConversionError with its finding."""
    proto = ir.to_proto(model)
    try:
        if proto.ByteSize() < onnx.checker.MAXIMUM_PROTOBUF:
            onnx.checker.check_model(proto, full_check=True)
        else:
            # The checker reads >2 GiB models only from files; the graph structure is what matters.
            onnx.checker.check_graph(proto.graph)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise ConversionError(f"the model fails ONNX's checker: {_short(e)}") from e


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
