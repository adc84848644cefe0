"""A deterministic zoo of small test models, exported from PyTorch to ONNX.

The zoo gives tests, examples and benchmarks a handful of realistic models without downloads:

* ``digits_cnn``: a small CNN trained on scikit-learn's digits (>= 95% test accuracy).
* ``mlp``: a 64-128-64-10 MLP trained on flattened digits.
* ``mobilenet_v2``: a small MobileNetV2-style net (depthwise convs, ReLU6, Hardswish).
* ``transformer_block``: one transformer encoder block (MatMul/Softmax attention, LayerNorm, GELU).
* :func:`streaming_model`: a keyword spotter and a voice-activity net with recurrent state
  (``state:*`` inputs, ``state_out:*`` outputs) for sequence batching.

Example:
    >>> from ferry import zoo
    >>> model = zoo.build("digits_cnn")          # onnx_ir.Model, dynamic batch
    >>> feeds = zoo.example_inputs("digits_cnn", batch=4)

Importing this package is cheap: torch and scikit-learn are imported only when a model is built
or the digits data is loaded. Building needs the ``zoo`` extra (torch and scikit-learn).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

from ferry.zoo._build import DEFAULT_OPSET, build, example_inputs, names, save
from ferry.zoo._data import RunFn, digits_accuracy, digits_data
from ferry.zoo._specs import ModelSpec, get_spec
from ferry.zoo._streaming import STREAMING_MODELS, streaming_inputs, streaming_model


def torch_module(name: str) -> torch.nn.Module:
    """The zoo model as a fresh eval-mode ``torch.nn.Module`` (trained where the zoo trains it)."""
    from ferry.zoo._models import torch_module as _torch_module

    return _torch_module(name)


__all__ = [
    "DEFAULT_OPSET",
    "STREAMING_MODELS",
    "ModelSpec",
    "RunFn",
    "build",
    "digits_accuracy",
    "digits_data",
    "example_inputs",
    "get_spec",
    "names",
    "save",
    "streaming_inputs",
    "streaming_model",
    "torch_module",
]
