"""What every built-in adapter shares: its engine's version, availability and install hint, and
how an engine is handed a model.

An adapter names the module its engine's SDK is imported as (``sdk``) and the pip extra that
installs it; the version comes from the SDK's ``__version__``, availability from whether it
imports. Engines that can tell which nodes they reject override ``validate``.
"""

from __future__ import annotations

import contextlib
import importlib
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import onnx_ir as ir

__all__ = ["BackendBase", "model_source"]

#: Models whose weights pass this go to engines as a file: protobuf cannot hold 2 GiB.
INLINE_LIMIT = 1 << 30


@contextlib.contextmanager
def model_source(
    model: ir.Model, path: Path | None = None
) -> Iterator[tuple[bytes | None, Path | None]]:
    """What an engine reads ``model`` from, as ``(bytes, None)`` or ``(None, file)``.

    The file itself when ``path`` holds exactly ``model``; else the serialized model, with
    weights kept in external data files read in (they are relative to a folder the engine does
    not know); a model whose weights pass 1 GiB is written with external data to a temporary
    folder instead, removed when the block ends (so engines must have read it by then).
    """
    if path is not None:
        yield None, Path(path)
        return
    size = sum(
        v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None
    )
    if size <= INLINE_LIMIT:
        if any(
            isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values()
        ):
            model = ir.external_data.load_to_model(model.clone())
        yield ir.to_proto(model).SerializeToString(), None
        return
    with tempfile.TemporaryDirectory(prefix="ferry-model-") as tmp:
        file = Path(tmp) / "model.onnx"
        ir.save(model, file, external_data="model.onnx.data")
        yield None, file


class BackendBase:
    """Base for adapters: set ``name``, ``device``, ``precisions``, ``sdk`` and ``extra``.

    Attributes:
        sdk: the module the engine's Python API is imported as (``"openvino"``).
        extra: the ferry extra that installs it (``"openvino"``); empty when the engine is one of
            ferry's own dependencies, in which case ``install_hint`` names the SDK's package.
        needs: what else the engine needs beyond the package (``"needs an NVIDIA GPU"``).
        ranked_inputs: the engine cannot take an input of unknown rank (placement then keeps
            such tensors from crossing into it).
    """

    name: str
    device: str
    precisions: tuple[str, ...] = ("fp32",)
    sdk: str
    extra: str = ""
    needs: str = ""
    ranked_inputs: bool = False

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
