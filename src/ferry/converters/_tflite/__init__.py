"""The TFLite converter (``converter``) and its internals.

Reading the flatbuffer is ``ferry.formats``' job (no engine inside); here the read model becomes
ONNX: ``builder`` holds the ONNX graph being written (values, constants, QDQ, layout transposes);
``ops`` has one translator per TFLite builtin op; ``translate`` drives them over subgraph 0 and
collects every op it cannot translate before failing; ``state`` finds the resource variables of a
stateful (streaming) model, which become explicit state inputs and outputs; ``reference`` runs
the source file in LiteRT for the parity check.
"""

from __future__ import annotations

from ferry.converters._tflite.converter import TFLiteConverter

__all__ = ["TFLiteConverter"]
