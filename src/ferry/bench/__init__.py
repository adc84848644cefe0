"""Benchmarking: latency, throughput, start-up time and memory of models run through ferry.

``run_bench(model, BenchSpec(...))`` measures locally and returns the results document (its
schema is in ``_runner.py``; what a run is asked to measure, in ``_spec.py``); :func:`run_remote`
runs the same on a device where ``ferry agent`` (:func:`create_agent_app`, served by
:class:`ferry.serving.ServerThread`) listens; :func:`table`, :func:`to_csv`, :func:`write_json`,
:func:`save_to_artifact` and :func:`plot_latency` turn results into tables, CSV, an artifact's
report and a PNG; :func:`run_generate_bench` measures a generative artifact's time to first
token, prefill and decode tokens/s (``ferry bench --generate``, schema in ``_generate.py``) and
:func:`generate_table` shows it; :func:`interleave` and :func:`measure` time calls; :func:`device_info` says
where.

Names are imported on first use, so ``python -m ferry.bench._worker`` (the child processes that
measure cold starts) loads only what it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ferry._lazy import lazy_getattr

if TYPE_CHECKING:
    from ferry.bench._agent import (
        DEFAULT_MAX_UPLOAD_BYTES,
        DEFAULT_PORT,
        INPUTS_FOLDER,
        create_agent_app,
    )
    from ferry.bench._device import (
        cpu_model,
        device_info,
        memory_mb,
    )
    from ferry.bench._generate import (
        GENERATE_SCHEMA,
        GenerateSpec,
        check_generate_results,
        generate_lines,
        generate_table,
        run_generate_bench,
    )
    from ferry.bench._latency import (
        DEFAULT_BLOCK,
        Contender,
        LatencyStats,
        interleave,
        measure,
        summarize_ms,
    )
    from ferry.bench._plot import (
        plot_latency,
    )
    from ferry.bench._remote import (
        AgentClient,
        run_remote,
    )
    from ferry.bench._report import (
        REPORT_FILE,
        accuracy_cell,
        budget_summary,
        check_results,
        device_summary,
        errors,
        notes,
        outside_budget,
        partition_lines,
        save_to_artifact,
        table,
        to_csv,
        write_csv,
        write_json,
    )
    from ferry.bench._runner import SCHEMA, batch_feeds, file_sha256, run_bench
    from ferry.bench._spec import BASELINE, BenchSpec, Progress, Target, resolve_targets

__all__ = [
    "BASELINE",
    "DEFAULT_BLOCK",
    "DEFAULT_MAX_UPLOAD_BYTES",
    "DEFAULT_PORT",
    "GENERATE_SCHEMA",
    "INPUTS_FOLDER",
    "REPORT_FILE",
    "SCHEMA",
    "AgentClient",
    "BenchSpec",
    "Contender",
    "GenerateSpec",
    "LatencyStats",
    "Progress",
    "Target",
    "accuracy_cell",
    "batch_feeds",
    "budget_summary",
    "check_generate_results",
    "check_results",
    "cpu_model",
    "create_agent_app",
    "device_info",
    "device_summary",
    "errors",
    "file_sha256",
    "generate_lines",
    "generate_table",
    "interleave",
    "measure",
    "memory_mb",
    "notes",
    "outside_budget",
    "partition_lines",
    "plot_latency",
    "resolve_targets",
    "run_bench",
    "run_generate_bench",
    "run_remote",
    "save_to_artifact",
    "summarize_ms",
    "table",
    "to_csv",
    "write_csv",
    "write_json",
]

#: The modules behind the names, each after those it imports: a name is looked up in them in
#: this order, and only the modules up to the one holding it are imported.
_MODULES = (
    "_device",
    "_latency",
    "_spec",
    "_runner",
    "_report",
    "_generate",
    "_plot",
    "_agent",
    "_remote",
)


__getattr__ = lazy_getattr(__name__, __all__, _MODULES)
