"""What a rule module is told when the pipeline asks for its rules: the target, level and opset."""

from __future__ import annotations

import dataclasses
from typing import Literal

__all__ = ["LEVELS", "Level", "RuleContext"]

Level = Literal["basic", "extended"]
LEVELS: tuple[Level, ...] = ("basic", "extended")


@dataclasses.dataclass(frozen=True)
class RuleContext:
    """The situation rules are chosen for.

    Attributes:
        level: ``basic`` (rewrites every engine gains from: folding, cancelling, fusing into
            neighbours) or ``extended`` (also fusions into higher-level ops: Gelu, HardSwish,
            LayerNormalization, fused attention).
        target: the engine the model is optimized for (``onnxruntime``, ``openvino``,
            ``tensorrt``), or None for a model that must stay good on every engine: then only
            ``rules/common`` apply.
        opset: the model's default-domain (``ai.onnx``) opset; a rule whose result needs a newer
            op (Gelu is opset 20) offers itself only when the model already imports it.
        fix_shapes: the inputs were fixed to static sizes (``--fix-shapes``): shape arithmetic may
            be folded to constants.
    """

    level: Level = "basic"
    target: str | None = None
    opset: int = 17
    fix_shapes: bool = False

    @property
    def extended(self) -> bool:
        return self.level == "extended"
