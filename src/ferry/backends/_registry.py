"""The backend registry: engines found by name.

The built-in ones below are imported on first use; third-party ones are registered by their package
in the ``ferry.backends`` entry-point group (``name = "module:Class"``). Every one derives from
:class:`~ferry.backends.BackendBase`: a class that does not is refused, named.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ferry.backends._base import require_base
from ferry.errors import BackendUnavailableError, InvalidInputError

if TYPE_CHECKING:
    from ferry.backends._api import Backend

__all__ = [
    "AUTO",
    "DEFAULT_BACKENDS",
    "ENTRY_POINT_GROUP",
    "FALLBACK",
    "get_backend",
    "known_backends",
    "parse_backends",
]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "ferry.backends"
#: The engine that runs whatever no other engine takes, and the default.
FALLBACK = "onnxruntime"
DEFAULT_BACKENDS = (FALLBACK,)
#: The name that asks ferry to measure candidate plans and pick one.
AUTO = "auto"

_BUILTIN = {
    "litert": "ferry.backends._litert:LiteRTBackend",
    "onnxruntime": "ferry.backends._onnxruntime:OnnxRuntimeBackend",
    "openvino": "ferry.backends._openvino:OpenVINOBackend",
    "tensorrt": "ferry.backends._tensorrt:TensorRTBackend",
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
        BackendUnavailableError: no backend has that name, its class does not derive from
            :class:`~ferry.backends.BackendBase`, or its engine is not installed here.
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
        try:
            backend = require_base(backend_cls(), f"backend {name!r} ({target})")
        except InvalidInputError as e:
            raise BackendUnavailableError(str(e)) from None
        if not backend.available():
            raise BackendUnavailableError(
                f"backend {name!r} is not available on this machine; {backend.install_hint}"
            )
        _instances[name] = backend
        return backend


def parse_backends(backends: str | Sequence[str] | None) -> list[str]:
    """Backend names in priority order, from ``"openvino,onnxruntime"``, a list, or None.

    None means ONNX Runtime alone. ``"auto"`` must stand alone: it picks the engines itself.

    Raises:
        InvalidInputError: the list is empty, or mixes ``auto`` with engine names.
    """
    if backends is None:
        return list(DEFAULT_BACKENDS)
    if isinstance(backends, str):
        names = [b.strip() for b in backends.split(",") if b.strip()]
    else:
        names = [str(b).strip() for b in backends]
    if not names:
        raise InvalidInputError("backends is empty; name at least one, e.g. 'onnxruntime'")
    if AUTO in names and names != [AUTO]:
        raise InvalidInputError(
            f"backends={names}: 'auto' picks the engines itself; give it alone, or list engines"
        )
    return list(dict.fromkeys(names))
