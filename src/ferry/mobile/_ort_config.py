"""The reduced-build config of an ORT format model: the ops a minimal ONNX Runtime build needs.

Before -> After::

    model.ort (one or more ORT format models, as ONNX Runtime wrote them)
        -> {domain: {since_version: (op, ...)}}, and the config text a minimal build reads
           (``--include_ops_by_config``), with each op's types when type reduction is asked for

The ops are read back from the files by ``onnxruntime.tools.ort_format_model`` (what
``create_reduced_build_config.py`` uses) and written in that script's format. The ORT format
version a file was written in is read from its flatbuffer header, with ORT's own bindings.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ferry._version import __version__
from ferry.errors import ConversionError

__all__ = ["ort_format_version", "ort_version", "reduced_build_config"]


def reduced_build_config(
    ort_files: Sequence[Path], *, model_name: str, style: str, level: str, type_reduction: bool
) -> tuple[dict[str, dict[int, tuple[str, ...]]], str]:
    """The ops (and types) the ORT format models use, and the config text a minimal build reads.

    The format is ``create_reduced_build_config.py``'s: ``domain;since_version;Op1,Op2`` lines,
    sorted, each op followed by its types' JSON when ``type_reduction`` is asked for.

    Args:
        ort_files: the ORT format models the build must run.
        model_name: the exported model's file name, for the config's header.
        style / level: the optimization style and level the models were converted with (header).
        type_reduction: list the types each op needs, for ``--enable_reduced_operator_type_support``.
    """
    tools = _ort_format_tools()
    found: dict[str, dict[int, set[str]]] = {}
    types = tools.OperatorTypeUsageManager() if type_reduction else None
    for path in ort_files:
        try:
            tools.OrtFormatModelProcessor(str(path), found, types).process()
        except Exception as e:  # a file ORT wrote but its own reader cannot read: a bug upstream
            raise ConversionError(f"cannot read back the ORT format model {path.name}: {e}") from e
    required = {
        domain: {opset: tuple(sorted(ops)) for opset, ops in sorted(by_opset.items()) if ops}
        for domain, by_opset in sorted(found.items())
    }
    flags = "--minimal_build --include_ops_by_config <this file>"
    if type_reduction:
        flags += " --enable_reduced_operator_type_support"
    lines = [
        "# Generated from model/s:",
        f"# - {model_name}",
        f"# by ferry {__version__} with onnxruntime {ort_version()} ({style} "
        f"optimization, level {level}).",
        f"# Build ONNX Runtime with: {flags}",
    ]
    for domain, by_opset in required.items():
        for opset, ops in by_opset.items():
            entries = [
                op + ((types.get_config_entry(domain, op) or "") if types is not None else "")
                for op in ops
            ]
            lines.append(f"{domain};{opset};{','.join(entries)}")
    return required, "\n".join(lines) + "\n"


def ort_version() -> str:
    """The installed onnxruntime's version."""
    import onnxruntime as ort

    return str(ort.__version__)


def ort_format_version(path: Path) -> str:
    """The ORT format version the file was written in (``InferenceSession.ort_version``)."""
    _ort_format_tools()  # its import puts ORT's flatbuffers bindings on sys.path
    from ort_flatbuffers_py.fbs.InferenceSession import InferenceSession

    data = bytearray(path.read_bytes())
    if not InferenceSession.InferenceSessionBufferHasIdentifier(data, 0):
        raise ConversionError(f"{path.name} is not an ORT format model (no ORTM identifier)")
    version = InferenceSession.GetRootAsInferenceSession(data, 0).OrtVersion()
    return version.decode() if isinstance(version, bytes) else str(version)


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    """Keep ``logging.basicConfig`` from taking over the root logger while ORT's tools import
    (``onnxruntime.tools.logger`` calls it at import, printing their logs to stderr)."""
    root = logging.getLogger()
    guard = logging.NullHandler()
    root.addHandler(guard)
    try:
        yield
    finally:
        root.removeHandler(guard)


def _ort_format_tools() -> Any:
    with _quiet_root_logger():
        from onnxruntime.tools import ort_format_model
    return ort_format_model
