"""ferry: convert, optimize, partition, run, serve and benchmark models across inference engines.

The embedding API::

    import ferry
    session = ferry.load("model.onnx")
    outputs = session.run({"input": array})

Importing ``ferry`` is cheap: engines and heavy modules load on first use.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, NoReturn

from ferry._lazy import lazy_getattr
from ferry._version import __version__
from ferry.errors import (
    BackendUnavailableError,
    ConversionError,
    ExecutionError,
    FerryError,
    InvalidInputError,
    ModelLoadError,
    PlanError,
    UnsupportedOpError,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Literal

    import numpy as np
    import onnx
    import onnx_ir

    from ferry.converters import ConversionResult, convert
    from ferry.optimizer import CompressResult, OptimizeResult, compress, optimize
    from ferry.optimizer.distill import DistillResult, distill
    from ferry.optimizer.prune import PruneResult, prune
    from ferry.optimizer.quantize import QuantizeResult, quantize
    from ferry.parity import Budget
    from ferry.plan import Plan
    from ferry.runtime import Session, TensorSpec

__all__ = [
    "BackendUnavailableError",
    "CompressResult",
    "ConversionError",
    "ConversionResult",
    "DistillResult",
    "ExecutionError",
    "FerryError",
    "InvalidInputError",
    "ModelLoadError",
    "OptimizeResult",
    "Plan",
    "PlanError",
    "PruneResult",
    "QuantizeResult",
    "Session",
    "TensorSpec",
    "UnsupportedOpError",
    "__version__",
    "compress",
    "convert",
    "distill",
    "load",
    "optimize",
    "prune",
    "quantize",
]

__getattr__ = lazy_getattr(
    __name__,
    [
        "Session",
        "TensorSpec",
        "Plan",
        "convert",
        "ConversionResult",
        "optimize",
        "OptimizeResult",
        "quantize",
        "QuantizeResult",
        "prune",
        "PruneResult",
        "distill",
        "DistillResult",
        "compress",
        "CompressResult",
    ],
    [
        "ferry.runtime",
        "ferry.plan",
        "ferry.converters",
        "ferry.optimizer",
        "ferry.optimizer.quantize",
        "ferry.optimizer.prune",
        "ferry.optimizer.distill",
    ],
)


def load(
    source: str | os.PathLike[str] | onnx_ir.Model | onnx.ModelProto,
    *,
    optimize: bool | str = False,
    backends: str | Sequence[str] | None = None,
    threads: int | None = None,
    precision: str | None = None,
    plan: Plan | None = None,
    cache_dir: str | os.PathLike[str] | Literal[False] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    example_inputs: Mapping[str, np.ndarray] | None = None,
    accuracy: Budget | None = None,
    check_pays: bool = True,
    placement: str = "live",
    **unknown: Any,
) -> Session:
    """Load a model and make it ready to run: :func:`ferry.runtime.load` (where every keyword
    but ``optimize`` is described), after an optional optimization.

    Args:
        source: an ``.onnx`` file, a ferry artifact folder, an ``onnx_ir.Model`` or an
            ``onnx.ModelProto``; never modified. A generative artifact folder (``ferry convert
            model.gguf``) gives a ``ferry.generate`` DecoderSession (``.generate(prompt)``).
        optimize: run :func:`ferry.optimize` before placement (``True`` or ``"basic"``,
            ``"extended"``) for the first engine named, verified against the model on
            ``example_inputs`` (else random inputs at ``shapes``) and timed; when the result
            computes something else or runs slower, the model runs as given, with a warning.
        backends: engine names in priority order, or ``"auto"``; None: ONNX Runtime.
        threads: intra-op threads per engine.
        precision: the precision every engine that offers it runs in.
        plan: run this plan instead of placing the model.
        cache_dir: the engine cache: None for the default, a folder, or False for none.
        options: per-backend compile options.
        shapes: the input sizes the model will run at.
        example_inputs: real inputs to time (and, with ``"auto"``, judge) on.
        accuracy: with ``"auto"``, the budget its candidates are judged by.
        check_pays: run ONNX Runtime alone when a placed plan is slower.
        placement: ``"live"`` (sizes unknown: learn each size's plan from the calls served) or
            ``"fixed"`` (the plan made at load).
        **unknown: refused: a keyword ``load`` does not take (a misspelt one) is an
            :class:`InvalidInputError` naming the keywords it takes.

    Raises:
        InvalidInputError: an unknown keyword, or a bad value (see :func:`ferry.runtime.load`).
    """
    if unknown:
        _refuse_keywords(unknown)
    from ferry.generate._loop import DecoderSession, is_generative_artifact

    if is_generative_artifact(source):
        # A decoder runs token by token: the DecoderSession wraps the runtime's Session. What
        # only a one-forward model can use is refused, never silently dropped.
        given = {
            "optimize": optimize is not False,
            "plan": plan is not None,
            "shapes": shapes is not None,
            "example_inputs": example_inputs is not None,
            "accuracy": accuracy is not None,
        }
        if any(given.values()):
            names = ", ".join(name for name, on in given.items() if on)
            raise InvalidInputError(
                f"{os.fspath(source)} is a generative decoder: {names} apply to models run one "
                "forward at a time; leave them out (a decoder's sizes come from the prompt)"
            )
        if isinstance(backends, str) and backends.strip().lower() == "auto":
            from ferry.generate._auto import auto_decoder

            return auto_decoder(  # type: ignore[return-value]  # documented: a DecoderSession
                source,
                threads=threads,
                precision=precision,
                cache_dir=cache_dir,
                options=options,
            )
        decoder = DecoderSession.from_folder(
            source,
            backends=backends,
            threads=threads,
            precision=precision,
            cache_dir=cache_dir,
            options=options,
            check_pays=check_pays,
        )
        return decoder  # type: ignore[return-value]  # documented: a DecoderSession here
    from ferry.runtime import load as load_session

    if optimize is not False:
        from ferry.optimizer import optimized_for_load

        source = optimized_for_load(
            source,
            optimize,
            backends=backends,
            shapes=shapes,
            example_inputs=example_inputs,
        )
    return load_session(
        source,
        backends=backends,
        threads=threads,
        precision=precision,
        plan=plan,
        cache_dir=cache_dir,
        options=options,
        shapes=shapes,
        example_inputs=example_inputs,
        accuracy=accuracy,
        check_pays=check_pays,
        placement=placement,
    )


def _refuse_keywords(unknown: Mapping[str, Any]) -> NoReturn:
    """Name the keywords :func:`load` takes, and the nearest to each one given that it does not
    (Python's own TypeError would name neither)."""
    import difflib
    import inspect

    known = [
        name
        for name, param in inspect.signature(load).parameters.items()
        if param.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    said = []
    for key in sorted(unknown):
        near = difflib.get_close_matches(key, known, n=1)
        said.append(repr(key) + (f" (did you mean {near[0]!r}?)" if near else ""))
    raise InvalidInputError(
        f"ferry.load: unknown keyword {', '.join(said)}; it takes {', '.join(known)}"
    )
