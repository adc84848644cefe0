"""The real tier: every verb on models made by other people (the kit), judged at the task.

Tests here carry the ``real`` marker. Without the kit they skip, saying how to fetch it
(``scripts/fetch-kit.sh``); in CI (``FERRY_CI=1``) a skip is a failure, so the tier cannot
silently not run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

import kit_models


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.real)


@pytest.fixture(autouse=True)
def _need_kit() -> None:
    if not kit_models.kit_ready():
        pytest.skip(
            f"the real-model kit is not in {kit_models.KIT_DIR}: run scripts/fetch-kit.sh "
            "(or set FERRY_KIT to where it is)"
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = os.environ.get("FERRY_REAL_REPORT")
    if out and kit_models.RESULTS:
        rows = [
            {"model": m, "verb": verb, **v.to_dict()}
            for m, verb, verdicts in kit_models.RESULTS
            for v in verdicts
        ]
        Path(out).write_text(json.dumps(rows, indent=1), encoding="utf-8")


@pytest.fixture(scope="session")
def onnx_file(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``onnx_file(mid)``: the kit model as an ONNX file: its own for ONNX models, else what
    ``ferry.convert`` makes of it (once per session; a failed conversion fails the test)."""
    folder = tmp_path_factory.mktemp("converted")
    made: dict[str, Path] = {}

    def get(mid: str) -> Path:
        if kit_models.entry(mid)["format"] == "onnx":
            return kit_models.path(mid)
        if mid not in made:
            made[mid] = kit_models.convert(mid, folder / f"{mid}.onnx")
        return made[mid]

    return get
