"""File codecs with no engine inside: GGUF (through the ``gguf`` package, memory-mapped) and Hugging
Face safetensors checkpoints (our own header parser over a numpy memmap).

TFLite's schema, reader and writer moved to :mod:`ferry.tflite`, beside its two translations.
"""

from __future__ import annotations

from ferry.formats._gguf import GGUFFile, GGUFTensor, QuantBlocks, read_gguf
from ferry.formats._safetensors import LazyTensor, read_safetensors

__all__ = ["GGUFFile", "GGUFTensor", "LazyTensor", "QuantBlocks", "read_gguf", "read_safetensors"]
