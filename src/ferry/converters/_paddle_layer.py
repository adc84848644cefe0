"""A ``paddle.nn.Layer`` in this process, for the Paddle converter: importing Paddle, the inputs a
layer is traced with (its example, ``input_shapes`` or its ``forward`` parameters), eval mode while
tracing, and the reference that runs the layer itself.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ferry.converters._base import (
    DEFAULT_BATCH,
    ConvertOptions,
    ReferenceFn,
    as_array,
    check_input_options,
    describe_feeds,
    example_items,
    first_line,
    name_examples,
    require_inputs,
)
from ferry.converters._paddle_fixups import _by_output_name, _shape_text
from ferry.errors import BackendUnavailableError, ExecutionError, InvalidInputError

__all__: list[str] = []


def _import_paddle() -> Any:
    try:
        import paddle
    except ImportError as e:
        raise BackendUnavailableError(
            f"converting a paddle.nn.Layer needs paddlepaddle in this Python ({e}); "
            "pip install 'ferry[paddle]'"
        ) from e
    return paddle


def _layer_inputs(
    layer: Any, options: ConvertOptions, label: str
) -> tuple[list[str], list[str], list[list[int | None]], dict[str, np.ndarray] | None]:
    """Input names (forward's parameters), dtypes, InputSpec shapes and the examples by name."""
    params = _forward_params(layer)
    given = options.example_inputs
    examples: dict[str, np.ndarray] | None = None
    if given is not None:
        items = example_items(given)
        # forward(*args) has no names to give: the extra inputs are numbered.
        extra = [] if items and items[0][0] is not None else range(len(params), len(items))
        named = name_examples(
            given, [*params, *(f"input_{i}" for i in extra)], model=f"{label}.forward", leading=True
        )
        names = list(named)
        examples = {n: as_array(v, n) for n, v in named.items()}
    elif options.input_shapes:
        keys = list(options.input_shapes)
        names = [p for p in params if p in keys] + [k for k in keys if k not in params]
    else:
        raise InvalidInputError(
            f"converting {label} needs example_inputs (or input_shapes) to trace it with"
        )
    check_input_options(options, names, label)

    dtypes: list[str] = []
    shapes: list[list[int | None]] = []
    for name in names:
        arr = None if examples is None else examples[name]
        dtypes.append("float32" if arr is None else arr.dtype.name)
        given_shape = (options.input_shapes or {}).get(name)
        if given_shape is not None:
            shape = [d if isinstance(d, int) and d >= 0 else None for d in given_shape]
            if arr is not None and (
                arr.ndim != len(shape)
                or any(d is not None and d != s for d, s in zip(shape, arr.shape))
            ):
                raise InvalidInputError(
                    f"example input {name!r} has shape {arr.shape}, but input_shapes gives "
                    f"{tuple(given_shape)}"
                )
        elif arr is None:
            raise InvalidInputError(f"no example input and no input_shapes for {name!r}")
        else:
            shape = list(arr.shape)
            # Batch-first by default: tracing with the leading dim open keeps it symbolic.
            if name not in (options.dynamic_axes or {}) and arr.ndim >= 2:
                shape[0] = None
        for axis in (options.dynamic_axes or {}).get(name, {}):
            if not 0 <= int(axis) < len(shape):
                raise InvalidInputError(
                    f"dynamic_axes[{name!r}] names axis {axis}, but input {name!r} has rank "
                    f"{len(shape)}"
                )
            shape[int(axis)] = None
        shapes.append(shape)
    return names, dtypes, shapes, examples


def _symbolic_shapes(
    names: Sequence[str], shapes: Sequence[Sequence[int | None]], options: ConvertOptions
) -> dict[str, list[int | str]]:
    """The Layer's InputSpec shapes as input_shapes for the converted model (str: symbolic)."""
    out: dict[str, list[int | str]] = {}
    for name, shape in zip(names, shapes):
        given = (options.input_shapes or {}).get(name)
        axes = (options.dynamic_axes or {}).get(name, {})
        dims: list[int | str] = []
        for axis, d in enumerate(shape):
            if d is not None and d >= 0:
                dims.append(d)
            elif axis in axes:
                dims.append(str(axes[axis]))
            elif given is not None and isinstance(given[axis], str):
                dims.append(str(given[axis]))
            else:
                dims.append(DEFAULT_BATCH if axis == 0 else f"{name}_{axis}")
        out[name] = dims
    return out


def _forward_params(layer: Any) -> list[str]:
    try:
        signature = inspect.signature(layer.forward)
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in signature.parameters.values() if p.kind in kinds]


class _eval_mode:
    """Puts a Layer in eval mode for the block and restores training mode after it."""

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.was_training = bool(getattr(layer, "training", False))

    def __enter__(self) -> None:
        self.layer.eval()

    def __exit__(self, *exc: object) -> None:
        if self.was_training:
            self.layer.train()


def _layer_reference(
    paddle: Any, layer: Any, names: Sequence[str], model: Any, label: str
) -> ReferenceFn:
    output_names = [v.name for v in model.graph.outputs]

    def reference(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        require_inputs(feeds, names, label)
        try:
            with _eval_mode(layer), paddle.no_grad():
                result = layer(*[paddle.to_tensor(np.asarray(feeds[n])) for n in names])
        except Exception as e:  # the layer's own failure on these inputs
            raise ExecutionError(
                f"{label} failed on inputs {describe_feeds(feeds)}: {type(e).__name__}: {_short(e)}"
            ) from e
        return _by_output_name(_flatten(result), output_names, label)

    return reference


def _flatten(result: Any) -> list[np.ndarray]:
    """A Layer's outputs in the order paddle.jit.save fetches them: nested lists/tuples/dicts."""
    if isinstance(result, (list, tuple)):
        return [a for item in result for a in _flatten(item)]
    if isinstance(result, Mapping):
        return [a for item in result.values() for a in _flatten(item)]
    return [np.asarray(result.numpy() if hasattr(result, "numpy") else result)]


def _spec_text(
    names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int | None]]
) -> str:
    return ", ".join(f"{n}: {d}{_shape_text(list(s))}" for n, d, s in zip(names, dtypes, shapes))


def _short(e: BaseException) -> str:
    # Paddle's C++ errors read "(InvalidArgument) what happened" after a traceback dump.
    for line in str(e).splitlines():
        line = line.strip()
        if line.startswith("(") or re.match(r"^\w+Error: ", line):
            return first_line(line)
    return first_line(e)
