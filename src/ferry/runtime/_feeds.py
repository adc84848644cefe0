"""Making model inputs: parse ``--shape``/``--input`` arguments, read ``.npy`` files, make random data."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ferry.errors import InvalidInputError
from ferry.runtime._specs import TensorSpec

__all__ = [
    "GUESSED_SIZE",
    "concrete_shape",
    "guessed_dims",
    "load_npy",
    "parse_dims",
    "parse_shape",
    "random_array",
    "random_feeds",
]

#: The size generated inputs get for a symbolic dim past the first: big enough for image models
#: (a multiple of 32, as detectors' strides want) and sequence models to run; the first dim (the
#: batch, as a rule) gets 1.
GUESSED_SIZE = 224


def parse_shape(text: str) -> tuple[int, ...]:
    """``"1,3,224,224"`` -> ``(1, 3, 224, 224)``; ``""`` is a scalar. ``x`` also separates dims
    (``1x3x224x224``), as older ferry wrote it."""
    parts = [p for p in text.replace(",", "x").split("x")] if text.strip() else []
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise InvalidInputError(
            f"bad shape {text!r}: write dims as integers separated by commas, e.g. 1,3,224,224"
        ) from None
    if any(d < 0 for d in dims):
        raise InvalidInputError(f"bad shape {text!r}: dims cannot be negative")
    return dims


def parse_dims(text: str) -> tuple[int | str, ...]:
    """Like :func:`parse_shape`, but a dim may be a name that stays symbolic: ``"batch,3,224,224"``.

    Use commas when a name contains an ``x``.
    """
    parts = text.split(",") if "," in text else text.split("x")
    dims: list[int | str] = []
    for part in (p.strip() for p in parts if text.strip()):
        if part.lstrip("-").isdigit():
            if int(part) < 0:
                raise InvalidInputError(f"bad shape {text!r}: dims cannot be negative")
            dims.append(int(part))
        elif part.isidentifier():
            dims.append(part)
        else:
            raise InvalidInputError(
                f"bad shape {text!r}: each dim is an integer or a name, e.g. batch,3,224,224"
            )
    return tuple(dims)


def concrete_shape(
    spec: TensorSpec,
    given: Sequence[int] | None = None,
    *,
    sizes: dict[str, int] | None = None,
) -> tuple[int, ...]:
    """A shape to feed ``spec``: ``given`` if any (checked against fixed dims), else a guess.

    The guess keeps fixed dims, sets a symbolic first dim (the batch, as a rule) to 1 and any
    other symbolic dim to :data:`GUESSED_SIZE`. A named dim takes the size it already has in
    ``sizes`` (which records the guesses), so dims that share a name stay equal across inputs.
    """
    if given is not None:
        given = tuple(given)
        if spec.shape is not None:
            if len(given) != len(spec.shape):
                raise InvalidInputError(
                    f"shape {list(given)} for input {spec.name!r} has {len(given)} dims; "
                    f"the model wants {len(spec.shape)}: {spec.describe()}"
                )
            for axis, (want, got) in enumerate(zip(spec.shape, given)):
                if isinstance(want, int) and want != got:
                    raise InvalidInputError(
                        f"shape {list(given)} for input {spec.name!r}: dim {axis} is fixed at {want}"
                    )
                if isinstance(want, str) and sizes is not None:
                    sizes.setdefault(want, got)
        return given
    if spec.shape is None:
        raise InvalidInputError(
            f"input {spec.name!r} has unknown rank; give its shape, e.g. --shape {spec.name}=1,3,224,224"
        )
    known = sizes if sizes is not None else {}
    shape = []
    for axis, d in enumerate(spec.shape):
        if isinstance(d, int):
            shape.append(d)
            continue
        guess = 1 if axis == 0 else GUESSED_SIZE
        shape.append(known.setdefault(d, guess) if isinstance(d, str) else guess)
    return tuple(shape)


def guessed_dims(specs: Sequence[TensorSpec], shapes: Mapping[str, Sequence[int]] | None) -> str:
    """Which dims :func:`random_feeds` guessed for ``specs`` (those without a given shape), in
    words for an error message: ``"x dims 2, 3 (set to 224, 224)"``; empty when none were."""
    sizes: dict[str, int] = {}
    parts = []
    for spec in specs:
        if (shapes and spec.name in shapes) or spec.shape is None:
            continue
        shape = concrete_shape(spec, sizes=sizes)
        axes = [i for i, d in enumerate(spec.shape) if not isinstance(d, int)]
        if axes:
            where = ", ".join(str(i) for i in axes)
            got = ", ".join(str(shape[i]) for i in axes)
            parts.append(f"{spec.name} dim{'s' if len(axes) > 1 else ''} {where} (set to {got})")
    return "; ".join(parts)


def random_feeds(
    specs: Sequence[TensorSpec],
    shapes: Mapping[str, Sequence[int]] | None = None,
    *,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Random inputs that fit ``specs``: standard normal floats, small non-negative ints, coin-flip bools.

    Shapes are ``shapes[name]`` where given, else :func:`concrete_shape`'s guess (symbolic first
    dim 1, other symbolic dims :data:`GUESSED_SIZE`, shared names equal). Integers stay in
    [0, 10): for a model at hand, use :func:`ferry.runtime.found_inputs` instead (each input made
    as the graph uses it: ids within the table they index, masks ones, lengths the sequence's;
    sizes checked to run).
    """
    shapes = dict(shapes or {})
    unknown = set(shapes) - {s.name for s in specs}
    if unknown:
        raise InvalidInputError(
            f"--shape names unknown input {', '.join(map(repr, sorted(unknown)))}; the model takes "
            f"{', '.join(repr(s.name) for s in specs)}"
        )
    rng = np.random.default_rng(seed)
    sizes: dict[str, int] = {}
    # Given shapes first, so that a named dim they fix is what the guesses follow.
    ordered = sorted(specs, key=lambda s: s.name not in shapes)
    arrays = {}
    at = {}
    for spec in ordered:
        at[spec.name] = concrete_shape(spec, shapes.get(spec.name), sizes=sizes)
        arrays[spec.name] = random_array(spec, at[spec.name], rng)
    return {spec.name: arrays[spec.name] for spec in specs}


def random_array(spec: TensorSpec, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random data for ``spec`` at ``shape``: standard normal floats, ints in [0, 10), coin-flip
    bools, a few strings."""
    dtype = spec.dtype
    if spec.onnx_type == "STRING":
        return rng.choice(np.array(["a", "b", "c"], dtype=object), size=shape)
    if dtype is None:
        raise InvalidInputError(
            f"input {spec.name!r} has a type ({spec.onnx_type}) ferry cannot generate data for; "
            "pass it with --input NAME=FILE.npy"
        )
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(0, 10, size=shape).astype(dtype)
    if dtype.kind == "f" or dtype.name == "bfloat16":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    raise InvalidInputError(
        f"cannot generate random data for input {spec.name!r} of type {dtype}; pass it with --input"
    )


def load_npy(path: str | os.PathLike[str], name: str) -> np.ndarray[Any, Any]:
    """Read one input from a ``.npy`` file, refusing pickles (a file could run code)."""
    p = Path(path)
    if not p.is_file():
        raise InvalidInputError(f"input file for {name!r} not found: {p}")
    try:
        arr = np.load(p, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise InvalidInputError(
            f"cannot read input {name!r} from {p}: {e}; save arrays with numpy.save(path, array)"
        ) from e
    if not isinstance(arr, np.ndarray):
        raise InvalidInputError(
            f"{p} holds several arrays (.npz); pass one .npy file per input (--input {name}=FILE.npy)"
        )
    return arr
