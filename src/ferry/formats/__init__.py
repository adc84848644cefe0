"""File codecs with no engine inside: the TFLite flatbuffer schema, reader and writer.

:func:`read_tflite` turns a ``.tflite`` file into plain data (:class:`TFLiteModel` and the
dataclasses it holds) and :func:`write_tflite` turns such data back into a ``.tflite`` file,
both through the pure-Python ``tflite`` schema package (``pip install 'ferry[tflite]'``),
imported on first use; :func:`tflite_schema` gives that package's generated code, indexed, to
whatever reads or writes the format.
"""

from __future__ import annotations

from ferry.formats._tflite_reader import densify_tflite, read_tflite
from ferry.formats._tflite_schema import (
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
from ferry.formats._tflite_versions import tflite_op_version
from ferry.formats._tflite_writer import write_tflite

__all__ = [
    "TFLITE_DTYPES",
    "TFLITE_IDENTIFIER",
    "TFLITE_INT4",
    "TFLITE_TYPE_NAMES",
    "TFLiteDimMetadata",
    "TFLiteModel",
    "TFLiteOperator",
    "TFLiteQuant",
    "TFLiteSchema",
    "TFLiteSignature",
    "TFLiteSparsity",
    "TFLiteSubgraph",
    "TFLiteTensor",
    "densify_tflite",
    "is_tflite",
    "read_tflite",
    "tflite_op_version",
    "tflite_schema",
    "write_tflite",
]
