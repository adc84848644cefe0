"""ONNX -> ONNX: move to another opset, infer shapes, and check the result.

Before -> After::

    model (any opset, shapes partly declared) -> model (target opset, inferred value shapes, checked)
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx_ir.passes.common import CheckerPass, ShapeInferencePass
from onnxscript.version_converter import ConvertVersionPass

from ferry.converters._base import Converted, ConvertOptions, as_array, first_line, name_examples
from ferry.errors import ConversionError

__all__ = ["MIN_OPSET", "OnnxConverter", "check_model", "convert_onnx", "max_opset"]

logger = logging.getLogger(__name__)

#: The oldest default-domain opset ferry converts to; older ones lack ops every exporter emits.
MIN_OPSET = 7

# onnx_ir's CheckerPass leaves out initializers above 1 KB; below that it serializes them.
_INLINE_FOR_CHECK = 1 << 16


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
                f"cannot convert from opset {current} to {opset}: {first_line(e)}; try a nearer opset"
            ) from e
        finally:
            converter_log.setLevel(level)
        reached = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
        if reached != opset:
            raise ConversionError(
                f"cannot convert from opset {current} to {opset}: {_why_not(model, opset)}; "
                "try another opset (ONNX has no down-conversion for many ops)"
            )
    ShapeInferencePass(strict_mode=False)(model)
    check_model(model)
    return model


def check_model(model: ir.Model) -> None:
    """Run ONNX's checker (with strict shape inference); raise ConversionError with its finding.

    onnx_ir's CheckerPass hands the checker the graph without large weights, so external data
    and models past protobuf's 2 GiB limit are checked too.
    """
    swapped: dict[ir.Value, ir.TensorProtocol] = {}
    for value in model.graph.initializers.values():
        tensor = value.const_value
        # The checker resolves external data against the working directory, not the model's;
        # small external weights (the large ones are left out by CheckerPass) are read in here.
        if isinstance(tensor, ir.ExternalTensor) and tensor.nbytes <= _INLINE_FOR_CHECK:
            swapped[value] = tensor
            value.const_value = ir.Tensor(tensor.numpy(), name=value.name)
    try:
        CheckerPass(full_check=True)(model)
    except Exception as e:  # ValidationError, InferenceError, or either wrapped in PassError
        cause = e.__cause__ or e
        raise ConversionError(f"the model fails ONNX's checker: {first_line(cause)}") from e
    finally:
        for value, tensor in swapped.items():
            value.const_value = tensor


def _why_not(model: ir.Model, opset: int) -> str:
    """Ask onnx's converter directly for the reason the pass above swallowed (error path only)."""
    try:
        onnx.version_converter.convert_version(ir.to_proto(model), opset)
    except Exception as e:  # its C++ asserts arrive as RuntimeError with a source path prefix
        reason = first_line(e)
        return reason.split(": ")[-1].replace("$", "") if ": " in reason else reason
    return "the version converter has no adapter for some op in this model"


class OnnxConverter:
    """ONNX sources: ``.onnx`` files, artifact folders, ``onnx.ModelProto``, ``onnx_ir.Model``.

    The reference is the original model on ONNX Runtime, so an opset conversion is verified
    against the model as it was; example inputs, when given, are the inputs it is verified on.
    """

    name = "onnx"
    extra = ""
    suffixes = (".onnx",)

    def sniff(self, path: Path) -> bool:
        if path.is_dir():
            return (path / "model.onnx").is_file()
        return path.suffix.lower() == ".onnx"

    def accepts(self, obj: object) -> bool:
        return isinstance(obj, (ir.Model, onnx.ModelProto))

    def convert(self, source: Path | object, options: ConvertOptions) -> Converted:
        from ferry.graph import load_model

        if not isinstance(source, (Path, ir.Model, onnx.ModelProto)):
            raise ConversionError(f"the onnx converter cannot read a {type(source).__name__}")
        original = load_model(source)
        session: list[Any] = []

        def reference(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            from ferry.runtime import load

            if not session:
                session.append(load(source))
            return session[0].run(feeds)

        # The caller's in-memory model must come out of the conversion unchanged; a file or a
        # proto was just deserialized into a model of our own.
        model = original.clone() if original is source else original
        samples = None
        if options.example_inputs is not None:
            names = [v.name or "" for v in model.graph.inputs]
            named = name_examples(options.example_inputs, names)
            samples = {name: as_array(value, name) for name, value in named.items()}
        return Converted(model=model, reference=reference, sample_inputs=samples)
