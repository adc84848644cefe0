"""torch and its two ONNX exporters, for the PyTorch converter: importing torch, calling the
torch.export-based and the TorchScript exporter quietly, turning their failures into ferry's errors
(every unsupported op listed), and making the exported model independent of torch's tensors.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import re
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from ferry.converters._base import exporter_opset, first_line, list_ops, strip_colors
from ferry.errors import BackendUnavailableError, ConversionError, UnsupportedOpError

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = ["detach_from_torch", "silence_exporter_logs"]

logger = logging.getLogger(__name__)

#: Loggers that chatter during export about things users cannot act on: torch's "torchvision is
#: not installed. Skipping torchvision::nms" warnings, and INFO lines from the onnxscript optimizer
#: and onnx_ir passes that the exporter runs (visible whenever an app logs at INFO).
_NOISY_LOGGERS = (
    "torch.onnx",
    "torch.export",
    "torch._export",
    "torch.fx.experimental",
    "onnxscript",
    "onnx_ir",
)
#: The oldest opset torch's torch.export-based exporter builds (its torchlib); lower ones are
#: reached by ferry.convert's version conversion afterwards.
_DYNAMO_MIN_OPSET = 18
#: What torch.onnx.export builds when no opset is asked for.
_DYNAMO_DEFAULT_OPSET = 20
#: The opsets torch's TorchScript exporter builds natively.
_TORCHSCRIPT_OPSETS = range(7, 21)
_TORCHSCRIPT_DEFAULT_OPSET = 20


@contextlib.contextmanager
def _quiet_torchscript_log() -> Iterator[None]:
    """Keeps the TorchScript exporter from dumping its IR graph to stderr when it fails.

    Its ``setup_onnx_logging`` tests the *function* ``_jit_is_onnx_log_enabled`` for truth, so it
    always enables the C++ log (and never disables it again); replacing that context manager with
    a no-op and restoring the flag afterwards keeps the log as the caller had it.
    """
    torch = _import_torch()
    was_enabled = torch._C._jit_is_onnx_log_enabled()
    utils: Any = None
    with contextlib.suppress(ImportError):
        utils = importlib.import_module("torch.onnx._internal.torchscript_exporter.utils")
    original = getattr(utils, "setup_onnx_logging", None)
    if original is not None:
        utils.setup_onnx_logging = lambda verbose: contextlib.nullcontext()
    try:
        yield
    finally:
        if original is not None:
            utils.setup_onnx_logging = original
        torch._C._jit_set_onnx_log_enabled(was_enabled)


def _torchscript_export(script: Any, args: tuple[Any, ...], **export: Any) -> ir.Model:
    import onnx_ir as ir

    torch = _import_torch()
    # A file rather than a buffer: models past 2 GB are written with external data.
    with tempfile.TemporaryDirectory(prefix="ferry-torchscript-") as tmp:
        path = Path(tmp) / "model.onnx"
        with _quiet_exporter(), _quiet_torchscript_log():
            torch.onnx.export(script, args, str(path), dynamo=False, verbose=False, **export)
        model = ir.load(path)
        _detach(model)  # reads any external data before the folder goes
    return model


def _torchscript_unsupported(
    script: Any, args: tuple[Any, ...], export: dict[str, Any], error: Exception
) -> list[tuple[str, str]]:
    """Every op the TorchScript exporter has no symbolic for (it stops at the first).

    Exporting again with ``ONNX_FALLTHROUGH`` keeps untranslatable ops as nodes in their own
    domain; those without a registered symbolic are the unsupported ones (others in a foreign
    domain only fell through because their inputs came from an unsupported op).
    """
    torch = _import_torch()
    found: list[tuple[str, str]] = []
    try:
        registry = importlib.import_module(
            "torch.onnx._internal.torchscript_exporter.registration"
        ).registry
        model = _torchscript_export(
            script,
            args,
            **export,
            operator_export_type=torch.onnx.OperatorExportTypes.ONNX_FALLTHROUGH,
        )
        for node in model.graph.all_nodes():
            if node.domain in ("", "ai.onnx"):
                continue
            namespace = "aten" if node.domain == "org.pytorch.aten" else node.domain
            kind = f"{namespace}::{node.op_type}"
            if not registry.is_registered_op(kind, export["opset_version"]):
                found.append((kind, node.name or "?"))
    except Exception:  # the analysis is best effort: the error below still names one op
        logger.debug("TorchScript unsupported-op analysis failed", exc_info=True)
    named = re.search(r"operator '([\w:.]+)'|namespace ([\w:.]+?)\.?\s", str(error))
    if named:
        op = named.group(1) or named.group(2)
        if all(op != kind for kind, _ in found):
            found.append((op, "?"))
    return found


def _dynamo_export(
    model: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None,
    dynamic_shapes: dict[str, Any] | None,
    opset: int | None,
) -> Any:
    torch = _import_torch()
    with _quiet_exporter():
        program = torch.onnx.export(
            model,
            args,
            kwargs=kwargs or None,
            dynamo=True,
            dynamic_shapes=dynamic_shapes,
            opset_version=opset,
            optimize=True,
            verbose=False,
        )
    if program is None:  # only the TorchScript exporter returns None
        raise ConversionError("torch.onnx.export returned no ONNX program")
    return program


def _dynamo_opset(requested: int | None, notes: list[str]) -> int | None:
    if requested is None:
        return None  # the exporter's own default
    return exporter_opset(requested, notes, exporter="torch's exporter", oldest=_DYNAMO_MIN_OPSET)


def _raise_export_error(
    error: Exception, *, what: str, analyze: Callable[[], list[tuple[str, str]]]
) -> NoReturn:
    """Turn an exporter failure into a FerryError; list every unsupported op when ops are why."""
    chain = _causes(error)
    if any(type(c).__name__ == "DispatchError" for c in chain):
        try:
            ops = analyze()
        except Exception:  # the analysis is best effort: fall back to the op the error names
            logger.debug("unsupported-op analysis failed", exc_info=True)
            ops = []
        ops = ops or _ops_from_message(str(error))
        raise UnsupportedOpError(_unsupported_message(ops, "torch.onnx"), ops) from error
    summary = _summary(error)
    if type(error).__name__ == "TorchExportError":
        raise ConversionError(
            f"torch.export cannot capture {what}: {summary}. Make forward() traceable by "
            "torch.export: no Python branches on tensor values (use torch.cond), see "
            "https://pytorch.org/docs/stable/generated/exportdb/index.html"
        ) from error
    raise ConversionError(f"torch.onnx cannot convert {what}: {summary}") from error


def _unsupported_nodes(program: Any, opset: int | None) -> list[tuple[str, str]]:
    """``(op, node)`` for every node of ``program`` the exporter has no ONNX function for.

    The exporter stops at the first such node; this runs its decomposition and dispatcher over
    the whole graph (torch-private APIs, so callers treat failure as "no analysis").
    """
    torch = _import_torch()
    from torch.onnx._internal.exporter import _core, _dispatching, _registration

    with _quiet_exporter():
        registry = _registration.ONNXRegistry.from_torchlib(
            opset_version=max(opset or _DYNAMO_DEFAULT_OPSET, _DYNAMO_MIN_OPSET)
        )
        decomposed = _core._prepare_exported_program_for_export(program, registry=registry)
    found: list[tuple[str, str]] = []
    for graph_module in decomposed.graph_module.modules():  # control-flow subgraphs too
        if not isinstance(graph_module, torch.fx.GraphModule):
            continue
        for node in graph_module.graph.nodes:
            # Higher-order ops (cond, with_effects...) are lowered specially, not dispatched.
            if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
                continue
            function, _ = _dispatching.dispatch(node, registry)
            if function is None:
                found.append((node.target.name(), node.name))
    return found


def _ops_from_message(message: str) -> list[tuple[str, str]]:
    op = re.search(r"OpOverload\(op='([^']+)', overload='([^']+)'\)", message)
    node = re.search(r"translating node %(\S+)", message)
    if not op:
        return []
    namespace, _, name = op.group(1).partition(".")
    overload = "" if op.group(2) == "default" else f".{op.group(2)}"
    return [(f"{namespace}::{name}{overload}", node.group(1) if node else "?")]


def _unsupported_message(ops: list[tuple[str, str]], exporter: str) -> str:
    torch = _import_torch()
    listed = list_ops(ops)
    return (
        f"cannot convert to ONNX: {len({op for op, _ in ops})} op(s) have no ONNX translation in {exporter} "
        f"(torch {torch.__version__}): {listed or 'unknown (see the cause)'}. Rewrite them with "
        "supported torch ops, or export to ONNX yourself with a translation for them "
        "(torch.onnx.export's custom_translation_table) and convert that ONNX file"
    )


def _summary(error: BaseException) -> str:
    """The useful part of an exporter error: the exception chain of its 'Exception summary' (one
    ``Type: message`` per link), else the innermost cause's first line."""
    text = strip_colors(str(error))
    found: list[tuple[str, str]] = []
    if "## Exception summary" in text:
        body = text.split("## Exception summary", 1)[1]
        found = re.findall(r"^<class '(?:[\w.]+\.)?(\w+)'>: (.*)$", body, flags=re.MULTILINE)
    if found:
        summary = " <- ".join(
            f"{name}: {message.replace('See the stack trace for more information.', '').strip()}"
            for name, message in found
        )
    else:
        summary = first_line(_causes(error)[-1])
    return summary if len(summary) <= 600 else summary[:600] + "..."


