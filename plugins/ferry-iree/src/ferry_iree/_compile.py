"""MLIR -> vmfb: IREE's compiler for the llvm-cpu target, and its errors made ferry's.

Before -> After::

    MLIR text (torch dialect) -> iree-compile --iree-hal-target-device=local
        --iree-hal-local-target-device-backends=llvm-cpu --iree-llvmcpu-target-cpu=<cpu>
        -> a ``.vmfb`` flatbuffer (bytes)

``iree.compiler.compile_str`` runs the ``iree-compile`` executable of the same wheel in a
subprocess: a crash in the compiler (it segfaults on some ops, e.g. ``Unique``) fails that
compile, not the process.
"""

from __future__ import annotations

import re

from ferry.errors import UnsupportedOpError

__all__ = ["compile_mlir", "compiler_reason", "refused_op"]

# A diagnostic line: "<stdin>:4:10: error: failed to legalize operation 'torch.operator' ..."
_ERROR = re.compile(r"error: (.*)")
# The ONNX op a torch.operator stands for: torch.operator "onnx.STFT"(...) / <{name = "onnx.STFT"}>
_ONNX_OP = re.compile(r'"onnx\.([A-Za-z0-9_]+)"')


def compile_mlir(mlir: str, target_cpu: str, *, phase: str | None = None) -> bytes:
    """The vmfb IREE compiles ``mlir`` to for this machine's CPU (``target_cpu``: ``host``,
    ``generic`` or an LLVM CPU name); ``phase`` stops early (``"flow"``), for trials.

    Raises:
        UnsupportedOpError: the compiler refused or crashed; the message says on what.
    """
    import iree.compiler as compiler

    args = [f"--iree-llvmcpu-target-cpu={target_cpu}"]
    if phase is not None:
        args.append(f"--compile-to={phase}")
    try:
        blob = compiler.compile_str(mlir, target_backends=["llvm-cpu"], extra_args=args)
    except compiler.CompilerToolError as e:
        op = refused_op(str(e))
        raise UnsupportedOpError(
            f"iree: {compiler_reason(str(e))}", [(op, "")] if op else []
        ) from e
    return bytes(blob) if blob is not None else b""


def refused_op(message: str) -> str | None:
    """The ONNX op IREE's first error is about (a ``torch.operator`` it could not legalize), or
    None when the error names none."""
    for line in message.splitlines():
        if _ERROR.search(line) is not None:
            found = _ONNX_OP.search(line)
            return found.group(1) if found is not None else None
    return None


def compiler_reason(message: str) -> str:
    """The line of IREE's compiler output that says what went wrong, shortened: its first
    ``error:`` diagnostic (naming the ONNX op when a ``torch.operator`` was left), or that the
    compiler crashed."""
    for line in message.splitlines():
        found = _ERROR.search(line)
        if found is None:
            continue
        text = found.group(1).strip()
        op = _ONNX_OP.search(text)
        if "failed to legalize operation 'torch.operator'" in text and op is not None:
            return (
                f"failed to legalize onnx.{op.group(1)}: IREE has no lowering for it in this form"
            )
        return text[:300]
    code = re.search(r"Error code: (-?\d+)", message)
    if code is not None and int(code.group(1)) < 0:
        return f"iree-compile crashed (signal {-int(code.group(1))}) on it"
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[0][:300] if lines else "iree-compile failed"
