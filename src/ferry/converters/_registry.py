"""Which converter reads a source: by ``--from`` name, Python object type, file suffix or magic bytes.

Converter modules are imported on first use, so a missing framework only matters to its own format.
"""

from __future__ import annotations

import importlib
import logging
import os
from pathlib import Path

from ferry.converters._base import Converter
from ferry.errors import ConversionError, ModelLoadError

__all__ = ["converter_names", "get_converter", "resolve_converter"]

# In detection order: the cheap, unambiguous formats first.
_CONVERTERS = {
    "onnx": "ferry.converters._onnx:OnnxConverter",
    "tflite": "ferry.converters._tflite:TFLiteConverter",
    "pytorch": "ferry.converters._pytorch:PyTorchConverter",
    "tensorflow": "ferry.converters._tensorflow:TensorFlowConverter",
    "paddle": "ferry.converters._paddle:PaddleConverter",
    "sklearn": "ferry.converters._sklearn:SklearnConverter",
}
_ALIASES = {
    "torch": "pytorch",
    "tf": "tensorflow",
    "keras": "tensorflow",
    "scikit-learn": "sklearn",
    "litert": "tflite",
}
_cache: dict[str, Converter] = {}
logger = logging.getLogger(__name__)


def converter_names() -> list[str]:
    """The names ``--from`` accepts."""
    return list(_CONVERTERS)


def get_converter(name: str) -> Converter:
    """The converter called ``name`` (or an alias such as ``torch``, ``keras``)."""
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in _CONVERTERS:
        raise ConversionError(
            f"unknown source format {name!r}; --from takes one of: {', '.join(_CONVERTERS)}"
        )
    if key not in _cache:
        module_name, _, attr = _CONVERTERS[key].partition(":")
        # A converter module must import without its framework; if it does not, say so.
        try:
            _cache[key] = getattr(importlib.import_module(module_name), attr)()
        except (ImportError, AttributeError) as e:
            raise ConversionError(f"the {key} converter failed to load: {e}") from e
    return _cache[key]


def _available() -> list[Converter]:
    """Every converter whose module imports; a broken one must not hide the others."""
    found = []
    for name in _CONVERTERS:
        try:
            found.append(get_converter(name))
        except ConversionError as e:
            logger.warning("%s", e)
    return found


def resolve_converter(source: object, from_: str | None = None) -> tuple[Converter, object]:
    """Pick the converter for ``source``; returns it with the source (paths made ``Path``)."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.exists():
            raise ModelLoadError(f"model not found: {path}")
        if from_ is not None:
            return get_converter(from_), path
        return _by_path(path), path
    if from_ is not None:
        return get_converter(from_), source
    for converter in _available():
        if converter.accepts(source):
            return converter, source
    raise ConversionError(
        f"ferry cannot convert a {type(source).__module__}.{type(source).__qualname__}; it takes "
        "ONNX, PyTorch, TensorFlow/Keras, TFLite, PaddlePaddle and scikit-learn models "
        "(or a path to one)"
    )


def _by_path(path: Path) -> Converter:
    suffix = path.suffix.lower()
    converters = _available()
    by_suffix = [c for c in converters if suffix in c.suffixes]
    # A suffix can be shared (.json, .pt): the content decides among those that claim it.
    for converter in by_suffix:
        if converter.sniff(path):
            return converter
    for converter in converters:
        if converter not in by_suffix and converter.sniff(path):
            return converter
    if by_suffix:
        return by_suffix[0]
    what = "folder" if path.is_dir() else f"file (suffix {suffix or 'none'!s})"
    raise ConversionError(
        f"cannot tell which framework {path} comes from ({what}); "
        f"pass --from one of: {', '.join(_CONVERTERS)}"
    )
