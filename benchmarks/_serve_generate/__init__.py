"""benchmarks/serve_generate.py's parts: the load driver, the servers it starts, the report."""

from __future__ import annotations

from ._driver import Load, LoadSpec, RequestResult, percentiles_ms, run_load, sse_data, summarize
from ._report import SCHEMA, markdown, notes, plain
from ._servers import (
    LLAMACPP_PYTHON,
    ServerError,
    ServerSpec,
    build_artifact,
    cpu_seconds,
    ferry_serve_flags,
    ferry_spec,
    llamacpp_spec,
    llamacpp_version,
    running,
)

__all__ = [
    "LLAMACPP_PYTHON",
    "SCHEMA",
    "Load",
    "LoadSpec",
    "RequestResult",
    "ServerError",
    "ServerSpec",
    "build_artifact",
    "cpu_seconds",
    "ferry_serve_flags",
    "ferry_spec",
    "llamacpp_spec",
    "llamacpp_version",
    "markdown",
    "notes",
    "percentiles_ms",
    "plain",
    "run_load",
    "running",
    "sse_data",
    "summarize",
]
