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


@pytest.fixture(autouse=True)
def _private_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Engine and auto-choice caches go to a folder of this test run, never the user's ~/.cache."""
    monkeypatch.setenv("FERRY_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ferry-cache"))
