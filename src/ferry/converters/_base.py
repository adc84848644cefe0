"""What every converter is: the options it takes, what it returns, and the protocol it implements.

A converter turns one source format into the unified graph and, so that the result can be checked,
hands back a ``reference`` function that runs the *source* framework on the same inputs. The
registry (``_registry``) picks the converter; ``ferry.convert`` runs it, brings the result to the
requested opset, checks it, and compares it against the reference (``ferry.parity``).

Every converter reads ``example_inputs`` through :func:`example_items` (or :func:`name_examples`,
when it knows its inputs' names), so they mean one thing for every source, and a wrong name or count
is reported in one way.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ferry.backends._base import native_stderr_to_log
from ferry.errors import InvalidInputError, list_ops

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = [
    "DEFAULT_BATCH",
    "ConvertOptions",
    "Converted",
    "Converter",
    "ReferenceFn",
    "as_array",
    "check_input_options",
    "check_names",
    "describe_feeds",
    "example_items",
    "exporter_opset",
    "first_line",
    "list_ops",
    "name_examples",
    "native_stderr_to_log",
    "require_inputs",
    "strip_colors",
    "type_modules",
]

#: The name converters give the leading open dim of an input (the batch).
DEFAULT_BATCH = "batch"

#: Runs the source model on inputs named as the converted model's inputs; returns outputs named as
#: the converted model's outputs (or a list in the converted model's output order).
ReferenceFn = Callable[[dict[str, np.ndarray]], "dict[str, np.ndarray] | Sequence[np.ndarray]"]


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
    """What the user told ``ferry.convert`` about the source.

    Attributes:
        example_inputs: inputs to trace/verify with: a dict by input name, a tuple (or a list of
            arrays) in positional order, or a single array (nested lists of numbers or strings are
            one array); see :func:`example_items`. Converters that trace (PyTorch, a Paddle
            Layer, a Keras model that does not declare its inputs) need them; all use them for the
            parity check when given.
        input_shapes: shapes for inputs whose dims the source leaves open, by input name; a dim may
            be a str to make it symbolic (``{"input": ("batch", 3, 224, 224)}``).
        dynamic_axes: symbolic dims to give the converted model, ``{"input": {0: "batch"}}``.
        opset: the default-domain opset wanted (None: the converter's default).
        trust_pickle: allow loading pickled files (torch.load, joblib), which can run code.
    """

    example_inputs: Mapping[str, Any] | Sequence[Any] | Any | None = None
    input_shapes: Mapping[str, Sequence[int | str]] | None = None
    dynamic_axes: Mapping[str, Mapping[int, str]] | None = None
    opset: int | None = None
    trust_pickle: bool = False


@dataclasses.dataclass
class Converted:
    """A converter's result.

    Attributes:
        model: the converted model.
        reference: runs the source framework (None when the source cannot be run here).
        sample_inputs: inputs the parity check should use (e.g. the example inputs, already named
            for the converted model); None lets ``ferry.convert`` generate them from the specs.
        tolerance: (atol, rtol) this conversion is expected to meet, when the source computes in
            a way ONNX Runtime cannot match bit for bit (e.g. quantized kernels); None: by dtype.
        notes: things the user should know (an op mapped approximately, a dim made static, ...).
    """

    model: ir.Model
    reference: ReferenceFn | None = None
    sample_inputs: dict[str, np.ndarray] | None = None
    tolerance: tuple[float, float] | None = None
    notes: list[str] = dataclasses.field(default_factory=list)


class Converter(Protocol):
    """One source format. Modules import their framework lazily, inside ``convert``."""

    #: Short name used by ``--from`` (``"pytorch"``, ``"tflite"``...).
    name: str
    #: The pip extra that installs what it needs: ``pip install 'ferry[<extra>]'``.
    extra: str
    #: File suffixes it reads, lower case with the dot (``(".tflite",)``).
    suffixes: tuple[str, ...]

    def sniff(self, path: Path) -> bool:
        """Whether ``path`` (a file or folder) looks like this format: magic bytes, folder layout."""
        ...

    def accepts(self, obj: object) -> bool:
        """Whether ``obj`` is an in-memory model of this framework; must not import the framework
        (use :func:`type_modules`)."""
        ...

    def convert(self, source: Path | object, options: ConvertOptions) -> Converted:
        """Convert; raise FerryError subclasses (UnsupportedOpError listing every op) on failure."""
        ...


def type_modules(obj: object) -> set[str]:
    """Top-level packages defining ``obj``'s class and its bases: a user's ``nn.Module`` subclass
    gives ``{"__main__", "torch"}``. Lets ``accepts`` recognise objects without importing anything."""
    return {cls.__module__.split(".")[0] for cls in type(obj).__mro__}


# ------------------------------------------------------------------------------ example inputs


def example_items(examples: Any) -> list[tuple[str | None, Any]]:
    """``example_inputs`` as ``(name, value)`` pairs, in the order given.

    A dict gives its keys as the names. A tuple gives its items in positional order (names None),
    and so does a list, unless it holds only numbers or strings at every depth: that list is one
    array written as lists (``[[0.5, 1.0]]``, rows of strings). Anything else (an array, a
    tensor, a DataFrame) is the one input. None gives no items.
    """
    if examples is None:
        return []
    if isinstance(examples, Mapping):
        return [(str(k), v) for k, v in examples.items()]
    if isinstance(examples, tuple) or (isinstance(examples, list) and not _literal_array(examples)):
        return [(None, v) for v in examples]
    return [(None, examples)]


def _literal_array(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_literal_array(v) for v in value)
    return isinstance(value, (int, float, complex, str, bytes, np.generic))


def name_examples(
    examples: Any, names: Sequence[str], *, model: str = "the model", leading: bool = False
) -> dict[str, Any]:
    """The example inputs by input name, in the order of ``names`` (values as given).

    Args:
        examples: ``example_inputs`` as the user gave them (see :func:`example_items`).
        names: the inputs, in positional order.
        model: what takes the inputs, for messages.
        leading: the inputs may be given for the first few of ``names`` only (the others have
            defaults), by position or by name; otherwise every input must be given.

    Raises:
        InvalidInputError: a name that is not an input, an input left out, or another count.
    """
    items = example_items(examples)
    if items and items[0][0] is not None:
        given = {str(k): v for k, v in items}
        check_names(given, names, "example_inputs", model)
        wanted = list(names[: len(given)] if leading else names)
        missing = [n for n in wanted if n not in given]
        if missing:
            order = " (its inputs are positional: name the first ones)" if leading else ""
            raise InvalidInputError(
                f"example_inputs lacks {', '.join(map(repr, missing))}, which {model} needs"
                f"{order}; its inputs are: {', '.join(names)}"
            )
        return {n: given[n] for n in names if n in given}
    if len(items) > len(names) or (len(items) < len(names) and not leading):
        raise InvalidInputError(
            f"{len(items)} example inputs given, but {model} takes {len(names)}; its inputs "
            f"are: {', '.join(names) or '(none)'}"
        )
    return {name: value for name, (_, value) in zip(names, items)}


def check_names(given: Iterable[str], names: Sequence[str], option: str, model: str) -> None:
    """Raise unless every name in ``given`` (the keys of ``option``) is one of ``names``.

    Raises:
        InvalidInputError: naming the unknown ones and the inputs there are.
    """
    unknown = [str(n) for n in given if n not in names]
    if unknown:
        raise InvalidInputError(
            f"{option} names {', '.join(map(repr, unknown))}, which {model} does not take; its "
            f"inputs are: {', '.join(names) or '(none)'}"
        )


def check_input_options(
    options: ConvertOptions, names: Sequence[str], model: str = "the model"
) -> None:
    """Raise unless ``input_shapes`` and ``dynamic_axes`` name only inputs in ``names``."""
    check_names(options.input_shapes or {}, names, "input_shapes", model)
    check_names(options.dynamic_axes or {}, names, "dynamic_axes", model)


def as_array(value: Any, name: str) -> np.ndarray:
    """Example input ``name`` as a numpy array (a framework's tensor through its ``numpy()``).

    Raises:
        InvalidInputError: the value is not array-like.
    """
    try:
        if not isinstance(value, np.ndarray) and callable(getattr(value, "numpy", None)):
            value = value.numpy()  # a paddle, TensorFlow or torch tensor
        return np.asarray(value)
    except Exception as e:  # ragged lists, objects numpy cannot hold, the tensor's own refusal
        raise InvalidInputError(
            f"example input {name!r} ({type(value).__name__}) is not an array: {first_line(e)}"
        ) from e


def require_inputs(feeds: Mapping[str, Any], names: Sequence[str], what: str) -> None:
    """Raise unless ``feeds`` hold every input in ``names`` (a reference's own check).

    Raises:
        InvalidInputError: naming the missing inputs.
    """
    missing = [n for n in names if n not in feeds]
    if missing:
        raise InvalidInputError(
            f"missing input(s) {', '.join(map(repr, missing))}: {what} takes {', '.join(names)}"
        )


# ------------------------------------------------------------------------------------ opsets


def exporter_opset(
    requested: int,
    notes: list[str],
    *,
    exporter: str,
    oldest: int | None = None,
    newest: int | None = None,
) -> int:
    """The opset to have an exporter write for ``requested``: the nearest it writes.

    ``ferry.convert`` converts its result to ``requested`` afterwards; a note says so when they
    differ.
    """
    if newest is not None and requested > newest:
        notes.append(
            f"{exporter} writes opsets up to {newest}: exported at {newest}, then converted to "
            f"{requested}"
        )
        return newest
    if oldest is not None and requested < oldest:
        notes.append(
            f"{exporter} writes opset {oldest} or newer: exported at {oldest}, then converted to "
            f"{requested}"
        )
        return oldest
    return requested


# ---------------------------------------------------------------------------------- messages

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strip_colors(text: str) -> str:
    """``text`` without terminal colour codes (exporters colour their messages and logs)."""
    return _ANSI.sub("", text)


def first_line(error: object, *, limit: int = 500) -> str:
    """The first non-empty line of an error's message, without terminal colours and shortened to
    ``limit`` characters: frameworks put tracebacks and graph dumps after it. The error's type name
    when it has no message."""
    lines = [line.strip() for line in strip_colors(str(error)).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    text = lines[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_feeds(feeds: Mapping[str, Any]) -> str:
    """``name: dtype[shape]`` for each input, for messages about a run that failed."""
    return ", ".join(f"{k}: {np.asarray(v).dtype}{list(np.shape(v))}" for k, v in feeds.items())
