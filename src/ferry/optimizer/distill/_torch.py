"""PyTorch, imported only when distillation runs (it is an optional, heavy dependency)."""

from __future__ import annotations

import importlib
from types import ModuleType

from ferry.errors import BackendUnavailableError

#: The torch release ferry's distillation is tested with.
TORCH_REQUIREMENT = "torch==2.13.0"


def require_torch() -> ModuleType:
    """The ``torch`` module, or an error saying how to install it.

    Raises:
        BackendUnavailableError: torch is not installed.
    """
    try:
        return importlib.import_module("torch")
    except ImportError as e:
        raise BackendUnavailableError(
            "distillation trains the student in PyTorch, which is not installed here: "
            f"pip install {TORCH_REQUIREMENT} (the CPU wheel is enough: "
            f"pip install {TORCH_REQUIREMENT} --index-url https://download.pytorch.org/whl/cpu)"
        ) from e
