"""IREE's runtime: the CPU device for a thread count, and a pool of VM contexts.

Threads. IREE's local-task driver owns one worker pool for the whole process, sized from the
runtime flag ``--task_topology_max_group_count`` when the driver is first made (measured: a
second device of the driver shares the first one's workers whatever the flag says by then).
So ``threads=1`` runs on the local-sync driver (the caller's thread, no pool), and any other
count on the process's local-task pool, sized by the first partition that makes it (its
``threads``, else every core this process may use); a later, different count is logged, not
honoured.

Contexts. A VM context holds a module's mutable state, and IREE's ``runtime/src/iree/vm/
context.h`` says of it "Thread-compatible and must be externally synchronized" (the Python
``SystemContext`` is created without ``IREE_VM_CONTEXT_FLAG_CONCURRENT``): each call borrows a
context from a free list, and one that finds none free makes another from the same loaded module
(module and device are shared), so calls from several threads run at once without a lock.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["ContextPool", "device_for", "pool_size"]

logger = logging.getLogger(__name__)

_devices: dict[str, Any] = {}
_devices_lock = threading.Lock()
_pool_size: int | None = None


def pool_size() -> int | None:
    """How many workers the process's local-task pool has; None before it is made."""
    return _pool_size


def device_for(threads: int | None) -> Any:
    """The HAL device a partition with ``threads`` runs on: local-sync for 1, else the
    process's local-task device (made on first use with ``threads`` workers, or one per core
    this process may use)."""
    global _pool_size
    import iree.runtime as rt

    driver = "local-sync" if threads == 1 else "local-task"
    with _devices_lock:
        device = _devices.get(driver)
        if device is None:
            if driver == "local-task":
                _pool_size = threads or len(os.sched_getaffinity(0))
                # Read once, when the driver (and its worker pool) is made.
                rt.flags.parse_flags(f"--task_topology_max_group_count={_pool_size}")
            device = rt.get_driver(driver).create_default_device()
            _devices[driver] = device
        elif driver == "local-task" and threads is not None and threads != _pool_size:
            logger.info(
                "iree: threads=%d not applied: the process's IREE worker pool already has %s "
                "(IREE sizes it once per process)",
                threads,
                _pool_size,
            )
        return device


class ContextPool:
    """VM contexts over one compiled module, each used by one caller at a time."""

    def __init__(self, blob: bytes, entry: str, threads: int | None) -> None:
        import iree.runtime as rt

        self._rt = rt
        self._config = rt.Config(device=device_for(threads))
        # The module is immutable once loaded and shared by every context.
        self._module = rt.VmModule.copy_buffer(self._config.vm_instance, blob)
        self._entry = entry
        self._free: list[Any] = []
        self._lock = threading.Lock()
        self._free.append(self._make())

    def _make(self) -> Any:
        context = self._rt.SystemContext(config=self._config)
        context.add_vm_module(self._module)
        return context.modules.module[self._entry]

    @contextmanager
    def function(self) -> Iterator[Any]:
        """The entry function of a context no one else is calling meanwhile."""
        with self._lock:
            function = self._free.pop() if self._free else None
        if function is None:
            function = self._make()
        try:
            yield function
        finally:
            with self._lock:
                self._free.append(function)
