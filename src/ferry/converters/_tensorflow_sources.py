"""Every TensorFlow source reduced to one thing, for the TensorFlow converter: a Python function of
positional tensors returning ``{output name: tensor}`` (Keras models, tf.functions, concrete
functions), with its inputs named and shaped as asked, example inputs to trace and check it with,
and the reference that runs it eagerly (or in its TF1 session).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ferry.converters._base import (
    ConvertOptions,
    ReferenceFn,
    as_array,
    check_input_options,
    describe_feeds,
    example_items,
    first_line,
    name_examples,
    require_inputs,
    type_modules,
)
from ferry.converters._tensorflow_load import _import_keras
from ferry.errors import ConversionError, ExecutionError, InvalidInputError

__all__: list[str] = []

logger = logging.getLogger(__name__)

# TensorFlow op names: what a placeholder may be called.
_TF_NAME = re.compile(r"[A-Za-z0-9.][A-Za-z0-9_.\-]*")


@dataclasses.dataclass
class _Input:
    """One input of the converted model, as TensorFlow sees it."""

    name: str
    dtype: Any  # tf.DType
    #: Dims, None where open; None for an unknown rank.
    dims: list[int | None] | None


@dataclasses.dataclass
class _Source:
    """A source reduced to a function of positional tensors returning ``{output: tensor}``."""

    label: str
    inputs: list[_Input]
    call: Callable[..., dict[str, Any]]
    #: Keras models are batch-first: the leading open dim of every input is the batch.
    batch_first: bool
    #: The trackable object the function belongs to (Keras model, loaded SavedModel, tf.Module):
    #: tf2onnx reads its lookup tables, and holding it keeps a SavedModel's variables alive.
    owner: Any = None
    #: Set for a SavedModel loaded by the TF1 loader: its graph, run by a session (``call`` then
    #: takes numpy arrays and cannot be traced).
    graph: _GraphSession | None = None


@dataclasses.dataclass
class _GraphSession:
    """One signature of a TF1 graph loaded in a ``tf.compat.v1.Session``."""

    session: Any
    #: The graph tensor fed for each input, in the order of ``_Source.inputs``.
    feeds: list[str]
    #: Output key -> the graph tensor it fetches, in output order.
    fetches: dict[str, str]


def _from_keras(
    model: Any, where: str | None, options: ConvertOptions, notes: list[str]
) -> _Source:
    import tensorflow as tf

    if "keras" in type_modules(model):
        _import_keras()  # refuses a Keras 3 model built on another backend
    model_name = _safe_attr(model, "name")
    what = f"Keras {type(model).__name__}" + (f" {model_name!r}" if model_name else "")
    label = f"{where} ({what})" if where else f"the {what}"
    keys = [k for k, _ in example_items(options.example_inputs) if k is not None]
    keras_inputs = _keras_inputs(model)
    if keras_inputs:
        inputs = [
            _Input(
                _tf_name(_keras_input_name(t), i, len(keras_inputs)),
                tf.as_dtype(_dtype_name(t.dtype)),
                _dims(t.shape),
            )
            for i, t in enumerate(keras_inputs)
        ]
        structure = getattr(model, "input", None) if len(keras_inputs) > 1 else None
        by_name = False
    else:
        # Subclassed models and unbuilt Sequentials know their inputs only once called.
        inputs = _inputs_from_options(options, label, keras=True, notes=notes)
        structure = None
        by_name = bool(keys)
    _unique(inputs, label)
    output_names = [str(n) for n in (_safe_attr(model, "output_names") or [])]
    # A model called with a dict gets the user's own keys, whatever the inputs are named.
    names = keys or [i.name for i in inputs]

    def call(*args: Any) -> dict[str, Any]:
        x = _keras_call_args(tf, args, names, by_name, structure)
        return _name_outputs(tf, model(x, training=False), output_names)

    return _Source(label, inputs, call, batch_first=True, owner=model)


def _keras_call_args(
    tf: Any, args: Sequence[Any], names: Sequence[str], by_name: bool, structure: Any
) -> Any:
    """What the model is called with: one tensor, its input structure, a list or a dict."""
    if by_name:
        return dict(zip(names, args))
    if len(args) == 1:
        return args[0]
    if structure is not None:
        return tf.nest.pack_sequence_as(structure, list(args))
    return list(args)


def _keras_input_name(tensor: Any) -> str | None:
    """The name of the Input layer that made ``tensor``: ``keras.Input(name="image")`` names
    both, but an unnamed Input's tensor is only ``keras_tensor_<n>``, its layer ``input_layer``."""
    history = getattr(tensor, "_keras_history", None)
    layer = getattr(history, "operation", None) or getattr(history, "layer", None)
    name = getattr(layer, "name", None) or getattr(tensor, "name", None)
    return str(name) if name else None


