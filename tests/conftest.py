from __future__ import annotations

import sys
from pathlib import Path

import onnx
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import models


@pytest.fixture
def save(tmp_path: Path):
    """save(model_proto, name) -> path of the model written under tmp_path."""

    def _save(model: onnx.ModelProto, name: str = "model.onnx") -> Path:
        path = tmp_path / name
        onnx.save(model, path)
        return path

    return _save


@pytest.fixture
def mlp_path(save) -> Path:
    return save(models.mlp(), "mlp.onnx")
