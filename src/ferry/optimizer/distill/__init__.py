"""Distillation: recover a compressed student's accuracy from the original model, unlabeled.

``distill(teacher, student, data=...)`` runs the teacher in ONNX Runtime, turns the student into a
trainable torch module (ferry's own ONNX -> torch for the CNN op subset), trains it on the KL
divergence of softened outputs (MSE for non-class outputs, optional MSE on matched intermediate
tensors), keeps the best epoch on held-back samples, writes the weights back into the student's
own graph and checks that export against the torch module.

``to_torch(model)`` and ``write_back(model, module)`` are the two halves of that round trip.
Importing this package does not import torch; calling into it does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx_ir as ir

from ferry.optimizer.distill._distill import DistillReport, DistillResult, distill
from ferry.optimizer.distill._torch import TORCH_REQUIREMENT, require_torch

if TYPE_CHECKING:
    from ferry.optimizer.distill._onnx_to_torch import OnnxModule

__all__ = [
    "TORCH_REQUIREMENT",
    "DistillReport",
    "DistillResult",
    "distill",
    "supported_ops",
    "to_torch",
    "write_back",
]


def to_torch(model: ir.Model) -> OnnxModule:
    """``model`` as a trainable ``torch.nn.Module`` whose float weights are parameters.

    Raises:
        UnsupportedOpError: nodes the conversion does not cover, every one listed.
        BackendUnavailableError: torch is not installed.
    """
    require_torch()
    from ferry.optimizer.distill._onnx_to_torch import to_torch as _to_torch

    return _to_torch(model)


def write_back(model: ir.Model, module: OnnxModule) -> ir.Model:
    """A copy of ``model`` holding ``module``'s trained weights (same graph, names, dtypes)."""
    from ferry.optimizer.distill._onnx_to_torch import write_back as _write_back

    return _write_back(model, module)


def supported_ops() -> list[str]:
    """The ONNX ops ``to_torch`` evaluates."""
    require_torch()
    from ferry.optimizer.distill._onnx_to_torch import supported_ops as _supported_ops

    return _supported_ops()