def _keras_inputs(model: Any) -> list[Any]:
    found = _safe_attr(model, "inputs")
    if not found:
        return []
    flat = list(found) if isinstance(found, (list, tuple)) else [found]
    return [t for t in flat if getattr(t, "shape", None) is not None]


def _safe_attr(obj: Any, name: str) -> Any:
    # Keras raises (AttributeError, ValueError) from these properties on models not yet built.
    try:
        return getattr(obj, name, None)
    except Exception:  # any failure just means "not known yet"
        return None


def _from_concrete(fn: Any, label: str) -> _Source:
    """A ConcreteFunction: a SavedModel signature (keyword inputs) or a traced function."""
    args, kwargs = fn.structured_input_signature
    flat_args = list(args)
    if kwargs and not flat_args:
        keys = list(kwargs)
        specs = [kwargs[k] for k in keys]
        inputs = [_input_from_spec(s, k, i, len(keys)) for i, (k, s) in enumerate(zip(keys, specs))]

        def call(*tensors: Any) -> dict[str, Any]:
            import tensorflow as tf

            return _name_outputs(tf, fn(**dict(zip(keys, tensors))), [])

    elif flat_args and not kwargs and all(_is_spec(s) for s in flat_args):
        inputs = [_input_from_spec(s, None, i, len(flat_args)) for i, s in enumerate(flat_args)]

        def call(*tensors: Any) -> dict[str, Any]:
            import tensorflow as tf

            return _name_outputs(tf, fn(*tensors), [])

    else:
        raise ConversionError(
            f"{label} takes nested or mixed inputs {fn.structured_input_signature}; convert a "
            "function of plain tensors (positional or keyword)"
        )
    _unique(inputs, label)
    return _Source(label, inputs, call, batch_first=False)


def _from_function(fn: Any, label: str, options: ConvertOptions) -> _Source:
    """A tf.function: its input_signature, else shapes from the options."""
    signature = getattr(fn, "input_signature", None)
    params = _param_names(fn)
    if signature:
        flat = list(signature)
        if not all(_is_spec(s) for s in flat):
            raise ConversionError(
                f"{label} has a nested input_signature; convert a function of plain tensors"
            )
        inputs = [
            _input_from_spec(s, params[i] if i < len(params) else None, i, len(flat))
            for i, s in enumerate(flat)
        ]
    else:
        inputs = _inputs_from_options(options, label, keras=False, notes=None, params=params)
    _unique(inputs, label)

    def call(*tensors: Any) -> dict[str, Any]:
        import tensorflow as tf

        return _name_outputs(tf, fn(*tensors), [])

    return _Source(label, inputs, call, batch_first=False)


def _param_names(fn: Any) -> list[str]:
    python_function = getattr(fn, "python_function", None)
    if python_function is None:
        return []
    try:
        params = inspect.signature(python_function).parameters.values()
    except (TypeError, ValueError):
        return []
    return [
        p.name
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"
    ]


def _is_spec(obj: Any) -> bool:
    return hasattr(obj, "shape") and hasattr(obj, "dtype") and not hasattr(obj, "numpy")


def _input_from_spec(spec: Any, key: str | None, index: int, count: int) -> _Input:
    name = key or getattr(spec, "name", None)
    return _Input(_tf_name(name, index, count), spec.dtype, _dims(spec.shape))


