"""Valid inputs, found not guessed: the one place every verb gets inputs for a model the user
gave none for.

Sizes come from the user's shapes first, then what the artifact remembers, then candidates the
graph suggests (downsampling strides, text lines, sequences), each tried on ONNX Runtime CPU in
turn until one runs; integer inputs stay within the tables they index (``_found_graph``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from ferry.backends import FALLBACK
from ferry.errors import InvalidInputError
from ferry.runtime._cache import model_digest, remember_inputs, remembered_inputs
from ferry.runtime._feeds import concrete_shape
from ferry.runtime._found_graph import (
    DimKey,
    InputRole,
    input_roles,
    scale_values,
    size_candidates,
)
from ferry.runtime._session import Session
from ferry.runtime._specs import TensorSpec, spec_of

__all__ = ["PROBE_BUDGET_S", "FoundInputs", "clear_found", "found_inputs", "make_feeds"]

logger = logging.getLogger(__name__)

#: Seconds probing may take for one model (the first candidate always runs to the end).
PROBE_BUDGET_S = float(os.environ.get("FERRY_PROBE_BUDGET_S", "5"))

_FOUND: dict[tuple[Any, ...], FoundInputs] = {}
_KEEP = 32
_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class FoundInputs:
    """Inputs that run the model (checked by running it on ONNX Runtime CPU).

    Attributes:
        feeds: one array per input the model needs.
        shapes: each input's shape.
        how: one line for reports: what was found and how, e.g.
            ``"x 1x3x48x320 (height 48: a text line); token_type_ids zeros (token types)"``.
        checked: whether ONNX Runtime ran them (False when it cannot load the model at all).
    """

    feeds: dict[str, np.ndarray]
    shapes: dict[str, tuple[int, ...]]
    how: str
    checked: bool = True


def found_inputs(
    model: ir.Model | str | os.PathLike[str] | Session,
    shapes: Mapping[str, Sequence[int]] | None = None,
    *,
    given: Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
) -> FoundInputs:
    """Inputs the model runs on, for a model the user gave no (or only some) inputs for.

    Args:
        model: an ``onnx_ir`` model, a path (file or artifact folder) or a ferry Session.
        shapes: sizes the user gave (``--shape``), kept as they are.
        given: arrays the user gave (``--input``), kept as they are; their shapes fix the named
            dims they share with other inputs.
        seed: for the random values.

    Returns:
        The inputs, their shapes and a line saying how they were found. Results are cached per
        model content in this process, and remembered in the artifact's ``ferry.json``.

    Raises:
        InvalidInputError: nothing tried runs; the message names the dims and the ``--shape``
            that fixes it.
    """
    ir_model, file = _resolve(model)
    specs = _required_specs(ir_model)
    pinned_shapes = {k: tuple(int(d) for d in v) for k, v in (shapes or {}).items()}
    given = dict(given or {})
    unknown = (set(pinned_shapes) | set(given)) - {s.name for s in specs}
    if unknown:
        raise InvalidInputError(
            f"--shape/--input names unknown input {', '.join(map(repr, sorted(unknown)))}; the "
            f"model takes {', '.join(repr(s.name) for s in specs)}"
        )
    key = (
        model_digest(ir_model),
        tuple(sorted(pinned_shapes.items())),
        tuple(sorted((k, v.shape, str(v.dtype)) for k, v in given.items())),
        seed,
    )
    with _LOCK:
        cached = _FOUND.get(key)
    if cached is not None:
        feeds = {k: v.copy() for k, v in cached.feeds.items()}
        feeds.update(given)
        return dataclasses.replace(cached, feeds=feeds)
    reuse = model if isinstance(model, Session) and _plain_onnxruntime(model) else None
    found = _find(ir_model, file, specs, pinned_shapes, given, seed, reuse)
    with _LOCK:
        _FOUND[key] = found
        while len(_FOUND) > _KEEP:  # a long-lived server loads many models: keep the latest
            _FOUND.pop(next(iter(_FOUND)))
    if file is not None and found.checked and not given:
        remember_inputs(file, found.shapes, found.how)
    return found


def make_feeds(
    specs: Sequence[TensorSpec],
    roles: Mapping[str, InputRole],
    shapes: Mapping[str, tuple[int, ...]],
    *,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Arrays for ``specs`` at ``shapes``, each made as its role says."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in specs:
        feeds[spec.name] = _array(spec, roles.get(spec.name), shapes[spec.name], shapes, rng)
    return feeds


def _resolve(model: ir.Model | str | os.PathLike[str] | Session) -> tuple[ir.Model, Path | None]:
    if isinstance(model, Session):
        return model.model, None
    if isinstance(model, ir.Model):
        return model, None
    from ferry.graph import load_model, resolve_model_file

    file = resolve_model_file(model)
    return load_model(file), file


def _required_specs(model: ir.Model) -> list[TensorSpec]:
    from ferry.graph import graph_inputs

    return [spec_of(v) for v in graph_inputs(model)]


def _find(
    model: ir.Model,
    file: Path | None,
    specs: list[TensorSpec],
    shapes: dict[str, tuple[int, ...]],
    given: dict[str, np.ndarray],
    seed: int,
    session: Session | None = None,
) -> FoundInputs:
    roles = input_roles(model, specs)
    fixed: dict[DimKey, int] = {}
    pinned = {**shapes, **{k: tuple(v.shape) for k, v in given.items()}}
    for spec in specs:
        if spec.name in pinned:
            # Checks the rank and fixed dims, and records the named dims it fixes.
            sizes: dict[str, int] = {}
            concrete_shape(spec, pinned[spec.name], sizes=sizes)
            fixed.update(sizes)
            for axis, d in enumerate(spec.shape or ()):
                if d is None:
                    fixed[(spec.name, axis)] = pinned[spec.name][axis]
    candidates, reasons = size_candidates(model, specs, fixed)
    remembered = remembered_inputs(file) if file is not None else None
    if remembered:
        candidates.insert(0, {**_dims_of(specs, remembered), **fixed})
        reasons = {k: "remembered in ferry.json" for k in reasons}
    runner = _Runner(model, file, session)
    tried: list[str] = []
    last_error = ""
    start = time.perf_counter()
    for index, choice in enumerate(candidates):
        if index and time.perf_counter() - start > PROBE_BUDGET_S:
            break
        at = {s.name: pinned.get(s.name) or _shape(s, choice) for s in specs}
        feeds = make_feeds(specs, roles, at, seed=seed)
        feeds.update(given)
        error = runner.run(feeds)
        if error is None:
            how = _how(specs, roles, at, choice, reasons, pinned, checked=runner.loaded)
            if tried:
                how += f" (after {len(tried)} size{'s' if len(tried) > 1 else ''} that did not run)"
            logger.debug("found inputs in %.2fs: %s", time.perf_counter() - start, how)
            return FoundInputs(feeds, at, how, checked=runner.loaded)
        tried.append(_describe(at, specs, pinned))
        last_error = error
    raise InvalidInputError(_refusal(specs, pinned, tried, last_error))


def _dims_of(
    specs: Sequence[TensorSpec], remembered: Mapping[str, Sequence[int]]
) -> dict[DimKey, int]:
    out: dict[DimKey, int] = {}
    for spec in specs:
        shape = remembered.get(spec.name)
        if spec.shape is None or shape is None or len(shape) != len(spec.shape):
            continue
        for axis, d in enumerate(spec.shape):
            if not isinstance(d, int):
                out[d if isinstance(d, str) else (spec.name, axis)] = int(shape[axis])
    return out


def _shape(spec: TensorSpec, choice: Mapping[DimKey, int]) -> tuple[int, ...]:
    if spec.shape is None:
        raise InvalidInputError(
            f"input {spec.name!r} has unknown rank; give its shape, e.g. --shape {spec.name}=1,3,224,224"
        )
    out = []
    for axis, d in enumerate(spec.shape):
        if isinstance(d, int):
            out.append(d)
        else:
            out.append(choice.get(d if isinstance(d, str) else (spec.name, axis), 1))
    return tuple(out)


def _array(
    spec: TensorSpec,
    role: InputRole | None,
    shape: tuple[int, ...],
    shapes: Mapping[str, tuple[int, ...]],
    rng: np.random.Generator,
) -> np.ndarray:
    from ferry.runtime._feeds import random_array

    dtype = spec.dtype
    if role is None or dtype is None or role.kind == "random":
        return random_array(spec, shape, rng)
    if role.kind == "ones":
        return np.ones(shape, dtype=dtype)
    if role.kind == "zeros":
        return np.zeros(shape, dtype=dtype)
    if role.kind == "scales":
        return scale_values(role, shape).astype(dtype)
    if role.kind == "positions":
        last = shape[-1] if shape else 1
        line = np.arange(last) % max(role.high, 1)
        return np.broadcast_to(line, shape).astype(dtype).copy()
    if role.kind == "lengths":
        return np.full(shape, _sequence_length(spec, shapes), dtype=dtype)
    high = max(1, role.high)
    if dtype.kind == "u" or np.iinfo(dtype).max >= high - 1:
        return rng.integers(0, high, size=shape).astype(dtype)
    return rng.integers(0, int(np.iinfo(dtype).max) + 1, size=shape).astype(dtype)


def _sequence_length(spec: TensorSpec, shapes: Mapping[str, tuple[int, ...]]) -> int:
    """A lengths input's value: the last dim of the first other input of rank 2 or more."""
    for name, shape in shapes.items():
        if name != spec.name and len(shape) >= 2:
            return int(shape[-1]) if len(shape) == 2 else int(shape[1])
    return 1


