"""File codecs with no engine inside (GGUF and Paddle program reading will live here).

TFLite's schema, reader and writer moved to :mod:`ferry.tflite`, beside its two translations.
"""

from __future__ import annotations

__all__: list[str] = []
