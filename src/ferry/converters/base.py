"""What every converter is: the options it takes, what it returns, and the protocol it implements.

A converter turns one source format into the unified graph and, so that the result can be checked,
hands back a ``reference`` function that runs the *source* framework on the same inputs. The
registry (``ferry.converters.registry``) picks the converter; ``ferry.convert`` runs it, brings the
result to the requested opset, checks it, and compares it against the reference (``parity``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = ["ConvertOptions", "Converted", "Converter", "ReferenceFn", "type_modules"]

#: Runs the source model on inputs named as the converted model's inputs; returns outputs named as
#: the converted model's outputs (or a list in the converted model's output order).
ReferenceFn = Callable[[dict[str, np.ndarray]], "dict[str, np.ndarray] | Sequence[np.ndarray]"]


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
    """What the user told ``ferry.convert`` about the source.

    Attributes:
        example_inputs: inputs to trace/verify with: a dict by name, a tuple in positional order,
            or a single array. Converters that trace (PyTorch) need them; others use them for the
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