class _Runner:
    """One ONNX Runtime CPU session for the probes; ``loaded`` is False when ORT cannot load the
    model (then every probe 'runs': nothing can check it here)."""

    def __init__(self, model: ir.Model, file: Path | None, session: Session | None) -> None:
        self.session: Any = None
        self.loaded = False
        self.why = ""
        if session is not None:
            # The caller's own ONNX Runtime session: no second one to build.
            self.session, self.loaded = _SessionCall(session), True
            return
        try:
            import onnxruntime as ort

            from ferry.backends._base import model_source
            from ferry.backends._onnxruntime import ORT_SILENT

            so = ort.SessionOptions()
            so.log_severity_level = ORT_SILENT
            # Probes run once each: basic optimizations load fastest.
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
            with model_source(model, file) as (data, path):
                source = data if data is not None else str(path)
                self.session = ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])
            self.loaded = True
        except Exception as e:  # ORT raises its own types from C++; any means "cannot check"
            self.why = str(e).splitlines()[0] if str(e) else type(e).__name__
            logger.debug(
                "found inputs: ONNX Runtime cannot load the model, unchecked: %s", self.why
            )

    def run(self, feeds: Mapping[str, np.ndarray]) -> str | None:
        """None when ``feeds`` run; else ORT's error in one line."""
        if self.session is None:
            return None
        try:
            self.session.run(None, dict(feeds))
        except Exception as e:  # every ORT failure is a candidate that does not run
            from ferry.backends._onnxruntime import ort_error_message

            return ort_error_message(e)
        return None


