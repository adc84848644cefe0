"""What the PyTorch converter returns: the exported model with its dims and outputs named (after
the structure ``forward`` returns), the sample inputs, and the reference that runs the source in
torch on feeds named as the ONNX inputs.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ferry.converters._base import (
    Converted,
    ConvertOptions,
    check_names,
    example_items,
    name_examples,
    require_inputs,
)
from ferry.converters._pytorch_export import _detach, _import_torch
from ferry.converters._pytorch_inputs import (
    _raise_static,
    _random_input,
    _rename_dims,
    _static_axes,
    _to_torch,
    _tree_map_tensors,
)

if TYPE_CHECKING:
    import onnx_ir as ir

__all__: list[str] = []


@dataclasses.dataclass
class _Binder:
    """Maps feeds named as the ONNX inputs back to the source's ``(args, kwargs)`` structure.

    Attributes:
        spec: pytree spec of ``(args, kwargs)``.
        leaves: the flattened example (or placeholders); non-tensor leaves are passed as traced.
        slots: positions in ``leaves`` of the ONNX graph inputs, in graph-input order.
        names: the ONNX graph input names.
        has_sample: whether ``leaves`` hold real example tensors.
    """

    spec: Any
    leaves: list[Any]
    slots: list[int]
    names: list[str]
    has_sample: bool

    @classmethod
    def from_example(
        cls, args: tuple[Any, ...], kwargs: dict[str, Any], model: ir.Model
    ) -> _Binder | None:
        torch = _import_torch()
        from torch.utils import _pytree as pytree

        leaves, spec = pytree.tree_flatten((args, kwargs))
        slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        names = [v.name or "" for v in model.graph.inputs]
        if len(slots) != len(names):
            return None
        return cls(spec, leaves, slots, names, has_sample=True)

    @classmethod
    def from_names(
        cls, args: tuple[Any, ...], arg_names: list[str], model: ir.Model
    ) -> _Binder | None:
        """For top-level tensor arguments named ``arg_names``, of which the ONNX graph may keep
        a subset (the rest are passed as in the example)."""
        from torch.utils import _pytree as pytree

        leaves, spec = pytree.tree_flatten((args, {}))
        names = [v.name or "" for v in model.graph.inputs]
        if len(leaves) != len(arg_names) or not set(names) <= set(arg_names):
            return None
        return cls(spec, leaves, [arg_names.index(n) for n in names], names, has_sample=True)

    @classmethod
    def from_program(cls, program: Any, model: ir.Model, options: ConvertOptions) -> _Binder | None:
        _import_torch()
        from torch.export.graph_signature import ConstantArgument, InputKind, TensorArgument

        spec = program.call_spec.in_spec
        user = [s for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
        names = [v.name or "" for v in model.graph.inputs]
        if spec is None or spec.num_leaves != len(user):
            return None
        leaves: list[Any] = []
        slots: list[int] = []
        for i, s in enumerate(user):
            if isinstance(s.arg, TensorArgument):
                slots.append(i)
                leaves.append(None)
            elif isinstance(s.arg, ConstantArgument):
                leaves.append(s.arg.value)
            else:  # SymInt inputs: not feedable from ONNX here
                return None
        if len(slots) != len(names):
            return None
        binder = cls(spec, leaves, slots, names, has_sample=False)
        tensors = _program_example(program, options, names)
        if tensors is not None and len(tensors) == len(slots):
            for slot, tensor in zip(slots, tensors):
                binder.leaves[slot] = tensor
            binder.has_sample = True
        return binder

    def sample(self) -> dict[str, np.ndarray] | None:
        if not self.has_sample:
            return None
        return {n: _to_numpy(self.leaves[s]) for n, s in zip(self.names, self.slots)}

    def bind(self, feeds: Mapping[str, np.ndarray]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        from torch.utils import _pytree as pytree

        require_inputs(feeds, self.names, "the torch reference")
        leaves = list(self.leaves)
        for name, slot in zip(self.names, self.slots):
            leaves[slot] = _to_torch(np.asarray(feeds[name]))
        args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return tuple(args), dict(kwargs)


def _program_example(program: Any, options: ConvertOptions, names: list[str]) -> list[Any] | None:
    """Example tensors for a program's ONNX inputs: the options', else the program's own."""
    torch = _import_torch()
    from torch.utils import _pytree as pytree

    example = options.example_inputs
    if example is None and options.input_shapes:
        check_names(options.input_shapes, names, "input_shapes", "the ExportedProgram")
        if set(options.input_shapes) != set(names):
            return None
        example = {n: _random_input(n, options.input_shapes[n]) for n in names}
    if example is None:
        stored = getattr(program, "example_inputs", None)
        if stored is None:
            return None
        return [x for x in pytree.tree_leaves(stored) if isinstance(x, torch.Tensor)]
    items = example_items(example)
    if items and items[0][0] is not None:
        named = name_examples(example, names, model="the ExportedProgram")
        return [_to_torch(named[n]) for n in names]
    leaves = [x for _, x in items]
    return [x for x in pytree.tree_leaves(_to_torch(leaves)) if isinstance(x, torch.Tensor)]


