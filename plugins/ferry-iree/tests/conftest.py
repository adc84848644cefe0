"""The IREE plugin's tests: skipped, naming the install line, where the plugin or IREE is
missing; in CI (``FERRY_CI=1``) a missing plugin fails instead (CI installs it).

The kit tests reuse ferry's real tier (``tests/real/kit_models.py``) when this plugin sits in
ferry's repository; elsewhere they skip.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

INSTALL = "pip install ./plugins/ferry-iree (or pip install ferry-iree)"
#: ferry's real tier, beside this plugin in ferry's repository.
REAL_TIER = Path(__file__).resolve().parents[3] / "tests" / "real"


def _missing() -> str | None:
    for module in ("ferry_iree", "iree.runtime", "iree.compiler"):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return f"{module} is not installed: {INSTALL}"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip (fail in CI) a test of this folder where the plugin or IREE is missing; the test
    modules import ``ferry_iree`` inside their tests for that reason."""
    missing = _missing()
    if missing is None or Path(__file__).parent not in Path(str(item.fspath)).parents:
        return
    if os.environ.get("FERRY_CI") == "1":
        pytest.fail(f"CI installs the IREE plugin; {missing}")
    pytest.skip(missing)


@pytest.fixture
def iree() -> object:
    """The registered ``iree`` backend (through ferry's entry points, as users get it)."""
    from ferry.backends import get_backend

    return get_backend("iree")


@pytest.fixture(autouse=True, scope="session")
def _own_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Engines and trial answers in a folder of this run, not the user's cache."""
    saved = os.environ.get("FERRY_CACHE_DIR")
    os.environ["FERRY_CACHE_DIR"] = str(tmp_path_factory.mktemp("ferry-iree-cache"))
    yield
    if saved is None:
        os.environ.pop("FERRY_CACHE_DIR", None)
    else:
        os.environ["FERRY_CACHE_DIR"] = saved


@pytest.fixture(scope="session")
def kit_models() -> object:
    """ferry's ``tests/real/kit_models`` (the kit's paths, feeds and judges); skips outside
    ferry's repository or without the kit."""
    if not (REAL_TIER / "kit_models.py").is_file():
        pytest.skip("the kit tests need ferry's repository (tests/real/kit_models.py)")
    if str(REAL_TIER) not in sys.path:
        sys.path.insert(0, str(REAL_TIER))
    import kit_models

    if not kit_models.kit_ready():
        pytest.skip(
            f"the real-model kit is not in {kit_models.KIT_DIR}: run scripts/fetch-kit.sh "
            "(or set FERRY_KIT to where it is)"
        )
    return kit_models
