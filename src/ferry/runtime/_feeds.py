"""Making model inputs: parse ``--shape``/``--input`` arguments, read ``.npy`` files, make random data."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ferry.errors import InvalidInputError
from ferry.runtime._specs import TensorSpec

__all__ = ["concrete_shape", "load_npy", "parse_dims", "parse_shape", "random_feeds"]


def parse_shape(text: str) -> tuple[int, ...]:
    """``"1x3x224x224"`` (or ``"1,3,224,224"``) -> ``(1, 3, 224, 224)``; ``""`` is a scalar."""
    parts = [p for p in text.replace(",", "x").split("x")] if text.strip() else []
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise InvalidInputError(
            f"bad shape {text!r}: write dims as integers joined by 'x', e.g. 1x3x224x224"
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


def concrete_shape(spec: TensorSpec, given: Sequence[int] | None = None) -> tuple[int, ...]:
    """A shape to feed ``spec``: ``given`` if any (checked against fixed dims), else symbolic dims as 1."""
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
        return given
    if spec.shape is None:
        raise InvalidInputError(
            f"input {spec.name!r} has unknown rank; give its shape, e.g. --shape {spec.name}=1x3x224x224"
        )
    return tuple(d if isinstance(d, int) else 1 for d in spec.shape)


def random_feeds(
    specs: Sequence[TensorSpec],
    shapes: Mapping[str, Sequence[int]] | None = None,
    *,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Random inputs that fit ``specs``: standard normal floats, small non-negative ints, coin-flip bools.

    Integers stay in [0, 10) because integer inputs are usually indices or token ids.
    """
    shapes = dict(shapes or {})
    unknown = set(shapes) - {s.name for s in specs}
    if unknown:
        raise InvalidInputError(
            f"--shape names unknown input {', '.join(map(repr, sorted(unknown)))}; the model takes "
            f"{', '.join(repr(s.name) for s in specs)}"
        )
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        shape = concrete_shape(spec, shapes.get(spec.name))
        feeds[spec.name] = _random_array(spec, shape, rng)
    return feeds


def _random_array(spec: TensorSpec, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
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
