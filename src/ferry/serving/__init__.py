"""Serving models over HTTP with KServe v2 (the Open Inference Protocol), as Triton does.

::

    from ferry.serving import create_app, ServerThread

    app = create_app("models/")                      # a repository, a model file or an artifact
    with ServerThread(app, host="127.0.0.1", port=0) as server:
        print(server.url)                            # Triton's own client works against it

Modules: ``codec`` (tensors on the wire), ``config`` (config.json and defaults), ``repository``
(layout, versions, load/unload/hot reload), ``batcher`` (dynamic batching), ``scheduler``
(instances, threads, warm-up), ``metrics`` (Prometheus and Triton statistics), ``app`` (routes),
``server`` (uvicorn in a thread). Starlette, uvicorn and prometheus-client are imported only when
an app is made (``pip install 'ferry[serve]'``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ferry.serving.app import create_app
    from ferry.serving.server import ServerThread

__all__ = ["ServerThread", "create_app"]

_LAZY = {"create_app": "ferry.serving.app", "ServerThread": "ferry.serving.server"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ferry.serving' has no attribute {name!r}")
