"""Finding and reading a served model's configuration file: ``config.json`` or ``config.pbtxt``.

One job: which of the two files a model folder holds, and handing its text to the parser of its
format (:mod:`ferry.serving._config` for JSON, :mod:`ferry.serving._pbtxt` for Triton's text).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from ferry.serving._config import ConfigError, ModelConfig, parse_config
from ferry.serving._pbtxt import parse_pbtxt

__all__ = ["CONFIG_FILES", "read_config"]

CONFIG_FILES = ("config.json", "config.pbtxt")


def read_config(model_dir: str | os.PathLike[str], name: str) -> tuple[ModelConfig, str | None]:
    """Read ``model_dir/config.json`` or ``model_dir/config.pbtxt`` if there is one.

    Returns:
        The config (defaults when there is no file) and the file's text (None without a file),
        which the repository compares to notice edits.

    Raises:
        ConfigError: the file cannot be read or parsed, or breaks a rule; both files are there.
    """
    folder = Path(model_dir)
    found = [folder / f for f in CONFIG_FILES if (folder / f).exists()]
    if not found:
        return ModelConfig(), None
    if len(found) > 1:
        raise ConfigError(
            f"model {name!r} has both {found[0]} and {found[1]}; keep one (config.pbtxt is "
            "Triton's format, config.json the same fields as JSON)"
        )
    (path,) = found
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from e
    if path.suffix == ".pbtxt":
        return parse_pbtxt(text, name, source=str(path)), text
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from None
    config = parse_config(data, name, source=str(path))
    return dataclasses.replace(config, source=str(path)), text
