"""Generative decoders: a GGUF file or a Hugging Face checkpoint built into one ONNX decoder graph
(ids, positions and past key/values in; logits and present key/values out), its tokenizer and
chat template beside it in an artifact folder, and the token loop that runs it.
"""

from __future__ import annotations

from ferry.generate._config import SUPPORTED_ARCHITECTURES, DecoderConfig
from ferry.generate._convert import DECODER_PRECISIONS, convert_decoder
from ferry.generate._describe import describe_decoder
from ferry.generate._weights import DecoderWeights, Weight

__all__ = [
    "DECODER_PRECISIONS",
    "SUPPORTED_ARCHITECTURES",
    "DecoderConfig",
    "DecoderWeights",
    "Weight",
    "convert_decoder",
    "describe_decoder",
]
