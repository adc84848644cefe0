"""``ferry.convert``: any supported source -> checked ONNX in the unified graph, with a parity report."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from ferry.converters._base import Converted, ConvertOptions
from ferry.converters._onnx import convert_onnx
from ferry.converters._registry import resolve_converter
from ferry.errors import ConversionError, FerryError, InvalidInputError
from ferry.parity import ParityReport, compare_outputs
from ferry.runtime import found_inputs, load, random_feeds

__all__ = ["ConversionResult", "ParityError", "convert"]

logger = logging.getLogger(__name__)


class ParityError(ConversionError):
    """The converted model does not compute what the source does."""

    def __init__(self, report: ParityReport) -> None:
        super().__init__(
            f"{report.summary()}. The converted model was not written; if the difference is "
            "expected (reduced precision), loosen it with --tolerance ATOL[,RTOL]"
        )
        self.report = report


@dataclasses.dataclass
class ConversionResult:
    """A converted model and the evidence that it computes what its source did.

    Attributes:
        model: the model in the unified graph (checked by ONNX's checker).
        parity: how its outputs compared with the source framework's (``parity.skipped`` says why
            no comparison was made, e.g. ``verify=False``).
        converter: the converter used (``"pytorch"``, ``"tflite"``...).
        source: what was converted, for reports.
        notes: what the converter wants the user to know.
    """

    model: ir.Model
    parity: ParityReport
    converter: str
    source: str
    notes: list[str] = dataclasses.field(default_factory=list)

    def save(self, path: str | os.PathLike[str], *, external_data: bool | None = None) -> Path:
        """Write the model as ONNX, atomically."""
        from ferry.graph import save_model

        return save_model(self.model, path, external_data=external_data)


def convert(
    source: Any,
    *,
    example_inputs: Mapping[str, Any] | Sequence[Any] | Any | None = None,
    input_shapes: Mapping[str, Sequence[int | str]] | None = None,
    dynamic_axes: Mapping[str, Mapping[int, str]] | None = None,
    opset: int | None = None,
    verify: bool = True,
    tolerance: tuple[float, float] | None = None,
    from_: str | None = None,
    trust_pickle: bool = False,
) -> ConversionResult:
    """Convert a model from any supported framework into the unified graph and verify it.

    Args:
        source: a path (``.onnx``, ``.pt2``/``.pt``, SavedModel folder, ``.keras``/``.h5``,
            ``.tflite``, ``.pdmodel``/``.json``, ``.pkl``/``.joblib``) or an in-memory model
            (``torch.nn.Module``, ``ExportedProgram``, Keras model, ``paddle.nn.Layer``,
            scikit-learn estimator, ``onnx.ModelProto``, ``onnx_ir.Model``).
        example_inputs: inputs to trace with (PyTorch needs them) and to verify with: a dict by
            input name, a tuple in positional order, or one array (``ConvertOptions``).
        input_shapes: shapes for inputs the source leaves open; str dims stay symbolic.
        dynamic_axes: dims to make symbolic, ``{"input": {0: "batch"}}``.
        opset: the ONNX opset wanted (None: the converter's default).
        verify: run the source and the converted model on the same inputs and compare.
        tolerance: (atol, rtol) for the comparison; None picks one per output dtype.
        from_: force a converter instead of detecting one (``"pytorch"``, ``"tflite"``...).
        trust_pickle: allow loading pickled files, which can run arbitrary code.

    Returns:
        A ConversionResult; ``result.save("model.onnx")`` writes it.

    Raises:
        UnsupportedOpError: the source uses ops the converter cannot translate (all are listed).
        ParityError: the converted model's outputs differ from the source's beyond the tolerance.
        BackendUnavailableError: the source framework is not installed.
    """
    converter, source = resolve_converter(source, from_)
    options = ConvertOptions(
        example_inputs=example_inputs,
        input_shapes=input_shapes,
        dynamic_axes=dynamic_axes,
        opset=opset,
        trust_pickle=trust_pickle,
    )
    logger.info("converting %s with the %s converter", _describe(source), converter.name)
    converted = converter.convert(source, options)
    model = convert_onnx(converted.model, opset=opset)
    if not verify:
        parity = ParityReport(skipped="verification was turned off")
    elif converted.reference is None:
        reason = next((n for n in converted.notes if "reference" in n.lower()), None)
        parity = ParityReport(
            skipped=reason or f"the {converter.name} converter cannot run the source here"
        )
    else:
        parity = _check_parity(model, converted, options, tolerance)
        if not parity.passed:
            raise ParityError(parity)
    return ConversionResult(
        model=model,
        parity=parity,
        converter=converter.name,
        source=_describe(source),
        notes=list(converted.notes),
    )


def _check_parity(
    model: ir.Model,
    converted: Converted,
    options: ConvertOptions,
    tolerance: tuple[float, float] | None,
) -> ParityReport:
    try:
        session = load(model)
    except FerryError as e:
        raise ConversionError(
            f"onnxruntime cannot run the converted model, so it cannot be verified: {e} "
            "(pass verify=False / --no-verify to write it anyway)"
        ) from e
    feeds = _verify_inputs(session, converted, options)
    got = session.run(feeds)
    assert converted.reference is not None
    try:
        want = converted.reference(dict(feeds))
    except FerryError:
        raise
    except Exception as e:  # the source framework's own failure on these inputs
        raise ConversionError(
            f"the source model failed on the verification inputs ({type(e).__name__}: {e}); "
            "pass example inputs it accepts (--example-input NAME=FILE.npy)"
        ) from e
    report = compare_outputs(
        got, _aligned(list(got), want), inputs=feeds, tolerance=tolerance or converted.tolerance
    )
    logger.info("%s", report.summary())
    return report


def _verify_inputs(
    session: Any, converted: Converted, options: ConvertOptions
) -> dict[str, np.ndarray]:
    # Converters name the example inputs for their model (``sample_inputs``); without them
    # the inputs are found (sizes that run, ids within their tables), at the shapes the user
    # gave; random ones, should none be found, so that the failure is the comparison's.
    if converted.sample_inputs is not None:
        return dict(converted.sample_inputs)
    names = {s.name for s in session.inputs}
    shapes = {
        name: tuple(d if isinstance(d, int) else 1 for d in dims)
        for name, dims in (options.input_shapes or {}).items()
        if name in names
    }
    try:
        found = found_inputs(session, shapes)
    except InvalidInputError as e:
        logger.info("no verification inputs found to run the model (%s); random ones", e)
        return random_feeds(session.inputs, shapes, seed=0)
    logger.info("verification inputs: %s", found.how)
    return found.feeds


def _aligned(
    names: list[str], reference: Mapping[str, np.ndarray] | Sequence[np.ndarray]
) -> Mapping[str, np.ndarray] | Sequence[np.ndarray]:
    """The source's outputs, checked to pair with the converted model's ``names``.

    Raises:
        ConversionError: they cannot be paired: other names and another count.
    """
    if isinstance(reference, Mapping):
        if all(n in reference for n in names) or len(reference) == len(names):
            return reference  # by name, or (other names, same count) in order
        raise ConversionError(
            f"the source gives outputs {sorted(reference)} but the converted model gives "
            f"{names}; the converter mapped them wrongly (a bug: please report it)"
        )
    if len(reference) != len(names):
        raise ConversionError(
            f"the source gives {len(reference)} outputs but the converted model gives "
            f"{len(names)} ({', '.join(names)})"
        )
    return reference


def _describe(source: object) -> str:
    if isinstance(source, Path):
        return str(source)
    return f"{type(source).__module__}.{type(source).__qualname__} object"
