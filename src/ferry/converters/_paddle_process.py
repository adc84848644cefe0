"""The Python that runs Paddle, for the Paddle converter, and the worker run in it.

paddle2onnx is never imported by ferry (it pins an older onnx, and its C++ core aborts the process
on an op it cannot convert): the worker script ``_paddle_worker.py`` is copied as text into a
temporary folder and run by that Python, the two exchanging files there. This module finds that
Python (``$FERRY_PADDLE_PYTHON``, this interpreter, or the default environment
``scripts/setup-paddle.sh`` creates), runs the worker, and reads how it ended.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from ferry._signals import signal_name
from ferry.converters._base import strip_colors
from ferry.errors import BackendUnavailableError

__all__ = ["PADDLE_PYTHON_ENV", "default_paddle_venv", "find_paddle_python"]

#: The environment variable naming the Python that has ``paddle`` and ``paddle2onnx``.
PADDLE_PYTHON_ENV = "FERRY_PADDLE_PYTHON"
# The worker's own exit codes (0 ok, 3 missing module, 4 load, 5 export, 6 run, 7 internal).
_WORKER_CODES = frozenset({0, 3, 4, 5, 6, 7})
_SETUP = (
    "paddle2onnx pins onnx<=1.17, so ferry runs it in a Python environment of its own: run "
    "scripts/setup-paddle.sh from a ferry checkout, or `python -m venv DIR && DIR/bin/pip install "
    "paddlepaddle==3.3.1 paddle2onnx==2.1.0 packaging`, then set "
    f"{PADDLE_PYTHON_ENV}=DIR/bin/python (the default DIR is {{default}})"
)


def default_paddle_venv() -> Path:
    """Where ``scripts/setup-paddle.sh`` puts the Paddle environment unless told otherwise."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "ferry" / "paddle-venv"


def find_paddle_python() -> Path | None:
    """The Python to run Paddle and paddle2onnx in, or None when there is none.

    ``$FERRY_PADDLE_PYTHON`` wins; then this interpreter if it can import both; then the default
    environment (:func:`default_paddle_venv`). Nothing is imported to decide.
    """
    named = os.environ.get(PADDLE_PYTHON_ENV)
    if named:
        return Path(named)
    if _importable("paddle") and _importable("paddle2onnx"):
        return Path(sys.executable)
    venv = default_paddle_venv()
    for candidate in (venv / "bin" / "python", venv / "Scripts" / "python.exe"):
        if candidate.is_file():
            return candidate
    return None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _paddle_python() -> Path:
    python = find_paddle_python()
    if python is None:
        raise BackendUnavailableError(
            "converting PaddlePaddle models needs paddlepaddle and paddle2onnx, and no Python "
            f"with them was found; {_setup_hint()}"
        )
    if not python.is_file() or not os.access(python, os.X_OK):
        raise BackendUnavailableError(
            f"{PADDLE_PYTHON_ENV}={python} is not an executable Python; {_setup_hint()}"
        )
    return python


def _setup_hint() -> str:
    return _SETUP.format(default=default_paddle_venv())


def _exit_text(code: int) -> str:
    """How the worker process ended, from ``subprocess``'s return code.

    The worker is started directly, not through a shell: a negative code is the signal that
    killed it (paddle2onnx's C++ core aborts with SIGABRT), any other is its exit status
    (Python's ``sys.exit(-1)`` is 255, which is not "signal 127").
    """
    if code < 0:
        return f"the converter process was killed by {signal_name(-code)}"
    return f"the converter process exited with status {code}"


def _log_reason(log: str) -> str:
    """The lines of a worker's output that say what went wrong."""
    lines = [strip_colors(line).strip() for line in log.splitlines()]
    lines = [line for line in lines if line]
    picked = [
        line
        for line in lines
        if "[ERROR]" in line
        or "not supported" in line
        or re.match(r"^(\w+Error|Error)\b", line)
        or line.startswith("(")
    ]
    if not picked:
        picked = lines[-3:]
    text = "; ".join(dict.fromkeys(picked[:4]))
    return text[:1000] or "no message (run with logging at DEBUG to see the converter's output)"


def _run_worker(
    python: Path, request: dict[str, Any], work: Path
) -> tuple[int, dict[str, Any], str]:
    """Run the worker on ``request`` in ``work``; returns (exit code, its report, its output)."""
    # Run from a copy in the work folder: Python puts the script's folder first on the import
    # path, and nothing of ferry's beside its source may shadow a package it imports.
    script = work / "ferry_paddle_worker.py"
    script.write_text(_worker_source(), encoding="utf-8")
    report_path = work / "report.json"
    request = dict(request, report=str(report_path))
    (work / "request.json").write_text(json.dumps(request), encoding="utf-8")
    env = dict(os.environ)
    # Paddle's C++ logging is chatty at INFO; its warnings would drown the one line that matters.
    env.setdefault("GLOG_minloglevel", "2")
    env.setdefault("GLOG_v", "0")
    try:
        proc = subprocess.run(
            [str(python), str(script), str(work / "request.json")],
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            check=False,
        )
    except OSError as e:
        raise BackendUnavailableError(f"cannot start {python}: {e}; {_setup_hint()}") from e
    report: dict[str, Any] = {}
    if report_path.is_file():
        try:
            report = json.loads(report_path.read_text(encoding="utf-8"))
        except ValueError:
            report = {}
    return proc.returncode, report, proc.stdout


def _worker_source() -> str:
    return (Path(__file__).parent / "_paddle_worker.py").read_text(encoding="utf-8")
