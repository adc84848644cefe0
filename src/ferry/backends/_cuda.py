"""CUDA plumbing for adapters that manage GPU memory themselves, through cuda-python.

cuda-python (``cuda.bindings.runtime``, or ``cuda.cudart`` before 12.6) is the one CUDA
dependency: torch is not used even when installed. Every call returns ``(error, values...)``;
:func:`cuda_call` turns an error into an ``ExecutionError`` that names what failed.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from ferry.errors import ExecutionError

__all__ = ["DeviceBuffer", "compute_capability", "cuda_call", "cudart", "device_problem"]


def cudart() -> Any:
    """The CUDA runtime bindings (imported on first use)."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        from cuda import cudart as runtime  # cuda-python < 12.6

    return runtime


@functools.cache
def device_problem() -> str | None:
    """Why no CUDA device can be used here (None when one can): no cuda-python, no driver, none."""
    try:
        rt = cudart()
    except Exception as e:  # ImportError, or OSError when its shared libraries are missing
        return f"cuda-python is not importable ({type(e).__name__}: {e})"
    try:
        err, count = rt.cudaGetDeviceCount()
    except Exception as e:  # no CUDA driver at all
        return f"the CUDA runtime cannot start ({e})"
    if err != rt.cudaError_t.cudaSuccess:
        return f"no usable CUDA device ({_error_name(rt, err)})"
    if count < 1:
        return "no CUDA device"
    return None


@functools.cache
def compute_capability() -> str | None:
    """``"89"`` for the current device, None when there is none."""
    if device_problem() is not None:
        return None
    rt = cudart()
    err, device = rt.cudaGetDevice()
    if err != rt.cudaError_t.cudaSuccess:
        return None
    err, props = rt.cudaGetDeviceProperties(device)
    if err != rt.cudaError_t.cudaSuccess:
        return None
    return f"{props.major}{props.minor}"


def _error_name(rt: Any, err: Any) -> str:
    try:
        found = rt.cudaGetErrorName(err)[1]
        return found.decode() if isinstance(found, bytes) else str(found)
    except Exception:  # an error while naming an error: the enum's own text will do
        return str(err)


def cuda_call(result: Any, what: str) -> Any:
    """Unpack a cuda-python ``(err, value...)`` result, raising ExecutionError on an error."""
    rt = cudart()
    err, *values = result
    if err != rt.cudaError_t.cudaSuccess:
        raise ExecutionError(f"CUDA {what} failed: {_error_name(rt, err)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


class DeviceBuffer:
    """Device memory that grows to the largest size asked for."""

    def __init__(self) -> None:
        self.ptr = 0
        self.capacity = 0

    def reserve(self, nbytes: int) -> int:
        nbytes = max(nbytes, 1)  # a valid address even for empty tensors
        if nbytes > self.capacity:
            self.free()
            self.ptr = int(cuda_call(cudart().cudaMalloc(nbytes), "cudaMalloc"))
            self.capacity = nbytes
        return self.ptr

    def free(self) -> None:
        if self.ptr:
            with contextlib.suppress(Exception):  # at interpreter exit CUDA may be gone already
                cudart().cudaFree(self.ptr)
            self.ptr = 0
            self.capacity = 0
