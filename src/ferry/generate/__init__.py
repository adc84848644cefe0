"""Generative decoders: a GGUF file or a Hugging Face checkpoint built into one ONNX decoder graph
(ids, positions and past key/values in; logits and present key/values out), its tokenizer and
chat template beside it in an artifact folder, and the token loop that runs it.

``convert_decoder(source, out_dir)`` writes the artifact; ``ferry.load(out_dir)`` gives a
:class:`DecoderSession` whose ``generate`` runs the token loop. Names are imported on first use:
loading a plain model never imports the tokenizer or the graph builder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ferry._lazy import lazy_getattr

if TYPE_CHECKING:
    from ferry.generate._artifact import (
        DecoderFiles,
        load_decoder_files,
        write_decoder_artifact,
    )
    from ferry.generate._auto import DecoderChoice, auto_decoder
    from ferry.generate._batch import (
        BatchEngine,
        EngineObserver,
        GenerationRequest,
        GenerationStream,
    )
    from ferry.generate._config import SUPPORTED_ARCHITECTURES, DecoderConfig
    from ferry.generate._convert import DECODER_PRECISIONS, convert_decoder
    from ferry.generate._describe import describe_decoder
    from ferry.generate._graph import build_decoder
    from ferry.generate._loop import (
        DecoderSession,
        Generation,
        TokenEvent,
        is_generative_artifact,
    )
    from ferry.generate._perplexity import PerplexityResult, perplexity, teacher_forced_logits
    from ferry.generate._sampling import SamplingOptions
    from ferry.generate._template import ChatTemplate
    from ferry.generate._tokenizer import build_tokenizer
    from ferry.generate._weights import DecoderWeights, Weight

__all__ = [
    "DECODER_PRECISIONS",
    "SUPPORTED_ARCHITECTURES",
    "BatchEngine",
    "ChatTemplate",
    "DecoderChoice",
    "DecoderConfig",
    "DecoderFiles",
    "DecoderSession",
    "DecoderWeights",
    "EngineObserver",
    "Generation",
    "GenerationRequest",
    "GenerationStream",
    "PerplexityResult",
    "SamplingOptions",
    "TokenEvent",
    "Weight",
    "auto_decoder",
    "build_decoder",
    "build_tokenizer",
    "convert_decoder",
    "describe_decoder",
    "is_generative_artifact",
    "load_decoder_files",
    "perplexity",
    "teacher_forced_logits",
    "write_decoder_artifact",
]

__getattr__ = lazy_getattr(
    __name__,
    __all__,
    [
        "_config",
        "_weights",
        "_convert",
        "_describe",
        "_graph",
        "_loop",
        "_sampling",
        "_template",
        "_tokenizer",
        "_artifact",
        "_auto",
        "_perplexity",
        "_batch",
    ],
)
