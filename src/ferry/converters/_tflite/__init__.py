"""The TFLite converter (``converter``) and its LiteRT reference (``reference``).

Reading the flatbuffer and translating it to ONNX are :mod:`ferry.tflite`'s job (no engine
inside); here the translation is driven and verified: ``converter`` is the registered converter,
``reference`` runs the source file in LiteRT for the parity check.
"""

from __future__ import annotations

from ferry.converters._tflite.converter import TFLiteConverter

__all__ = ["TFLiteConverter"]
