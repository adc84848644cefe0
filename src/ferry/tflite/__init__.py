"""Everything TFLite, with no engine inside: the flatbuffer codec and the two translations.

- The codec: :func:`read_tflite` turns a ``.tflite`` file into plain data (:class:`TFLiteModel`
  and the dataclasses it holds) and :func:`write_tflite` turns such data back into a ``.tflite``
  file, both through the pure-Python ``tflite`` schema package (``pip install 'ferry[tflite]'``),
  imported on first use; :func:`tflite_schema` gives that package's generated code, indexed.
- ONNX -> TFLite (``_onnx_to_tflite``): :func:`lower_prepared` lowers a prepared model (static
  shapes) to a :class:`TFLiteModel`, NHWC inside and ONNX's layout at the edges;
  :data:`TRANSLATORS` maps each ONNX op type it lowers to its translator.
- TFLite -> ONNX (``_tflite_to_onnx``): :func:`translate` turns a read model's main subgraph into
  an ``onnx_ir.Model``; :func:`find_state` finds a streaming model's resource variables, which
  become explicit state inputs and outputs.

A translator in either direction raises :class:`Unsupported` for what it cannot handle; the
drivers collect them into one :class:`~ferry.errors.UnsupportedOpError`. What runs a model stays
above the runtime: the TFLite converter (``ferry.converters``) verifies against LiteRT,
``ferry.mobile`` exports and verifies ``.tflite`` files, the ``litert`` backend runs partitions.

Names are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ferry._lazy import lazy_getattr

if TYPE_CHECKING:
    from ferry.tflite._onnx_to_tflite import (
        PRECISIONS,
        TRANSLATORS,
        IOInfo,
        Lowered,
        Perm,
        check_precision,
        infer_shapes,
        inverse,
        is_qdq,
        lower_prepared,
        node_problems,
        prepare_static,
        static_inputs,
    )
    from ferry.tflite._reader import densify_tflite, read_tflite
    from ferry.tflite._schema import (
        TFLITE_DTYPES,
        TFLITE_IDENTIFIER,
        TFLITE_INT4,
        TFLITE_TYPE_NAMES,
        TFLiteDimMetadata,
        TFLiteModel,
        TFLiteOperator,
        TFLiteQuant,
        TFLiteSchema,
        TFLiteSignature,
        TFLiteSparsity,
        TFLiteSubgraph,
        TFLiteTensor,
        is_tflite,
        tflite_schema,
    )
    from ferry.tflite._tflite_to_onnx import (
        STATE_INPUT_PREFIX,
        STATE_OPS,
        STATE_OUTPUT_PREFIX,
        State,
        find_state,
        translate,
    )
    from ferry.tflite._unsupported import Unsupported
    from ferry.tflite._versions import tflite_op_version
    from ferry.tflite._writer import write_tflite

__all__ = [
    "PRECISIONS",
    "STATE_INPUT_PREFIX",
    "STATE_OPS",
    "STATE_OUTPUT_PREFIX",
    "TFLITE_DTYPES",
    "TFLITE_IDENTIFIER",
    "TFLITE_INT4",
    "TFLITE_TYPE_NAMES",
    "TRANSLATORS",
    "IOInfo",
    "Lowered",
    "Perm",
    "State",
    "TFLiteDimMetadata",
    "TFLiteModel",
    "TFLiteOperator",
    "TFLiteQuant",
    "TFLiteSchema",
    "TFLiteSignature",
    "TFLiteSparsity",
    "TFLiteSubgraph",
    "TFLiteTensor",
    "Unsupported",
    "check_precision",
    "densify_tflite",
    "find_state",
    "infer_shapes",
    "inverse",
    "is_qdq",
    "is_tflite",
    "lower_prepared",
    "node_problems",
    "prepare_static",
    "read_tflite",
    "static_inputs",
    "tflite_op_version",
    "tflite_schema",
    "translate",
    "write_tflite",
]

__getattr__ = lazy_getattr(
    __name__,
    __all__,
    [
        "_schema",
        "_reader",
        "_writer",
        "_versions",
        "_unsupported",
        "_onnx_to_tflite",
        "_tflite_to_onnx",
    ],
)
