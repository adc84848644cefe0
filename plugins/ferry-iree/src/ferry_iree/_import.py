"""ONNX -> MLIR: a partition handed to IREE's ONNX importer, in process.

Before -> After::

    ir.Model (a partition, or a file holding it)
        -> onnx.ModelProto (graph renamed ENTRY, opset raised to MIN_OPSET, shapes inferred)
        -> MLIR text in the torch dialect (``func.func @main(...)``)

IREE names the module's entry function after the ONNX graph, so the graph gets a fixed name
(:data:`ENTRY`) first: a graph called ``torch-jit-export`` would not be a callable symbol.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import onnx
import onnx_ir as ir

from ferry.errors import ModelLoadError, UnsupportedOpError

__all__ = ["ENTRY", "MIN_OPSET", "import_onnx", "to_proto"]

#: The name of the compiled module's entry function (the ONNX graph is renamed to it).
ENTRY = "main"
#: The opset models are raised to before import (what ``iree-import-onnx --opset-version 17``
#: does): IREE's ONNX conversions are written against opset 17 and later.
MIN_OPSET = 17

#: Protobuf's limit: above it shapes are inferred through a file (as iree-import-onnx does).
_PROTO_LIMIT = 2**31 - 1


def to_proto(model: ir.Model, source_path: Path | None = None) -> onnx.ModelProto:
    """``model`` as an ONNX proto ready for IREE: graph named :data:`ENTRY`, its opset at least
    :data:`MIN_OPSET`, every value's type inferred (IREE's importer types each value from
    ``value_info``).

    Raises:
        ModelLoadError: the model could not be read back or its shapes inferred.
    """
    try:
        if source_path is not None:
            proto = onnx.load(str(source_path))
        else:
            if any(
                isinstance(v.const_value, ir.ExternalTensor)
                for v in model.graph.initializers.values()
            ):
                # Weights in external files relative to a folder IREE is not told: read them in.
                model = ir.external_data.load_to_model(model.clone())
            proto = ir.to_proto(model)
    except Exception as e:  # protobuf's and onnx's own errors: the model is unreadable
        raise ModelLoadError(f"iree: could not read the partition as ONNX: {e}") from e
    proto.graph.name = ENTRY
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if 0 < opset < MIN_OPSET:
        # Where the converter lacks an adapter for some op, the model is imported as it is.
        with contextlib.suppress(Exception):
            proto = onnx.version_converter.convert_version(proto, MIN_OPSET)
    if proto.ByteSize() < _PROTO_LIMIT:
        try:
            proto = onnx.shape_inference.infer_shapes(proto, data_prop=True)
        except Exception as e:  # onnx's inference errors name the node that does not fit
            raise ModelLoadError(f"iree: ONNX shape inference failed on the partition: {e}") from e
    return proto


def import_onnx(proto: onnx.ModelProto) -> str:
    """The MLIR text of ``proto`` (torch dialect), from IREE's ONNX importer.

    Raises:
        UnsupportedOpError: the importer cannot express a node (its message names it).
    """
    from iree.compiler.extras import onnx_importer
    from iree.compiler.ir import Context

    try:
        info = onnx_importer.ModelInfo(proto)
        module = info.create_module(context=Context()).operation
        onnx_importer.NodeImporter.define_function(info.main_graph, module).import_all()
        module.verify()
    except Exception as e:  # the importer's own errors (OnnxImportError, MLIRError)
        raise UnsupportedOpError(f"iree: IREE's ONNX importer refused the model: {e}") from e
    return str(module.get_asm(assume_verified=True))
