"""Deploying ferry's server on a cluster engine a team already runs: KServe and Ray Serve.

::

    from ferry.deploy import kserve_manifests
    from ferry.deploy import ray as ferry_ray

    kserve_manifests("model.onnx", "manifests/")     # InferenceService, Dockerfile, README
    ferry_ray.deploy("models/", replicas=2)          # Ray Serve applications on a cluster

KServe (:func:`kserve_manifests`) gets files to apply: an InferenceService whose predictor runs
``ferry serve``, and its image's build. Ray Serve (:mod:`ferry.deploy.ray`) runs
:func:`ferry.serving.create_app`'s app in its replicas. Both serve what :mod:`ferry.serving`
serves; nothing here is imported by it.

Names are imported on first use; Ray only inside :mod:`ferry.deploy.ray`'s calls (``pip install
'ferry[ray]'``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ferry._lazy import lazy_getattr

if TYPE_CHECKING:
    from ferry.deploy import ray
    from ferry.deploy._kserve import (
        CONTAINER_PORT,
        DEFAULT_REGISTRY,
        KSERVE_API_VERSION,
        LIVENESS_PATH,
        MODEL_MOUNT,
        READINESS_PATH,
        KServeDeployment,
        build_wheel,
        is_kserve_output,
        kserve_manifests,
    )

__all__ = [
    "CONTAINER_PORT",
    "DEFAULT_REGISTRY",
    "KSERVE_API_VERSION",
    "LIVENESS_PATH",
    "MODEL_MOUNT",
    "READINESS_PATH",
    "KServeDeployment",
    "build_wheel",
    "is_kserve_output",
    "kserve_manifests",
    "ray",
]

_kserve_getattr = lazy_getattr(__name__, [n for n in __all__ if n != "ray"], ("_kserve",))


def __getattr__(name: str) -> Any:
    # ``ray`` is a module of its own (its names, deploy() and the rest, read best qualified).
    if name == "ray":
        return importlib.import_module(f"{__name__}.ray")
    return _kserve_getattr(name)
