"""What machine a benchmark ran on: CPU, cores, memory, Python, ferry, and the engines present.

The same block heads every result document (``ferry bench --json``) and answers the agent's
``GET /device``, so results from different devices can be told apart and compared.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

from ferry._version import __version__

__all__ = ["cpu_model", "device_info", "memory_mb", "peak_rss_mb"]


def cpu_model() -> str:
    """The CPU's marketing name: ``/proc/cpuinfo`` on Linux and Android, else ``platform``."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    # x86 says "model name"; ARM boards and phones say "Hardware" or "Model" (and some only
    # "CPU part"), so take the first key that is there.
    for key in ("model name", "Hardware", "Model", "cpu model", "Processor"):
        for line in text.splitlines():
            name, sep, value = line.partition(":")
            if sep and name.strip() == key and value.strip():
                return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def proc_mb(file: str, key: str) -> float | None:
    """A ``key:  N kB`` line of a Linux (or Android) ``/proc`` file, in MiB; None elsewhere."""
    try:
        for line in Path(file).read_text(encoding="utf-8").splitlines():
            if line.startswith(f"{key}:"):
                return round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_mb() -> float | None:
    """Total physical memory in MiB, or None where the OS does not say."""
    total = proc_mb("/proc/meminfo", "MemTotal")
    if total is not None:
        return total
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return round(pages * size / (1 << 20), 1) if pages > 0 and size > 0 else None


def _usable_cores() -> int | None:
    # A container or taskset may give this process fewer cores than the machine has.
    if hasattr(os, "sched_getaffinity"):
        try:
            return len(os.sched_getaffinity(0))
        except OSError:
            return None
    return os.cpu_count()


def engines() -> list[dict[str, Any]]:
    """Every backend ferry knows: available or not (with why), version, device and precisions."""
    from ferry.backends import get_backend, known_backends
    from ferry.errors import FerryError

    out: list[dict[str, Any]] = []
    for name in known_backends():
        try:
            backend = get_backend(name)
            entry: dict[str, Any] = {
                "name": name,
                "available": True,
                "version": str(backend.version),
                "device": backend.device,
                "precisions": list(backend.precisions),
                "reason": None,
            }
        except FerryError as e:
            entry = {
                "name": name,
                "available": False,
                "version": None,
                "device": None,
                "precisions": [],
                "reason": str(e),
            }
        out.append(entry)
    return out


def device_info() -> dict[str, Any]:
    """The device block: where results were measured.

    Keys: ``hostname``, ``os``, ``machine`` (architecture), ``cpu``, ``cores`` (logical CPUs),
    ``usable_cores`` (those this process may run on), ``memory_mb``, ``python``, ``ferry``,
    ``engines`` (see :func:`engines`).
    """
    return {
        "hostname": platform.node(),
        "os": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": _usable_cores(),
        "memory_mb": memory_mb(),
        "python": platform.python_version(),
        "ferry": __version__,
        "engines": engines(),
    }


def peak_rss_mb() -> float | None:
    """This process's resident-set high-water mark in MiB (None where the OS does not say).

    Linux and Android: ``VmHWM`` from ``/proc/self/status``, the high-water mark of this
    process's own memory map. Not ``ru_maxrss``: Linux carries it over ``fork`` + ``exec``, so a
    child started by a big parent reports the parent's peak (measured here: a child of a 400 MiB
    process said 407 MiB by ``ru_maxrss``, 10 MiB by ``VmHWM``). Elsewhere ``ru_maxrss``.
    """
    peak = proc_mb("/proc/self/status", "VmHWM")
    if peak is not None:
        return peak
    try:
        import resource
    except ImportError:  # Windows
        return None
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # macOS counts bytes, the BSDs KiB.
    return round(maxrss / (1 << 20 if sys.platform == "darwin" else 1 << 10), 1)
