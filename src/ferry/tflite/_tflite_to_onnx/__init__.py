"""TFLite -> ONNX (private): a read ``.tflite`` model becomes an ``onnx_ir.Model``.

``_builder`` holds the ONNX graph being written (values, constants, QDQ, layout transposes);
``_ops`` has one translator per TFLite builtin op; ``_translate`` drives them over subgraph 0 and
collects every op it cannot translate before failing; ``_state`` finds the resource variables of
a stateful (streaming) model, which become explicit state inputs and outputs. Verifying the
result against LiteRT is the converter's job (``ferry.converters``), above the runtime.
"""

from __future__ import annotations

from ferry.tflite._tflite_to_onnx._state import (
    STATE_INPUT_PREFIX,
    STATE_OPS,
    STATE_OUTPUT_PREFIX,
    State,
    Variable,
    find_state,
)
from ferry.tflite._tflite_to_onnx._translate import DEFAULT_OPSET, input_dims, translate

__all__ = [
    "DEFAULT_OPSET",
    "STATE_INPUT_PREFIX",
    "STATE_OPS",
    "STATE_OUTPUT_PREFIX",
    "State",
    "Variable",
    "find_state",
    "input_dims",
    "translate",
]
