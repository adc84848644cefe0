"""ONNX Runtime's mobile usability check: would NNAPI or CoreML pay for this model?

Before -> After::

    model file (.onnx)
        -> UsabilityReport: per mobile execution provider (NNAPI, CoreML NeuralNetwork, CoreML
           MLProgram) its verdict, partitions and unsupported ops, as the model is and as if its
           input shapes were fixed; and the checker's analysis as text (``usability.txt``)

The checks are ``onnxruntime.tools.mobile_helpers.usability_checker``'s, run as
``check_onnx_model_mobile_usability`` runs them, on the model optimized at the basic level, their
log captured as text. The check is advice: when it fails, the report says why and the export
goes on.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import onnx

from ferry.backends import ort_error_message

__all__ = ["EpUsability", "UsabilityReport", "check_usability", "usability_text"]

logger = logging.getLogger(__name__)

_CPU = ["CPUExecutionProvider"]
#: The execution providers ONNX Runtime's usability checker rates, with its op-list files.
_USABILITY_EPS = (
    ("NNAPI", None),
    ("CoreML NeuralNetwork", "coreml_supported_neuralnetwork_ops.md"),
    ("CoreML MLProgram", "coreml_supported_mlprogram_ops.md"),
)


@dataclasses.dataclass(frozen=True)
class EpUsability:
    """How well one mobile execution provider would take the model, as ONNX Runtime estimates it.

    Attributes:
        ep: ``NNAPI``, ``CoreML NeuralNetwork`` or ``CoreML MLProgram``.
        suitability: ONNX Runtime's verdict on the model as it is: ``YES``, ``MAYBE`` or ``NO``.
        partitions / supported_nodes / nodes: the partitions the EP would get and the nodes in them.
        unsupported_ops: ``domain:op`` of the ops the EP lacks.
        dynamic_shape_nodes: nodes refused only because an input has a dynamic shape.
        caveats: per-op limits the checker cannot check (``ai.onnx:Conv:Only 2D Conv...``).
        with_fixed_shapes: the verdict if the input shapes were made fixed; None when not asked
            (no dynamic input, or already ``YES``).
    """

    ep: str
    suitability: str
    partitions: int
    supported_nodes: int
    nodes: int
    unsupported_ops: tuple[str, ...] = ()
    dynamic_shape_nodes: int = 0
    caveats: tuple[str, ...] = ()
    with_fixed_shapes: str | None = None

    @property
    def best(self) -> str:
        """The better of the two verdicts, as ONNX Runtime's checker reports it."""
        order = ("NO", "MAYBE", "YES")
        verdicts = [self.suitability, self.with_fixed_shapes or "NO"]
        return max(verdicts, key=order.index)

    def describe(self) -> str:
        """``NNAPI: NO (1 partition, 2/104 nodes; with fixed input shapes: MAYBE)``."""
        plural = "" if self.partitions == 1 else "s"
        text = (
            f"{self.ep}: {self.suitability} ({self.partitions} partition{plural}, "
            f"{self.supported_nodes}/{self.nodes} nodes"
        )
        if self.with_fixed_shapes is not None:
            text += f"; with fixed input shapes: {self.with_fixed_shapes}"
        return text + ")"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["unsupported_ops"] = list(self.unsupported_ops)
        d["caveats"] = list(self.caveats)
        return d


@dataclasses.dataclass(frozen=True)
class UsabilityReport:
    """ONNX Runtime's mobile usability check of the model (its ``check_onnx_model_mobile_usability``).

    Attributes:
        eps: one verdict per mobile execution provider.
        dynamic_inputs: inputs whose shape is not fixed (NNAPI needs fixed shapes).
        dynamic_values: how many values in the model have a dynamic shape.
        text: the checker's analysis, line by line, as its script would log it.
        skipped: why the check could not run (the export goes on without it).
    """

    eps: tuple[EpUsability, ...] = ()
    dynamic_inputs: tuple[str, ...] = ()
    dynamic_values: int = 0
    text: tuple[str, ...] = ()
    skipped: str | None = None

    @property
    def try_mobile_eps(self) -> bool:
        """ONNX Runtime's advice: NNAPI or CoreML may pay, so time them against the CPU EP."""
        return any(ep.best != "NO" for ep in self.eps)

    def summary(self) -> str:
        """One line: each EP's verdict and the advice."""
        if self.skipped is not None:
            return f"mobile usability not checked: {self.skipped}"
        verdicts = "; ".join(ep.describe() for ep in self.eps)
        if any(ep.suitability != "NO" for ep in self.eps):
            advice = "NNAPI/CoreML may pay: time them against the CPU EP on the device"
        elif self.try_mobile_eps:
            advice = (
                "NNAPI/CoreML may pay once the input shapes are fixed (`ferry optimize "
                "--fix-shapes`, then export again); as it is, use the CPU EP"
            )
        else:
            advice = "use the CPU EP"
        return f"{verdicts}. {advice}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "eps": [ep.to_dict() for ep in self.eps],
            "dynamic_inputs": list(self.dynamic_inputs),
            "dynamic_values": self.dynamic_values,
            "try_mobile_eps": self.try_mobile_eps,
            "skipped": self.skipped,
        }


