from __future__ import annotations

import os
import sys
from collections.abc import Iterator
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


# In CI (FERRY_CI=1) a skipped test is a failure: CI installs every engine and framework but
# TensorRT's GPU, so a skip there means something CI should run silently did not.
_MAY_SKIP_IN_CI = ("TensorRT", "tensorrt", "NVIDIA GPU", "CUDA")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if os.environ.get("FERRY_CI") != "1" or not report.skipped:
        return
    reason = (
        str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    )
    if item.get_closest_marker("gpu") is not None or any(w in reason for w in _MAY_SKIP_IN_CI):
        return
    report.outcome = "failed"
    report.longrepr = f"skipped in CI, which installs what this test needs: {reason}"