def _inputs_from_options(
    options: ConvertOptions,
    label: str,
    *,
    keras: bool,
    notes: list[str] | None,
    params: Sequence[str] = (),
) -> list[_Input]:
    """Inputs of a source that does not declare them: from example inputs, else input shapes."""
    import tensorflow as tf

    if options.example_inputs is not None:
        named = example_items(options.example_inputs)
        inputs = []
        for i, (key, value) in enumerate(named):
            arr = as_array(value, key or f"#{i}")
            default = params[i] if i < len(params) else None
            name = _tf_name(key or default, i, len(named))
            dtype = arr.dtype
            if keras and dtype == np.float64:
                # Keras computes in float32 (its default float policy) whatever it is fed.
                dtype = np.dtype(np.float32)
                if notes is not None:
                    notes.append(f"input {name!r}: float64 example fed as float32")
            # The leading dim of an example is a batch of them, not a size to freeze.
            sizes = [int(d) for d in arr.shape]
            dims: list[int | None] = [None, *sizes[1:]] if keras and sizes else [*sizes]
            inputs.append(_Input(name, tf.as_dtype(dtype), dims))
        return inputs
    if options.input_shapes:
        return [
            _Input(_tf_name(str(name), i, len(options.input_shapes)), tf.float32, [None] * len(s))
            for i, (name, s) in enumerate(options.input_shapes.items())
        ]
    raise InvalidInputError(
        f"{label} does not declare its inputs (a subclassed or unbuilt model, or a tf.function "
        "without input_signature): pass example_inputs, or input_shapes such as "
        "{'input': ('batch', 224, 224, 3)} (float32)"
    )


def _dtype_name(dtype: Any) -> Any:
    return getattr(dtype, "name", dtype)


def _dims(shape: Any) -> list[int | None] | None:
    try:
        dims = list(shape)
    except (TypeError, ValueError):  # TensorShape of unknown rank
        return None
    return [None if d is None else int(d) for d in dims]


def _tf_name(name: str | None, index: int, count: int) -> str:
    """A valid TensorFlow placeholder name (the ONNX input name) from a source's input name."""
    if name:
        cleaned = re.sub(r"[^A-Za-z0-9_.\-]", "_", str(name).split(":")[0]).lstrip("_-")
        if _TF_NAME.fullmatch(cleaned):
            return cleaned
    return "input" if count == 1 else f"input_{index}"


def _unique(inputs: list[_Input], label: str) -> None:
    names = [i.name for i in inputs]
    if len(set(names)) != len(names):
        for i, item in enumerate(inputs):
            item.name = f"{item.name}_{i}" if names.count(item.name) > 1 else item.name
        logger.debug("%s: duplicate input names made unique: %s", label, names)


def _name_outputs(tf: Any, result: Any, preferred: Sequence[str]) -> dict[str, Any]:
    """``{name: tensor}`` from whatever the model returned (a tensor, a list, a dict, nested)."""
    if isinstance(result, Mapping) and all(tf.is_tensor(v) for v in result.values()):
        items = [(str(k), v) for k, v in result.items()]
    else:
        flat = tf.nest.flatten(result)
        if len(preferred) == len(flat) and len(set(preferred)) == len(preferred):
            names = list(preferred)
        else:
            names = ["output" if len(flat) == 1 else f"output_{i}" for i in range(len(flat))]
        items = list(zip(names, flat))
    # One tensor returned under two names would come out of the graph once.
    return {name: tf.identity(value) for name, value in items}