class _Capture(logging.Handler):
    """Keeps the records ORT's checker logs as lines, away from the terminal."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.extend(record.getMessage().splitlines())


def check_usability(source: Path, scratch: Path, basic_options: Any) -> UsabilityReport:
    """ONNX Runtime's mobile usability check of the model file ``source``, as data and text.

    As ``check_onnx_model_mobile_usability`` does: optimize at the basic level (what the ORT format
    conversion does first), infer shapes, then estimate the partitions NNAPI and CoreML would
    take, as the model is and as if its input shapes were fixed. A model the checker cannot
    analyse gives a report that says why; the export goes on.

    Args:
        source: the model file.
        scratch: a folder for the optimized model.
        basic_options: fresh ``onnxruntime.SessionOptions`` that optimize at the basic level as
            the conversion does; the check sets where the optimized model goes.
    """
    import onnxruntime as ort
    from onnxruntime.tools.mobile_helpers import usability_checker as checker

    capture = _Capture()
    # A logger outside logging's registry: no parent to propagate to, and nothing (an app's
    # logging setup, a test runner) can attach handlers to it; its records reach only `capture`.
    log = logging.Logger(f"{__name__}.usability", logging.INFO)
    log.addHandler(capture)
    try:
        basic = scratch / "usability" / "model.onnx"
        basic.parent.mkdir(exist_ok=True)
        so = basic_options
        so.optimized_model_filepath = str(basic)
        so.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", "external_data.pb"
        )
        ort.InferenceSession(str(source), so, providers=_CPU)
        proto = onnx.load(str(basic))
        try:
            proto = onnx.shape_inference.infer_shapes(proto, strict_mode=True)
        except Exception as e:  # strict inference refuses some exports; lenient still helps
            log.info("Strict shape inference failed (%s); using lenient inference.", e)
            proto = onnx.shape_inference.infer_shapes(proto, strict_mode=False)
        dynamic, dynamic_values = checker.check_shapes(proto.graph, log)
        eps = tuple(
            _check_ep(checker, proto, ep, ops, bool(dynamic), log) for ep, ops in _USABILITY_EPS
        )
    except Exception as e:  # the checker is advice: its failure must not cost the export
        logger.info("mobile usability check failed", exc_info=True)
        return UsabilityReport(text=tuple(capture.lines), skipped=ort_error_message(e))
    return UsabilityReport(
        eps=eps,
        dynamic_inputs=tuple(i.name for i in dynamic),
        dynamic_values=int(dynamic_values),
        text=tuple(capture.lines),
    )


def _check_ep(
    checker: Any, proto: onnx.ModelProto, ep: str, ops_file: str | None, dynamic: bool, log: Any
) -> EpUsability:
    def partitions(fixed: bool) -> Any:
        if ops_file is None:
            return checker.check_nnapi_partitions(proto, require_fixed_input_sizes=fixed)
        return checker.check_coreml_partitions(proto, fixed, ops_file)

    log.info("Checking %s", ep)
    info = partitions(True)
    info.print_analysis(log, ep)
    suitability = info.suitability().name
    log.info("Model should perform well with %s as is: %s", ep, suitability)
    fixed = None
    if suitability != "YES" and dynamic:
        log.info("Partition information if the model was updated to make the shapes fixed:")
        fixed_info = partitions(False)
        fixed_info.print_analysis(log, ep)
        fixed = fixed_info.suitability().name
        log.info(
            "Model should perform well with %s if modified to have fixed input shapes: %s",
            ep,
            fixed,
        )
    log.info("================")
    return EpUsability(
        ep=ep,
        suitability=suitability,
        partitions=int(info.num_partitions),
        supported_nodes=int(info.num_supported_nodes),
        nodes=int(info.num_nodes),
        unsupported_ops=tuple(sorted(info.unsupported_ops)),
        dynamic_shape_nodes=int(info.nodes_unsupported_due_to_dynamic_input),
        caveats=tuple(info.supported_ops_checker.get_caveats()),
        with_fixed_shapes=fixed,
    )


def usability_text(report: UsabilityReport) -> str:
    """``usability.txt``: the verdicts and advice, then the checker's analysis as it logged it."""
    import onnxruntime as ort

    head = [
        f"ONNX Runtime {ort.__version__} mobile usability check (NNAPI, CoreML), as "
        "onnxruntime.tools.check_onnx_model_mobile_usability reports it.",
        "",
        report.summary(),
        "",
    ]
    return "\n".join([*head, *report.text]) + "\n"
