"""The checks a served model's config shares with the modules that parse parts of it
(:mod:`ferry.serving._sequence`): the error, key and integer checks, Triton's type names."""

from __future__ import annotations

from typing import Any

from ferry.errors import ModelLoadError

__all__ = ["TRITON_TYPES", "ConfigError", "check_int", "check_keys"]


class ConfigError(ModelLoadError):
    """A model's config.json is unreadable, malformed, or does not fit the model."""


def check_int(value: Any, key: str, where: str, *, minimum: int, maximum: int | None = None) -> int:
    if type(value) is not int or value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ConfigError(f"{where}: {key} must be an integer {bound}, got {value!r}")
    return value


def check_keys(data: dict[str, Any], known: set[str], where: str, what: str) -> None:
    """Refuse keys of ``data`` (the config or one of its objects, named by ``what``) that are not
    ``known``, naming the known ones."""
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(
            f"{where}: unknown {what}key {', '.join(map(repr, unknown))}; the keys are "
            f"{', '.join(sorted(known))}"
        )


TRITON_TYPES = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FP16": "TYPE_FP16",
    "FP32": "TYPE_FP32",
    "FP64": "TYPE_FP64",
    "BYTES": "TYPE_STRING",
    "BF16": "TYPE_BF16",
}
