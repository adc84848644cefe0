"""Fixing a model's input shapes, so that shape inference works every other shape out from them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx_ir as ir

from ferry.errors import InvalidInputError
from ferry.graph._dims import shape_of

__all__ = ["with_input_shapes"]


def with_input_shapes(
    model: ir.Model,
    shapes: Mapping[str, Sequence[int]],
    *,
    in_place: bool = False,
    keep_output_shapes: bool = False,
    option: str = "shapes",
) -> ir.Model:
    """``model`` with the named inputs fixed to concrete ``shapes`` and the shapes of the values
    computed from them cleared, so that shape inference works them out again.

    Before -> After::

        input x: [N, 3, H, W], node outputs: shapes in N, H, W
            -> input x: [1, 3, 224, 224], node outputs: no shape declared

    Args:
        model: the model.
        shapes: sizes by input name (inputs not named keep their shapes).
        in_place: change ``model`` itself (a pass fixing shapes for good); by default a copy is
            changed, which shares the weights.
        keep_output_shapes: keep the graph outputs' declared shapes (a model handed back to the
            user); by default they are cleared too, for inference to find.
        option: how the caller's user named the shapes (``--fix-shapes``), for the messages.

    Returns:
        The model with those shapes (``model`` itself with ``in_place``).

    Raises:
        InvalidInputError: a name is not an input of the model, a size is not positive, or a
            shape has another rank than the input's or another size where the input's is fixed.
    """
    fixed = {name: tuple(int(d) for d in dims) for name, dims in shapes.items()}
    _check(model, fixed, option)
    if not in_place:
        try:
            model = model.clone()
        except (
            RuntimeError
        ):  # onnx_ir clones only sorted graphs; a proto round trip takes any order
            model = ir.from_proto(ir.to_proto(model))
    inputs = {value.name: value for value in model.graph.inputs}
    for name, dims in fixed.items():
        inputs[name].shape = ir.Shape(list(dims))
    # Shapes inferred from the symbolic sizes are stale now; inference fills them again.
    for node in model.graph:
        for output in node.outputs:
            if not (keep_output_shapes and output.is_graph_output()):
                output.shape = None
    return model


def _check(model: ir.Model, shapes: Mapping[str, tuple[int, ...]], option: str) -> None:
    inputs = {value.name: value for value in model.graph.inputs}
    unknown = sorted(set(shapes) - set(inputs))
    if unknown:
        raise InvalidInputError(
            f"{option} names {', '.join(map(repr, unknown))}, not an input of the model; "
            f"its inputs are {', '.join(repr(n) for n in inputs)}"
        )
    for name, dims in shapes.items():
        if any(d < 1 for d in dims):
            raise InvalidInputError(f"{option} {name}: sizes must be positive, got {dims}")
        declared = shape_of(inputs[name])
        if declared is None:
            continue
        given = f"{option} {name}={'x'.join(map(str, dims))}"
        if len(declared) != len(dims):
            raise InvalidInputError(
                f"{given} does not fit its declared shape {list(declared)}: it has rank "
                f"{len(dims)}, but the input has rank {len(declared)}"
            )
        for axis, (have, want) in enumerate(zip(declared, dims, strict=True)):
            if isinstance(have, int) and have != want:
                raise InvalidInputError(
                    f"{given} does not fit its declared shape {list(declared)}: dim {axis} is "
                    f"fixed at {have} in the model, not {want}"
                )
