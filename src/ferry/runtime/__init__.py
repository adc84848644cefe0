"""Running models: lowering a Plan, compiling each partition (through the engine cache), the
Session that runs it, ``auto``'s measured choice of plan, and checking a plan partition by partition.

``load(model, backends=...)`` is the entry point (re-exported as ``ferry.load``). Modules import
one way: ``_specs``, ``_feeds``, ``_cache`` <- ``_session`` (the Session) <- ``_found_graph``,
``_found`` (valid inputs found by probing) <- ``_measure`` (the
block timer, the sizes to time at, the verdicts' folder, ONNX Runtime alone), ``_auto_candidates``
(what auto tries, named by what each engine computed) <- ``_auto``,
``_pays`` <- ``_live_store`` (what live placement learned, kept) <- ``_live`` (a session that
learns its plan from the calls it serves) <- ``_load`` (``load``, ``make_plan``) <- ``_verify``.
"""

from __future__ import annotations

from ferry.runtime._auto import AutoChoice, Candidate, auto_engines, auto_plan
from ferry.runtime._cache import (
    DEFAULT_MAX_BYTES,
    CacheEntry,
    EngineCache,
    compile_partition,
    default_cache_dir,
    engine_key,
    resolve_cache,
)
from ferry.runtime._feeds import (
    GUESSED_SIZE,
    concrete_shape,
    guessed_dims,
    load_npy,
    parse_dims,
    parse_shape,
    random_feeds,
)
from ferry.runtime._found import FoundInputs, found_inputs
from ferry.runtime._live import PLACEMENTS, LiveSession, check_placement
from ferry.runtime._load import (
    AUTO_BUDGET_S,
    PlanChoice,
    load,
    make_plan,
    quantization_report,
    with_precision,
)
from ferry.runtime._measure import (
    artifact_shapes,
    block_medians,
    machine_fingerprint,
    save_verdict,
    time_in_blocks,
    timing_feeds,
)
from ferry.runtime._session import Session, lower_plan
from ferry.runtime._specs import InputChecker, TensorSpec, format_shape, spec_of
from ferry.runtime._verify import PartitionCheck, all_values, verify_plan

__all__ = [
    "AUTO_BUDGET_S",
    "DEFAULT_MAX_BYTES",
    "GUESSED_SIZE",
    "PLACEMENTS",
    "AutoChoice",
    "CacheEntry",
    "Candidate",
    "EngineCache",
    "FoundInputs",
    "InputChecker",
    "LiveSession",
    "PartitionCheck",
    "PlanChoice",
    "Session",
    "TensorSpec",
    "all_values",
    "artifact_shapes",
    "auto_engines",
    "auto_plan",
    "block_medians",
    "check_placement",
    "compile_partition",
    "concrete_shape",
    "default_cache_dir",
    "engine_key",
    "format_shape",
    "found_inputs",
    "guessed_dims",
    "load",
    "load_npy",
    "lower_plan",
    "machine_fingerprint",
    "make_plan",
    "parse_dims",
    "parse_shape",
    "quantization_report",
    "random_feeds",
    "resolve_cache",
    "save_verdict",
    "spec_of",
    "time_in_blocks",
    "timing_feeds",
    "verify_plan",
    "with_precision",
]