def _converted(
    model: ir.Model,
    binder: _Binder | None,
    run: Callable[[tuple[Any, ...], dict[str, Any]], Any],
    device: Any,
    notes: list[str],
) -> Converted:
    torch = _import_torch()
    if binder is None:
        notes.append(
            "the ONNX inputs do not map one-to-one onto the tensors of forward()'s arguments; "
            "no torch reference, so parity is not checked"
        )
        return Converted(model=model, notes=notes)

    def reference(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        args, kwargs = binder.bind(feeds)
        args, kwargs = _tree_map_tensors(lambda t: t.to(device), (args, kwargs))
        with torch.no_grad():
            return _flat_outputs(run(args, kwargs))

    return Converted(model=model, reference=reference, sample_inputs=binder.sample(), notes=notes)


def _finish_dynamo_model(
    model: ir.Model, out_spec: Any, axes: Mapping[str, Mapping[int, str]], notes: list[str]
) -> None:
    """Name the outputs, apply the requested dim names (checking they stayed dynamic), and
    detach the weights from torch."""
    from torch.utils import _pytree as pytree

    if out_spec is not None:
        paths = _tree_paths(pytree.tree_unflatten([0] * out_spec.num_leaves, out_spec))
        _rename_outputs(model, _output_names(paths), notes)
    fixed = _static_axes(model, axes)
    if fixed:
        _raise_static(fixed, "the model")
    _name_torch_symbols(model, notes)
    _detach(model)


# torch.export's own names for sizes it traced symbolically: s0, s43 (backed), u0 (unbacked).
_TORCH_SYMBOL = re.compile(r"^[su]\d+$")


def _name_torch_symbols(model: ir.Model, notes: list[str]) -> None:
    """Give the dims torch.export named ``s43`` a name that says where they come from.

    Before -> After::

        x: [s43, 3, s77, s77], y: [s43, 10]  ->  x: [batch, 3, x_dim2, x_dim2], y: [batch, 10]

    An ExportedProgram keeps no trace of the ``Dim("batch")`` names it was exported with, so
    the names are made from the inputs: a symbol only ever seen as a first dim is ``batch``, any
    other ``<input>_dim<axis>`` where it first appears. Names the user gave (``dynamic_axes``,
    ``--shape``) were applied before and are not touched.
    """
    seen: dict[str, list[tuple[str, int]]] = {}
    for value in model.graph.inputs:
        for axis, d in enumerate(value.shape or ()):
            name = getattr(d, "value", None)
            if isinstance(name, str) and _TORCH_SYMBOL.match(name):
                seen.setdefault(name, []).append((value.name or "input", axis))
    batch_like = [sym for sym, places in seen.items() if all(axis == 0 for _, axis in places)]
    renames = {}
    for sym, places in seen.items():
        name, axis = places[0]
        renames[sym] = "batch" if batch_like == [sym] else f"{name}_dim{axis}"
    if renames:
        _rename_dims(model, renames)
        listed = ", ".join(f"{old} -> {new}" for old, new in renames.items())
        notes.append(
            f"torch.export names dynamic dims after its own symbols; renamed {listed} (name them "
            "yourself with dynamic_axes or --shape NAME=batch,3,height,width)"
        )


def _tree_paths(tree: Any) -> list[tuple[Any, ...]]:
    from torch.utils import _pytree as pytree

    return [path for path, _ in pytree.tree_flatten_with_path(tree)[0]]


def _output_names(paths: list[tuple[Any, ...]]) -> list[str]:
    """``output`` for a lone tensor, ``output_0``... for sequences, keys for dicts."""
    if len(paths) == 1 and not paths[0]:
        return ["output"]
    names = []
    for path in paths:
        parts = [_key_str(key) for key in path]
        name = "_".join(parts)
        if not parts or parts[0].isdigit():
            name = "_".join(["output", *parts])
        names.append(name)
    if len(set(names)) != len(names) or any(not n for n in names):
        return [f"output_{i}" for i in range(len(paths))]
    return names


def _key_str(key: Any) -> str:
    for attr in ("key", "idx", "name"):  # MappingKey, SequenceKey, GetAttrKey
        if hasattr(key, attr):
            return re.sub(r"\s+", "_", str(getattr(key, attr)))
    return re.sub(r"\W+", "_", str(key)).strip("_")


def _rename_outputs(model: ir.Model, names: list[str], notes: list[str]) -> None:
    graph = model.graph
    if len(names) != len(graph.outputs):
        notes.append(
            f"forward() returns {len(names)} tensors but the ONNX model has "
            f"{len(graph.outputs)} outputs; kept the exporter's output names"
        )
        return
    taken = {v.name for v in graph.inputs} | set(graph.initializers)
    for node in graph.all_nodes():
        taken.update(v.name for v in node.outputs)
    seen: set[int] = set()
    for value, name in zip(graph.outputs, names):
        if value.name == name:
            seen.add(id(value))
            continue
        # A value that is also a graph input/initializer, or returned twice, keeps its name.
        if name in taken or id(value) in seen or value.is_graph_input() or value.is_initializer():
            notes.append(f"kept output name {value.name!r} (could not rename it to {name!r})")
        else:
            taken.discard(value.name)
            value.name = name
            taken.add(name)
        seen.add(id(value))


def _flat_outputs(out: Any) -> list[np.ndarray]:
    from torch.utils import _pytree as pytree

    return [_to_numpy(leaf) for leaf in pytree.tree_leaves(out)]


def _to_numpy(value: Any) -> np.ndarray:
    torch = _import_torch()
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().resolve_conj().resolve_neg()
        if tensor.dtype == torch.bfloat16:
            import ml_dtypes

            return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return tensor.numpy().copy()
    return np.asarray(value)