def _apply_shapes(
    src: _Source, options: ConvertOptions
) -> tuple[list[_Input], dict[tuple[str, int], str]]:
    """Inputs with ``input_shapes``/``dynamic_axes`` applied, and the dims to name symbolically."""
    inputs = [
        dataclasses.replace(i, dims=None if i.dims is None else list(i.dims)) for i in src.inputs
    ]
    by_name = {i.name: i for i in inputs}
    symbols: dict[tuple[str, int], str] = {}
    check_input_options(options, list(by_name), src.label)
    for name, shape in (options.input_shapes or {}).items():
        item = by_name[name]
        dims = list(shape)
        if item.dims is not None and len(dims) != len(item.dims):
            raise InvalidInputError(
                f"input_shapes[{name!r}] = {tuple(dims)} has rank {len(dims)}, but input {name!r} "
                f"of {src.label} has rank {len(item.dims)} ({_shape_text(item.dims)})"
            )
        new: list[int | None] = []
        for axis, d in enumerate(dims):
            have = None if item.dims is None else item.dims[axis]
            if isinstance(d, str) or d is None:
                # A name opens the dim, as dynamic_axes does; the trace decides if the model can.
                if d:
                    symbols[(name, axis)] = d
                new.append(None)
            else:
                size = int(d)
                if have is not None and have != size:
                    raise InvalidInputError(
                        f"input_shapes[{name!r}] sets dim {axis} to {size}, but {src.label} fixes "
                        f"it at {have} ({_shape_text(item.dims)})"
                    )
                new.append(size if size >= 0 else None)
        item.dims = new
    for name, axes in (options.dynamic_axes or {}).items():
        item = by_name[name]
        for axis, symbol in axes.items():
            if item.dims is None or not 0 <= int(axis) < len(item.dims):
                raise InvalidInputError(
                    f"dynamic_axes[{name!r}] names axis {axis}, but input {name!r} has shape "
                    f"{_shape_text(item.dims)}"
                )
            # Tracing with the dim open is what makes the graph work for any size.
            item.dims[int(axis)] = None
            symbols[(name, int(axis))] = str(symbol)
    return inputs, symbols


def _sample_inputs(
    inputs: list[_Input], options: ConvertOptions, notes: list[str]
) -> dict[str, np.ndarray] | None:
    """The example inputs by input name, in the inputs' dtypes, checked against their shapes."""
    if options.example_inputs is None:
        return None
    names = [i.name for i in inputs]
    examples: Any = options.example_inputs
    items = example_items(examples)
    if items and items[0][0] is not None:
        # A key may spell an input as the source does (``image:0``); the input is named after it.
        examples = {k if k in names else _tf_name(k, 0, 1): v for k, v in items}
    by_name = {i.name: i for i in inputs}
    sample: dict[str, np.ndarray] = {}
    for key, value in name_examples(examples, names).items():
        item = by_name[key]
        arr = as_array(value, key)
        want = np.dtype(item.dtype.as_numpy_dtype)
        if arr.dtype != want:
            if not np.can_cast(arr.dtype, want, casting="same_kind"):
                raise InvalidInputError(
                    f"example input {key!r} has dtype {arr.dtype}; the model takes {want}"
                )
            notes.append(f"example input {key!r}: {arr.dtype} cast to {want}")
            arr = arr.astype(want)
        if item.dims is not None and (
            arr.ndim != len(item.dims)
            or any(d is not None and d != s for d, s in zip(item.dims, arr.shape))
        ):
            raise InvalidInputError(
                f"example input {key!r} has shape {arr.shape}; the model takes "
                f"{_shape_text(item.dims)}"
            )
        sample[key] = arr
    return sample


def _spec(tf: Any, item: _Input) -> Any:
    return tf.TensorSpec(item.dims, item.dtype, name=item.name)


def _describe_inputs(inputs: Sequence[_Input]) -> str:
    return ", ".join(f"{i.name}: {i.dtype.name}{_shape_text(i.dims)}" for i in inputs)


def _shape_text(dims: Sequence[int | None] | None) -> str:
    if dims is None:
        return "[unknown rank]"
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _make_reference(tf: Any, src: _Source, inputs: Sequence[_Input]) -> ReferenceFn:
    names = [i.name for i in inputs]
    dtypes = [i.dtype for i in inputs]

    def reference(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        require_inputs(feeds, names, src.label)
        if src.graph is not None:  # a session: numpy arrays in the graph's dtypes
            args = [np.asarray(feeds[n], dtype=d.as_numpy_dtype) for n, d in zip(names, dtypes)]
        else:
            args = [tf.convert_to_tensor(feeds[n], dtype=d) for n, d in zip(names, dtypes)]
        try:
            result = src.call(*args)
        except Exception as e:  # the source's own failure on these inputs
            raise ExecutionError(
                f"{src.label} failed on inputs {describe_feeds(feeds)}: {type(e).__name__}: "
                f"{first_line(e)}"
            ) from e
        return {k: np.asarray(v) for k, v in result.items()}

    return reference
