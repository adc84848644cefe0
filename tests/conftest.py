from __future__ import annotations

import re
import signal
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


VENDOR_ADAPTER = Path(__file__).resolve().parents[1] / "examples" / "vendor_adapter"


@pytest.fixture
def acme_npu(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """Registers the example vendor adapter (``examples/vendor_adapter``) for one test; gives its
    backend name.

    The adapter is never installed into the environment. This does what installing it would: its
    source goes on ``sys.path``, and beside it a ``.dist-info`` folder declaring the entry points of
    its ``pyproject.toml``, so that ``importlib.metadata`` (and through it ferry's registry) finds
    ``acme_npu`` in the ``ferry.backends`` group as it would an installed package's.
    """
    # The pyproject.toml's own declarations (tomllib would do, but it needs Python 3.11).
    pyproject = (VENDOR_ADAPTER / "pyproject.toml").read_text(encoding="utf-8")
    declared = dict(re.findall(r'^(name|version) = "([^"]+)"', pyproject, re.M))
    dist, version = declared["name"], declared["version"]
    groups = {
        group: dict(re.findall(r'^([\w.-]+) = "([^"]+)"', body, re.M))
        for group, body in re.findall(
            r'^\[project\.entry-points\."([^"]+)"\]\n(.*?)(?=^\[|\Z)', pyproject, re.M | re.S
        )
    }
    site = tmp_path_factory.mktemp("acme-site")
    dist_info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n", encoding="utf-8"
    )
    (dist_info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in points.items())
            for group, points in groups.items()
        ),
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(VENDOR_ADAPTER / "src"))
    (name,) = groups["ferry.backends"]
    yield name
    # Forget the instance and the module too, so that no later test sees the adapter.
    from ferry.backends import _registry

    _registry._instances.pop(name, None)
    for module in [m for m in sys.modules if m.split(".")[0] == "ferry_acme_npu"]:
        del sys.modules[module]


# In CI (FERRY_CI=1) a skipped test is a failure: tests/ci_skips.py.
from ci_skips import pytest_runtest_makereport  # noqa: E402, F401


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C as a terminal gives it: a suite started in the background by a non-interactive
    shell (``nohup bash .ci/run &``) inherits SIGINT ignored, and then the drain tests' Ctrl-C
    reaches neither this process (one test waited forever) nor the servers it starts."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
