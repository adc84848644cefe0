"""Example inputs and dynamic shapes for the PyTorch converter: the example a module is traced
with (given, or made from ``input_shapes``), the dynamic axes asked for and those torch.export made
static, and moving values between NumPy and torch.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from ferry.converters._base import ConvertOptions, check_names, example_items
from ferry.converters._pytorch_export import _import_torch
from ferry.errors import ConversionError, InvalidInputError

if TYPE_CHECKING:
    import onnx_ir as ir

__all__: list[str] = []


def _forward_parameters(module: Any) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):  # builtins without a signature
        return []


def _module_example(
    module: Any, params: list[inspect.Parameter], options: ConvertOptions
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    names = [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    takes_kwargs = any(p.kind == p.VAR_KEYWORD for p in params)
    what = type(module).__name__
    example = options.example_inputs
    if example is None:
        if not options.input_shapes:
            raise InvalidInputError(
                f"converting the {what} module needs example inputs: "
                "torch.export traces forward() with them. Pass example_inputs to ferry.convert "
                f"(a dict by forward() argument name ({', '.join(names)}), a tuple, or one "
                "array; CLI, for a pickled module: --example-input NAME=FILE.npy), or "
                "input_shapes for float32 inputs (CLI: --shape NAME=DIMS)"
            )
        if not takes_kwargs:
            check_names(options.input_shapes, names, "input_shapes", f"{what}.forward()")
        example = {
            n: _random_input(n, shape)
            for n, shape in sorted(
                options.input_shapes.items(),
                key=lambda item: names.index(item[0]) if item[0] in names else len(names),
            )
        }
    items = example_items(example)
    if items and items[0][0] is not None:
        given = {str(n): v for n, v in items}
        if not takes_kwargs:
            check_names(given, names, "example_inputs", f"{what}.forward()")
        ordered = {n: given[n] for n in names if n in given}
        ordered.update({n: v for n, v in given.items() if n not in ordered})
        converted = {n: _to_torch(v) for n, v in ordered.items()}
        try:
            bound = inspect.Signature(params).bind_partial(**converted)
        except TypeError as e:
            raise InvalidInputError(f"example_inputs do not fit forward(): {e}") from e
        # Positional where the signature allows: torch.export names inputs either way.
        return tuple(bound.args), dict(bound.kwargs)
    return tuple(_to_torch(x) for _, x in items), {}


def _bind(
    params: list[inspect.Parameter], args: tuple[Any, ...], kwargs: dict[str, Any], module: Any
) -> dict[str, Any]:
    try:
        return dict(inspect.Signature(params).bind(*args, **kwargs).arguments)
    except TypeError as e:
        raise InvalidInputError(
            f"the example inputs do not fit {type(module).__name__}.forward(): {e}"
        ) from e


def _requested_axes(options: ConvertOptions) -> dict[str, dict[int, str]]:
    """dynamic_axes, plus the str dims of input_shapes (dynamic_axes wins where both name one)."""
    axes: dict[str, dict[int, str]] = {}
    for name, shape in (options.input_shapes or {}).items():
        for axis, dim in enumerate(shape):
            if isinstance(dim, str):
                axes.setdefault(name, {})[axis] = dim
    for name, dims in (options.dynamic_axes or {}).items():
        axes.setdefault(name, {}).update({int(a): str(d) for a, d in dims.items()})
    return axes


def _dynamic_shapes(
    bound: Mapping[str, Any], input_axes: Mapping[str, Mapping[int, str]]
) -> dict[str, Any]:
    """torch.export ``dynamic_shapes`` keyed by forward() parameter, one ``Dim`` per dim name."""
    torch = _import_torch()
    dims: dict[str, Any] = {}

    def dim(name: str) -> Any:
        if name not in dims:
            # Dim names must be identifiers; the ONNX dims are renamed to the requested names.
            ident = re.sub(r"\W", "_", name)
            ident = ident if ident and not ident[0].isdigit() else f"d_{ident}"
            while ident in {str(d.__name__) for d in dims.values()}:
                ident += "_"
            dims[name] = torch.export.Dim(ident)
        return dims[name]

    shapes: dict[str, Any] = {}
    for param, value in bound.items():
        if param not in input_axes:
            shapes[param] = None  # static, whatever the structure
            continue
        if not isinstance(value, torch.Tensor):
            raise InvalidInputError(
                f"dynamic_axes names {param!r}, which is not a tensor input of forward(); "
                "dynamic axes apply to top-level tensor arguments"
            )
        spec: dict[int, Any] = {}
        for axis, name in input_axes[param].items():
            if not -value.dim() <= axis < value.dim():
                raise InvalidInputError(
                    f"dynamic_axes asks for axis {axis} of {param!r}, which has rank {value.dim()}"
                )
            spec[axis % value.dim()] = dim(name)
        shapes[param] = spec
    return shapes


def _repeat_axes(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    params: list[inspect.Parameter],
    axes: list[tuple[str, int]],
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    torch = _import_torch()
    bound = inspect.Signature(params).bind(*args, **kwargs)
    for name, axis in axes:
        value = bound.arguments[name]
        bound.arguments[name] = torch.cat([value, value], dim=axis)
    return tuple(bound.args), dict(bound.kwargs)


def _static_axes(
    model: ir.Model, axes: Mapping[str, Mapping[int, str]]
) -> list[tuple[str, int, int]]:
    """Rename the requested symbolic dims; return ``(value, axis, size)`` of those left static.

    Raises:
        InvalidInputError: a name is neither an input nor an output, or an axis is out of range.
    """
    import onnx_ir as ir

    graph = model.graph
    values = {v.name: v for v in [*graph.inputs, *graph.outputs] if v.name}
    renames: dict[str, str] = {}
    fixed: list[tuple[str, int, int]] = []
    for name, dims in axes.items():
        value = values.get(name)
        if value is None:
            raise InvalidInputError(
                f"dynamic_axes names {name!r}, which is neither an input nor an output of the "
                f"converted model; inputs: {', '.join(v.name or '?' for v in graph.inputs)}; "
                f"outputs: {', '.join(v.name or '?' for v in graph.outputs)}"
            )
        shape = value.shape
        for axis, dim_name in dims.items():
            if shape is None or not -len(shape) <= axis < len(shape):
                raise InvalidInputError(
                    f"dynamic_axes asks for axis {axis} of {name!r}, which has shape {shape}"
                )
            dim = shape[axis]
            if isinstance(dim, int):
                fixed.append((name, axis % len(shape), dim))
            elif dim.value is None:
                dims_list = list(shape.dims)
                dims_list[axis] = ir.SymbolicDim(dim_name)
                value.shape = ir.Shape(dims_list)
            elif dim.value != dim_name:
                renames.setdefault(dim.value, dim_name)
    if renames:
        _rename_dims(model, renames)
    return fixed


def _raise_static(fixed: list[tuple[str, int, int]], what: str) -> NoReturn:
    listed = ", ".join(f"{name}[{axis}] = {size}" for name, axis, size in fixed)
    raise ConversionError(
        f"cannot make {listed} dynamic: {what} fixes those dims (a reshape to a constant size, "
        "a branch on the size, or a program exported with static shapes). Change the code "
        "(e.g. reshape(-1, ...)) or re-export it with dynamic shapes"
    )


def _rename_dims(model: ir.Model, renames: Mapping[str, str]) -> None:
    import onnx_ir as ir

    graph = model.graph
    values: list[ir.Value] = [*graph.inputs, *graph.outputs]
    for node in graph.all_nodes():
        values.extend(node.outputs)

    def renamed(dim: int | ir.SymbolicDim) -> int | ir.SymbolicDim:
        if isinstance(dim, ir.SymbolicDim) and dim.value is not None and dim.value in renames:
            return ir.SymbolicDim(renames[dim.value])
        return dim

    for value in values:
        shape = value.shape
        if shape is not None and any(renamed(d) is not d for d in shape.dims):
            value.shape = ir.Shape([renamed(d) for d in shape.dims])


def _random_input(name: str, shape: Sequence[int | str]) -> np.ndarray:
    """Standard-normal float32 data, seeded by the input's name: inputs of one shape get
    different data, so parity would notice two of them swapped."""
    # A symbolic dim gets 2: torch.export specializes dims it sees at size 0 or 1.
    dims = [2 if isinstance(d, str) else int(d) for d in shape]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return rng.standard_normal(dims).astype(np.float32)


def _to_torch(value: Any) -> Any:
    """numpy arrays (also nested in lists/dicts) -> tensors; tensors and other values as given."""
    torch = _import_torch()
    from torch.utils import _pytree as pytree

    def convert(x: Any) -> Any:
        if isinstance(x, np.ndarray):
            # A copy: forward() may write into its inputs, and read-only arrays make torch warn.
            return torch.from_numpy(np.array(x, copy=True, order="C"))
        if isinstance(x, np.generic):
            return torch.from_numpy(np.array(x))
        return x

    return pytree.tree_map(convert, value)


def _tree_map_tensors(fn: Callable[[Any], Any], tree: Any) -> Any:
    torch = _import_torch()
    from torch.utils import _pytree as pytree

    return pytree.tree_map(lambda x: fn(x) if isinstance(x, torch.Tensor) else x, tree)


def _module_device(module: Any) -> Any:
    torch = _import_torch()
    for tensor in [*module.parameters(), *module.buffers()]:
        return tensor.device
    return torch.device("cpu")


@contextlib.contextmanager
def _eval_mode(module: Any) -> Iterator[None]:
    """Puts every submodule in eval mode (dropout off, batch-norm running stats) and restores
    each one's own flag afterwards: inference graphs are what ferry deploys."""
    modes = [(m, m.training) for m in module.modules()]
    try:
        module.eval()
        yield
    finally:
        for m, training in modes:
            m.training = training
