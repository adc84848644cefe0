"""How ferry names a child process's death: ``SIGSEGV``, not ``-11``.

The serving workers (``--isolate``), the Paddle converter's process and the benchmark agent's all
say which signal ended a process in the error they give; one name for one signal everywhere.
"""

from __future__ import annotations

import signal

__all__ = ["signal_name"]


def signal_name(signum: int) -> str:
    """``SIGSEGV`` for 11; ``signal 99`` for a number this system does not name.

    ``subprocess`` reports a process a signal ended as the negative number: pass ``-returncode``.
    """
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