def _plain_onnxruntime(session: Session) -> bool:
    """Whether ``session`` is the whole model on ONNX Runtime (the probes may run on it)."""
    partitions = session.plan.partitions
    return len(partitions) == 1 and partitions[0].backend == FALLBACK


class _SessionCall:
    """A ferry Session called as an InferenceSession is (``run(None, feeds)``)."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def run(self, _names: Any, feeds: dict[str, np.ndarray]) -> Any:
        # Session's own run, on its ONNX Runtime engine: a live session's override would make
        # each probed size a bucket to learn (they are made up, not calls it serves).
        return Session.run(self._session, feeds)


def _describe(
    at: Mapping[str, tuple[int, ...]], specs: Sequence[TensorSpec], pinned: Mapping[str, Any]
) -> str:
    open_specs = [
        s
        for s in specs
        if s.name not in pinned and s.shape and not all(isinstance(d, int) for d in s.shape)
    ]
    return (
        ", ".join(f"{s.name} {'x'.join(map(str, at[s.name]))}" for s in open_specs) or "as declared"
    )


def _how(
    specs: Sequence[TensorSpec],
    roles: Mapping[str, InputRole],
    at: Mapping[str, tuple[int, ...]],
    choice: Mapping[DimKey, int],
    reasons: Mapping[DimKey, str],
    pinned: Mapping[str, Any],
    *,
    checked: bool,
) -> str:
    parts = []
    for spec in specs:
        text = f"{spec.name} {'x'.join(map(str, at[spec.name])) or 'scalar'}"
        notes = []
        if spec.name in pinned:
            notes.append("given")
        elif spec.shape is not None:
            for axis, d in enumerate(spec.shape):
                key = d if isinstance(d, str) else (spec.name, axis)
                why = reasons.get(key) if not isinstance(d, int) else None
                if why and why != "batch 1" and why not in notes:
                    notes.append(why)
        role = roles.get(spec.name)
        if role is not None and role.why and spec.dtype is not None and spec.dtype.kind != "f":
            notes.append(role.why)
        elif role is not None and role.kind == "scales":
            notes.append(f"{role.why} {list(role.values)}")
        parts.append(text + (f" ({'; '.join(notes)})" if notes else ""))
    line = "; ".join(parts)
    return line if checked else line + " (not run: ONNX Runtime cannot load the model)"


def _refusal(
    specs: Sequence[TensorSpec], pinned: Mapping[str, Any], tried: list[str], error: str
) -> str:
    open_specs = [s for s in specs if s.name not in pinned and s.shape is not None]
    if not open_specs:
        given = ", ".join(f"{k} {'x'.join(map(str, v))}" for k, v in _pinned_shapes(pinned).items())
        return (
            f"the model does not run at the sizes given ({given or 'as declared'}): {error}; "
            "check them against what the model was exported for"
        )
    dims = "; ".join(f"{s.name} {s.describe()}" for s in open_specs) or "the inputs"
    example = open_specs[0] if open_specs else (specs[0] if specs else None)
    fix = ""
    if example is not None and example.shape is not None:
        sizes = ",".join(
            str(d) if isinstance(d, int) else "1" if axis == 0 else _letter(example.shape, axis)
            for axis, d in enumerate(example.shape)
        )
        opened = [
            _letter(example.shape, axis)
            for axis, d in enumerate(example.shape)
            if not isinstance(d, int) and axis
        ]
        fix = (
            f"; give them with --shape {example.name}={sizes} ({', '.join(opened) or 'the dims'} "
            f"replaced by sizes) or --input {example.name}=FILE.npy"
        )
    shown = ", ".join(tried[:4]) + (", ..." if len(tried) > 4 else "")
    return f"could not find inputs that run {dims} (tried {shown}: last error {error}){fix}"


def _pinned_shapes(pinned: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v) for k, v in pinned.items()}


def _letter(shape: tuple[Any, ...], axis: int) -> str:
    """What to call an open dim in an example: H or W for an image's sides, else its name."""
    if len(shape) == 4:
        return "NCHW"[axis]
    return str(shape[axis]) if isinstance(shape[axis], str) else f"D{axis}"


def clear_found() -> None:
    """Forget the inputs found in this process (tests)."""
    with _LOCK:
        _FOUND.clear()
