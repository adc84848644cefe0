"""ferry's error hierarchy.

Every error a user can cause is a :class:`FerryError`. Its message names the file, input, node or op
at fault and says what to do; the CLI prints it on one line and exits 2. Anything else escaping the
library is a bug in ferry (the CLI exits 1 and asks for a report). :func:`list_ops` words the ops
an :class:`UnsupportedOpError` lists, the same way for every converter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = [
    "BackendUnavailableError",
    "ConversionError",
    "EngineBusyError",
    "EngineClosedError",
    "ExecutionError",
    "FerryError",
    "InvalidInputError",
    "ModelLoadError",
    "PlanError",
    "UnsupportedOpError",
    "list_ops",
]


class FerryError(Exception):
    """Base class of every error ferry raises for a problem the user can fix."""


class ModelLoadError(FerryError):
    """A model file or object could not be read: missing, corrupt, or not a model at all."""


class InvalidInputError(FerryError, ValueError):
    """An input given to a model or a command is wrong: unknown or missing name, shape or dtype."""


class UnsupportedOpError(FerryError):
    """One or more ops cannot be handled by the converter or engine that was asked to."""

    def __init__(self, message: str, ops: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        #: ``(op_type, node_name)`` pairs of every unsupported node, so callers can report all at once.
        self.ops = ops or []


class BackendUnavailableError(FerryError):
    """An engine was asked for but is not installed or cannot run here."""


class ConversionError(FerryError):
    """A conversion (format or opset) failed or produced a model that does not check."""


class PlanError(FerryError):
    """A plan does not fit its model: unknown or unassigned nodes, a partition reading a value no
    earlier partition gives, a boundary of unknown type, a malformed plan file."""


class ExecutionError(FerryError):
    """An engine failed while running a model on the given inputs (a Reshape that does not fit...)."""


class EngineBusyError(FerryError):
    """A generation engine's queue is full: the request was not admitted; retry after
    ``retry_after`` seconds (HTTP 429)."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        #: Seconds after which a retry is likely to be admitted.
        self.retry_after = retry_after


class EngineClosedError(FerryError):
    """A generation engine is draining or closed: it admits no new request (HTTP 503)."""


def list_ops(
    ops: Iterable[tuple[str, str]], *, reasons: Mapping[str, str] | None = None, shown: int = 5
) -> str:
    """``op xN (node, node, +K more)`` for each op type among ``(op, node)`` pairs, the most
    frequent first (ties in order of appearance), ``: reason`` after each op ``reasons`` explains.
    Op types are separated by ``; ``, or by `` | `` when there are reasons (which hold ``;``)."""
    by_op: dict[str, list[str]] = {}
    for op, node in ops:
        by_op.setdefault(op, []).append(node)
    parts = []
    for op, nodes in sorted(by_op.items(), key=lambda item: -len(item[1])):
        more = f", +{len(nodes) - shown} more" if len(nodes) > shown else ""
        why = f": {reasons[op]}" if reasons and op in reasons else ""
        parts.append(f"{op} x{len(nodes)} ({', '.join(nodes[:shown])}{more}){why}")
    return (" | " if reasons else "; ").join(parts)
