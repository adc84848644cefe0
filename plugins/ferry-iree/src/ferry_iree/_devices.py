"""What IREE finds here: its HAL drivers and the host CPU's features.

``iree-cpuinfo`` (shipped in the runtime wheel) prints the CPU features IREE's llvm-cpu
target and microkernels would use (``avx512f 1``); ``devices()`` reports the ones present.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

__all__ = ["cpu_features", "drivers"]


def drivers() -> tuple[str, ...]:
    """The HAL drivers this IREE runtime was built with (``local-task``, ``local-sync``...)."""
    import iree.runtime as rt

    return tuple(rt.query_available_drivers())


@functools.cache
def cpu_features() -> tuple[str, ...]:
    """The CPU features ``iree-cpuinfo`` finds on this machine; empty when it cannot run."""
    try:
        from iree import _runtime_libs

        exe = Path(_runtime_libs.__path__[0]) / "iree-cpuinfo"
        out = subprocess.run([exe], capture_output=True, text=True, timeout=10, check=True).stdout
    except (ImportError, OSError, subprocess.SubprocessError):
        return ()
    found = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] == "1":
            found.append(parts[0])
    return tuple(found)
