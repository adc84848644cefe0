"""What every built-in adapter shares: its engine's version, availability and install hint.

An adapter names the module its engine's SDK is imported as (``sdk``) and the pip extra that
installs it; the version comes from the SDK's ``__version__``, availability from whether it
imports. Engines that can tell which nodes they reject override ``validate``.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = ["BackendBase"]


class BackendBase:
    """Base for adapters: set ``name``, ``device``, ``precisions``, ``sdk`` and ``extra``.

    Attributes:
        sdk: the module the engine's Python API is imported as (``"openvino"``).
        extra: the ferry extra that installs it (``"openvino"``); empty when the engine is one of
            ferry's own dependencies, in which case ``install_hint`` names the SDK's package.
        needs: what else the engine needs beyond the package (``"needs an NVIDIA GPU"``).
    """

    name: str
    device: str
    precisions: tuple[str, ...] = ("fp32",)
    sdk: str
    extra: str = ""
    needs: str = ""

    @property
    def install_hint(self) -> str:
        """What to run when ``available()`` is False."""
        hint = f"pip install 'ferry[{self.extra}]'" if self.extra else f"pip install {self.sdk}"
        return f"{hint}  ({self.needs})" if self.needs else hint

    @property
    def version(self) -> str:
        """The engine's version (part of the engine cache key)."""
        return str(importlib.import_module(self.sdk).__version__)

    def available(self) -> bool:
        """Whether the engine's SDK imports here."""
        try:
            importlib.import_module(self.sdk)
        except ImportError:
            return False
        return True

    def validate(self, model: ir.Model, nodes: Sequence[str]) -> dict[str, str]:
        """No veto: the rule table is this engine's whole answer."""
        return {}
