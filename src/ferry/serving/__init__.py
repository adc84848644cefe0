"""Serving models over HTTP with KServe v2 (the Open Inference Protocol), as Triton does.

::

    from ferry.serving import create_app, ServerThread

    app = create_app("models/")                      # a repository, a model file or an artifact
    with ServerThread(app, host="127.0.0.1", port=0) as server:
        print(server.url)                            # Triton's own client works against it

The pieces: the app and its routes (:func:`create_app`), uvicorn in a thread (:class:`ServerThread`,
:func:`bind`), HTTP plumbing any ferry server uses (:class:`HTTPError`, :func:`read_body` under a
size cap, :func:`check_bearer`; the bench agent is served with them too), the repository (layout,
versions, load/unload/hot reload), ``config.json`` and its defaults, the codec (tensors on the
wire), instances and the dynamic batcher, and metrics (Prometheus and Triton statistics).

Names are imported on first use: Starlette, uvicorn and prometheus-client (``pip install
'ferry[serve]'``) only when an app is made or served.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ferry._lazy import lazy_getattr

if TYPE_CHECKING:
    from ferry.serving._admission import (
        DEFAULT_MAX_QUEUE_SIZE,
        QueueFullError,
        QueuePolicy,
        QueueTimeoutError,
    )
    from ferry.serving._app import (
        EXTENSIONS,
        ServingState,
        create_app,
        status_of,
    )
    from ferry.serving._batcher import (
        BatchOutcome,
        DynamicBatcher,
        Execution,
        ExecutionRecord,
        run_items,
    )
    from ferry.serving._codec import (
        DATATYPES,
        InferRequest,
        RequestedOutput,
        datatype_of,
        decode_request,
        encode_response,
    )
    from ferry.serving._config import (
        DEFAULT_MAX_BATCH_SIZE,
        DEFAULT_QUEUE_DELAY_US,
        PRECISIONS,
        ConfigError,
        ModelConfig,
        ResolvedConfig,
        VersionPolicy,
        batch_dim_problem,
        check_precision,
        parse_config,
        resolve_config,
        triton_config,
    )
    from ferry.serving._config_file import read_config
    from ferry.serving._generative import (
        GenerationMetrics,
        GenerationSettings,
        GenerativeVersion,
        load_generative,
    )
    from ferry.serving._grpc import DEFAULT_GRPC_PORT, GrpcServer
    from ferry.serving._http import (
        DEFAULT_MAX_REQUEST_BYTES,
        HTTPError,
        TooLarge,
        check_bearer,
        error_response,
        read_body,
        save_body,
    )
    from ferry.serving._isolate import WorkerDiedError, load_isolated
    from ferry.serving._metrics import (
        FLUSH_EVERY,
        LATENCY_BUCKETS,
        Metrics,
        VersionRecorder,
        VersionStats,
    )
    from ferry.serving._repository import (
        ModelNotFoundError,
        ModelNotReadyError,
        ModelRepository,
        VersionFiles,
        check_model_name,
        find_model_file,
        list_models,
        model_name_for,
    )
    from ferry.serving._scheduler import (
        Instance,
        InstancePool,
        LoadedModel,
        ModelVersion,
        available_cores,
        engine_threads,
        load_version,
    )
    from ferry.serving._server import (
        DEFAULT_DRAIN_TIMEOUT,
        ServerThread,
        bind,
        sigterm_interrupts,
    )

__all__ = [
    "DATATYPES",
    "DEFAULT_DRAIN_TIMEOUT",
    "DEFAULT_GRPC_PORT",
    "DEFAULT_MAX_BATCH_SIZE",
    "DEFAULT_MAX_QUEUE_SIZE",
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_QUEUE_DELAY_US",
    "EXTENSIONS",
    "FLUSH_EVERY",
    "LATENCY_BUCKETS",
    "PRECISIONS",
    "BatchOutcome",
    "ConfigError",
    "DynamicBatcher",
    "Execution",
    "ExecutionRecord",
    "GenerationMetrics",
    "GenerationSettings",
    "GenerativeVersion",
    "GrpcServer",
    "HTTPError",
    "InferRequest",
    "Instance",
    "InstancePool",
    "LoadedModel",
    "Metrics",
    "ModelConfig",
    "ModelNotFoundError",
    "ModelNotReadyError",
    "ModelRepository",
    "ModelVersion",
    "QueueFullError",
    "QueuePolicy",
    "QueueTimeoutError",
    "RequestedOutput",
    "ResolvedConfig",
    "ServerThread",
    "ServingState",
    "TooLarge",
    "VersionFiles",
    "VersionPolicy",
    "VersionRecorder",
    "VersionStats",
    "WorkerDiedError",
    "available_cores",
    "batch_dim_problem",
    "bind",
    "check_bearer",
    "check_model_name",
    "check_precision",
    "create_app",
    "datatype_of",
    "decode_request",
    "encode_response",
    "engine_threads",
    "error_response",
    "find_model_file",
    "list_models",
    "load_generative",
    "load_isolated",
    "load_version",
    "model_name_for",
    "parse_config",
    "read_body",
    "read_config",
    "resolve_config",
    "run_items",
    "save_body",
    "sigterm_interrupts",
    "status_of",
    "triton_config",
]

#: The modules behind the names, each after those it imports: a name is looked up in them in
#: this order, and only the modules up to the one holding it are imported.
_MODULES = (
    "_http",
    "_server",
    "_admission",
    "_config",
    "_config_file",
    "_metrics",
    "_codec",
    "_batcher",
    "_scheduler",
    "_isolate",
    "_generative",
    "_repository",
    "_state",
    "_app",
    "_grpc",
)


__getattr__ = lazy_getattr(__name__, __all__, _MODULES)