def _causes(error: BaseException) -> list[BaseException]:
    chain = [error]
    while chain[-1].__cause__ is not None and len(chain) < 20:
        chain.append(chain[-1].__cause__)
    return chain


def _detach(model: ir.Model) -> None:
    """Copy torch-backed (and external) weights into NumPy so the model does not alias the
    module's parameters or a temporary file."""
    detach_from_torch(model)


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise BackendUnavailableError(
            "converting PyTorch models needs torch: pip install 'ferry[torch]'"
        ) from e
    return torch


@contextlib.contextmanager
def silence_exporter_logs() -> Iterator[None]:
    """Silences the exporter's warnings and log lines for the duration of one export."""
    saved = {name: logging.getLogger(name).level for name in _NOISY_LOGGERS}
    try:
        for name, level in saved.items():
            # Only ever raise the threshold: a caller who silenced a logger further keeps that.
            logging.getLogger(name).setLevel(max(level, logging.ERROR))
        with warnings.catch_warnings():
            # torch's pytree emits FutureWarnings/DeprecationWarnings while exporting; they are
            # about torch internals, not the caller's code.
            warnings.simplefilter("ignore")
            yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def detach_from_torch(model: ir.Model) -> None:
    """Replaces torch-backed tensors in the model with NumPy-backed copies.

    The exporter leaves some initializers as views of the torch module's parameters (while
    constant-folded ones are already NumPy). Copying them makes the returned model
    self-contained: it does not keep torch tensors alive, does not alias the module, and behaves
    like any model loaded from disk (plain ``ir.Tensor`` everywhere).
    """
    import onnx_ir as ir

    def copy(tensor: ir.TensorProtocol) -> ir.Tensor:
        return ir.Tensor(np.array(tensor.numpy(), copy=True), name=tensor.name)

    for value in model.graph.initializers.values():
        if value.const_value is not None and type(value.const_value) is not ir.Tensor:
            value.const_value = copy(value.const_value)
    for node in model.graph.all_nodes():
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.TENSOR and type(attr.value) is not ir.Tensor:
                node.attributes[attr.name] = ir.AttrTensor(attr.name, copy(attr.as_tensor()))


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silences torch while it exports or loads: :func:`silence_exporter_logs` for log lines and
    warnings, plus what torch prints itself (torch.export prints the partial graph to stderr when
    it fails), which goes to this module's debug log instead.

    The print capture swaps ``sys.stdout``/``sys.stderr`` for the process while it lasts, as
    ``contextlib.redirect_stdout`` does; conversions are one-off jobs, not served requests.
    """
    captured = io.StringIO()
    try:
        with (
            silence_exporter_logs(),
            contextlib.redirect_stdout(captured),
            contextlib.redirect_stderr(captured),
        ):
            yield
    finally:
        if captured.getvalue().strip():
            logger.debug("torch printed while exporting:\n%s", captured.getvalue())
