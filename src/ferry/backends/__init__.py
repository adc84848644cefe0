"""Engine adapters and their registry.

Backends are found by name: the built-in ones below, imported on first use, and third-party ones that
a package registers in the ``ferry.backends`` entry-point group (``name = "module:Class"``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import threading
from typing import TYPE_CHECKING

from ferry.errors import BackendUnavailableError

if TYPE_CHECKING:
    from ferry.backends.api import Backend

__all__ = ["ENTRY_POINT_GROUP", "get_backend", "known_backends"]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "ferry.backends"

_BUILTIN = {
    "onnxruntime": "ferry.backends.onnxruntime:OnnxRuntimeBackend",
    "openvino": "ferry.backends.openvino:OpenVINOBackend",
    "tensorrt": "ferry.backends.tensorrt:TensorRTBackend",
}
_instances: dict[str, Backend] = {}
_lock = threading.Lock()


def _registry() -> dict[str, str]:
    found = dict(_BUILTIN)
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep.value)
    return found


def known_backends() -> list[str]:
    """Names of every backend ferry knows of, installed or not."""
    return sorted(_registry())


def get_backend(name: str) -> Backend:
    """The backend called ``name``, imported on first use.

    Raises:
        BackendUnavailableError: no backend has that name, or its engine is not installed here.
    """
    with _lock:
        if name in _instances:
            return _instances[name]
        registry = _registry()
        target = registry.get(name)
        if target is None:
            raise BackendUnavailableError(
                f"unknown backend {name!r}; known backends: {', '.join(sorted(registry))}"
            )
        module_name, _, attr = target.partition(":")
        try:
            backend_cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise BackendUnavailableError(
                f"backend {name!r} ({target}) failed to import: {e}"
            ) from e
        backend: Backend = backend_cls()
        if not backend.available():
            raise BackendUnavailableError(
                f"backend {name!r} is not available on this machine; "
                f"{getattr(backend, 'install_hint', 'install its engine')}"
            )
        _instances[name] = backend
        return backend
