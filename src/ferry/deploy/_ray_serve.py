"""Ray Serve itself, imported on first use, and the names ferry's applications carry on it."""

from __future__ import annotations

from typing import Any

from ferry.errors import BackendUnavailableError

__all__ = ["APP_PREFIX", "serve_module"]

#: Ray Serve application names: ``ferry-<model>`` per model (``ferry`` is the front).
APP_PREFIX = "ferry-"
_INSTALL = "pip install 'ferry[ray]'"


def serve_module() -> Any:
    """``ray.serve``, or BackendUnavailableError naming the extra that installs it."""
    try:
        from ray import serve
    except ImportError as e:
        raise BackendUnavailableError(f"Ray Serve is not installed ({e}); {_INSTALL}") from None
    return serve
