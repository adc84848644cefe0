"""The public surface: every public module imports, exports what it says, and ``import ferry`` is light."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pytest

import ferry

PUBLIC_MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(ferry.__path__, "ferry.")
    if not any(part.startswith("_") for part in m.name.split("."))
)


def test_public_modules_are_listed() -> None:
    for expected in (
        "ferry.graph",
        "ferry.errors",
        "ferry.runtime",
        "ferry.backends",
        "ferry.plan",
        "ferry.parity",
        "ferry.conformance",
        "ferry.cli.main",
    ):
        assert expected in PUBLIC_MODULES


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_public_module_imports_and_exports(name: str) -> None:
    module = importlib.import_module(name)
    for symbol in getattr(module, "__all__", []):
        assert hasattr(module, symbol), f"{name}.__all__ names missing {symbol}"


def test_top_level_api() -> None:
    assert callable(ferry.load)
    assert ferry.Session.__name__ == "Session"
    assert issubclass(ferry.InvalidInputError, ferry.FerryError)
    assert issubclass(ferry.InvalidInputError, ValueError)
    for name in ferry.__all__:
        assert getattr(ferry, name) is not None
    with pytest.raises(AttributeError):
        ferry.no_such_thing  # noqa: B018


def test_import_ferry_loads_no_engine() -> None:
    code = (
        "import sys, ferry, ferry.errors; "
        "heavy = {'onnxruntime', 'onnx', 'onnx_ir', 'torch', 'numpy'} & set(sys.modules); "
        "print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
