"""Quantization for a target engine, judged at the task on held-back data and timed there.

``quantize(model, data=..., target=...)`` calibrates (ONNX Runtime's calibrators and QDQ
insertion), follows the target's rules (``_targets``: signedness, symmetry, per-channel axes,
what must stay float; ``_check`` validates them), keeps the most sensitive nodes float until the result is within budget,
and refuses a result that is over budget or slower, with the figures. ``check(model, target)``
lists where a quantized model breaks a target's rules. A source already quantized (QDQ, dynamic
int8, int8 weights: ``ferry.graph.reduced_precision``) is refused unless ``requantize=True``, which
quantizes ``dequantized(model)``: its float graph recovered.
"""

from __future__ import annotations

from ferry.optimizer.quantize._check import (
    Breach,
    check,
    check_summary,
    quantize_residual_inputs,
)
from ferry.optimizer.quantize._data import ImagePreprocessing, Samples, load_samples, split
from ferry.optimizer.quantize._dequantize import dequantized
from ferry.optimizer.quantize._quantize import (
    METHODS,
    METRICS,
    QuantizeReport,
    QuantizeResult,
    quantize,
)
from ferry.optimizer.quantize._targets import (
    TARGETS,
    Scheme,
    drop_graph_output_qdq,
    ort_arguments,
    scheme,
)

__all__ = [
    "METHODS",
    "METRICS",
    "TARGETS",
    "Breach",
    "ImagePreprocessing",
    "QuantizeReport",
    "QuantizeResult",
    "Samples",
    "Scheme",
    "check",
    "check_summary",
    "dequantized",
    "drop_graph_output_qdq",
    "load_samples",
    "ort_arguments",
    "quantize",
    "quantize_residual_inputs",
    "scheme",
    "split",
]
