"""Fixtures for the web bundle's tests: the browser, the artifacts folder, bundles made once.

The browser tests need Debian's ``chromium`` and ``chromium-driver``, Selenium, and npm (the
exporter builds its bundle from onnxruntime-web): ``scripts/browser-env.sh`` installs them all.
Without them the tests skip saying so; in CI (``FERRY_CI=1``), which installs them, their
absence fails the tests instead.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.append(str(HERE.parent / "real"))  # kit_models; last, so its modules shadow none

import browser  # noqa: E402


def _missing(reason: str) -> None:
    """Skip, or fail in CI: CI runs scripts/browser-env.sh, so there a missing tool is a bug."""
    if os.environ.get("FERRY_CI") == "1":
        pytest.fail(f"{reason} (FERRY_CI=1: CI installs it with scripts/browser-env.sh)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def chromium() -> tuple[str, str]:
    """``(chromium, chromedriver)``; skips (fails in CI) when they or Selenium are missing."""
    found = browser.find_chromium()
    if isinstance(found, str):
        _missing(found)
    assert not isinstance(found, str)
    return found


@pytest.fixture(scope="session")
def npm() -> str:
    """npm's path: the exporter needs it to fetch onnxruntime-web."""
    path = shutil.which("npm")
    if path is None:
        _missing(
            "npm not found (the web exporter needs Node.js and npm): run scripts/browser-env.sh"
        )
    assert path is not None
    return path


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where screenshots go: ``$FERRY_TEST_ARTIFACTS/web`` when set (a folder CI keeps),
    else a folder of this run's pytest temp dir. Its path is printed at the end of the run."""
    root = os.environ.get("FERRY_TEST_ARTIFACTS")
    folder = Path(root) / "web" if root else tmp_path_factory.mktemp("web-artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    _ARTIFACTS.append(folder)
    return folder


_ARTIFACTS: list[Path] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Says where the screenshots are, at the end of every run that took some."""
    for folder in _ARTIFACTS:
        shots = sorted(p.name for p in folder.glob("*.png"))
        if shots:
            terminalreporter.write_line(f"web screenshots in {folder}: {', '.join(shots)}")


@pytest.fixture(scope="session")
def export_bundle(npm: str, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``export_bundle(key, model, **options)``: the folder ``ferry.web.export_web`` made for
    ``model``, once per session per ``key`` (npm and the copy of the wasm files take a while)."""
    try:
        from ferry.web import export_web
    except ImportError as e:  # the exporter is part of ferry: its absence is a failure
        pytest.fail(f"ferry.web.export_web cannot be imported: {e}")
    root = tmp_path_factory.mktemp("web-bundles")
    made: dict[str, Path] = {}

    def get(key: str, model: Any, **options: Any) -> Path:
        if key not in made:
            out = root / key
            export_web(model, out, **options)
            made[key] = out
        return made[key]

    return get
