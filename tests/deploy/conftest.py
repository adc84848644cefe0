"""Fixtures for the deploy tests (KServe manifests, Ray Serve): the serving tests' models too."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
# _kserve_helpers here; _serving_models (the models served) beside the serving tests.
sys.path[:0] = [str(HERE), str(HERE.parent / "serving")]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    return path
