"""The first two steps of an adapter's lifecycle, as data: the devices it finds and the options
its context takes.

A backend lists its devices (:class:`DeviceInfo`, from ``BackendBase.devices()``) and declares
the options it takes (:class:`OptionSpec`, in ``BackendBase.options``); :func:`option_problem`
says what is wrong with one given value, for ``check_options``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

__all__ = ["DeviceInfo", "OptionSpec", "device_kind", "option_problem"]


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """One device an engine can run on here.

    Attributes:
        name: how the engine names it (``"cpu"``, ``"cuda:0"``, ``"GPU.1"``).
        kind: ``"cpu"``, ``"gpu"`` or ``"npu"``.
        properties: what the engine says of it (full name, capabilities, providers), as text.
    """

    name: str
    kind: str
    properties: Mapping[str, str] = dataclasses.field(default_factory=lambda: MappingProxyType({}))


@dataclasses.dataclass(frozen=True)
class OptionSpec:
    """One option a backend's context takes, besides ``threads`` and ``precision``.

    Attributes:
        name: its key in ``options`` (``"cores"``).
        type: the Python type a value must have: ``int``, ``float``, ``str`` or ``bool`` (an int
            is taken where a float is asked; a bool is never taken as an int).
        default: what the engine does when it is not given (shown by ``ferry info --backends``).
        choices: the values it takes, when only a few are; None takes any of ``type``.
        help: one line saying what it does.
    """

    name: str
    type: type = str
    default: Any = None
    choices: tuple[Any, ...] | None = None
    help: str = ""

    def describe(self) -> str:
        """``"cores: int, one of 1, 2, 4 (default 1): NPU cores to use"``, for listings."""
        text = f"{self.name}: {self.type.__name__}"
        if self.choices is not None:
            text += f", one of {', '.join(map(str, self.choices))}"
        if self.default is not None:
            text += f" (default {self.default})"
        return f"{text}: {self.help}" if self.help else text


def option_problem(spec: OptionSpec, value: object) -> str | None:
    """What is wrong with ``value`` for ``spec`` (``"takes an int; got 'two' (str)"``), or None."""
    wanted = spec.type
    if wanted is float:
        fits = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif wanted is int:
        fits = isinstance(value, int) and not isinstance(value, bool)
    else:
        fits = isinstance(value, wanted)
    takes = f"an {wanted.__name__}" if wanted.__name__[0] in "aeiou" else f"a {wanted.__name__}"
    if spec.choices is not None:
        takes += f", one of {', '.join(map(repr, spec.choices))}"
    if not fits:
        return f"takes {takes}; got {value!r} ({type(value).__name__})"
    if spec.choices is not None and value not in spec.choices:
        return f"takes {takes}; got {value!r}"
    return None


def device_kind(device: str) -> str:
    """The kind of a backend's ``device`` string: ``"gpu"`` for ``cuda``/``gpu``, ``"npu"``,
    else ``"cpu"``."""
    head = device.split(":")[0].split(".")[0].lower()
    if head in ("cuda", "gpu", "rocm"):
        return "gpu"
    if head == "npu":
        return "npu"
    return "cpu"
