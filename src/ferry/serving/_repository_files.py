"""What a model repository holds on disk: model names, the model file of a version folder, and
the fingerprint that says when a version's files changed (:mod:`ferry.serving._repository`)."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from pathlib import Path
from typing import Any

from ferry.errors import FerryError, InvalidInputError, ModelLoadError

__all__ = [
    "NO_MODELS_HINT",
    "ModelNotFoundError",
    "ModelNotReadyError",
    "VersionFiles",
    "check_model_name",
    "find_model_file",
    "fingerprint",
    "list_models",
    "model_name_for",
    "source_models",
]

logger = logging.getLogger(__name__)


class ModelNotFoundError(FerryError):
    """No model (or version) of that name is in the repository (HTTP 404)."""


class ModelNotReadyError(FerryError):
    """The model is known but not serving: loading, unloaded, or failed to load (HTTP 503)."""


_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")


def check_model_name(name: str) -> str:
    """Return ``name`` if it is a plain folder name; raise InvalidInputError (HTTP 400) if not."""
    if not _NAME.fullmatch(name):
        raise InvalidInputError(
            f"invalid model name {name!r}: a model name is a folder name in the repository "
            "(letters, digits, '_', '.', '-'; not starting with '.')"
        )
    return name


def model_name_for(path: Path) -> str:
    """The name a single model file or artifact folder is served under: its stem, made valid."""
    stem = path.name if path.is_dir() else path.stem
    name = re.sub(r"[^A-Za-z0-9_.\-]", "_", stem).lstrip(".-") or "model"
    return name[:128]


#: What a repository holds, for errors about one that holds nothing.
NO_MODELS_HINT = (
    "a repository holds <model>/<version>/model.onnx (e.g. REPO/mlp/1/model.onnx), or pass a "
    "model file"
)


def source_models(path: Path) -> tuple[bool, list[str]]:
    """What ``ferry serve PATH`` serves: ``(True, [name])`` for an ``.onnx`` file or an artifact
    folder, ``(False, names)`` for a repository (possibly none yet).

    Raises:
        ModelLoadError: ``path`` does not exist, or is a file that is not an ``.onnx`` model.
    """
    if not path.exists():
        raise ModelLoadError(f"model or repository not found: {path}")
    if path.is_file() or (path / "model.onnx").is_file():
        if path.is_file() and path.suffix.lower() != ".onnx":
            raise ModelLoadError(
                f"{path} is not an .onnx model; ferry serve takes an .onnx file, an artifact "
                "folder or a model repository (convert other formats with ferry convert)"
            )
        return True, [model_name_for(path)]
    if not path.is_dir():
        raise ModelLoadError(f"{path} is neither a file nor a folder")
    return False, list_models(path)


def list_models(root: Path) -> list[str]:
    """The model folders in a repository (names that are not valid model names are skipped)."""
    names = []
    for child in sorted(root.iterdir()):
        if not child.is_dir() or child.name.startswith("."):
            continue
        if _NAME.fullmatch(child.name):
            names.append(child.name)
        else:
            logger.warning("skipping %s: not a valid model name", child)
    return names


def find_model_file(version_dir: Path, filename: str | None = None) -> Path:
    """The model in a version folder: ``model.onnx``, the one ``*.onnx``, or one artifact folder;
    with ``filename`` (config.pbtxt's ``default_model_filename``), that file or artifact folder.

    Raises:
        ModelLoadError: none of these, or more than one candidate.
    """
    if filename is not None:
        named = version_dir / filename
        if named.is_file() or (named / "model.onnx").is_file():
            return named
        raise ModelLoadError(
            f"{version_dir} holds no {filename!r} (the config's default_model_filename)"
        )
    direct = version_dir / "model.onnx"
    if direct.is_file():
        return direct
    files = sorted(p for p in version_dir.glob("*.onnx") if p.is_file())
    if len(files) == 1:
        return files[0]
    if len(files) > 1:
        raise ModelLoadError(
            f"{version_dir} holds {len(files)} .onnx files ({', '.join(p.name for p in files)}); "
            "name the one to serve model.onnx"
        )
    artifacts = sorted(p for p in version_dir.iterdir() if (p / "model.onnx").is_file())
    if len(artifacts) == 1:
        return artifacts[0]
    if len(artifacts) > 1:
        raise ModelLoadError(
            f"{version_dir} holds {len(artifacts)} artifact folders; keep one per version"
        )
    raise ModelLoadError(
        f"{version_dir} holds no model: put model.onnx (or a ferry artifact folder) in it"
    )


def fingerprint(path: Path) -> tuple[Any, ...]:
    """What changes when a version's files change: names, sizes and modification times; for a
    ``ferry.json``, its content less what ferry writes there as it serves (:func:`_served_less`)."""
    if path.is_file():
        base, files = path.parent, [path]
    else:
        base, files = path, sorted(p for p in path.rglob("*") if p.is_file())
    out = []
    for p in files:
        if p.name.startswith(".ferry.json.") and p.name.endswith(".tmp"):
            continue  # graph.atomic_path's, renamed over ferry.json in a moment
        try:
            st = p.stat()
        except OSError:
            continue
        content = _served_less(p) if p.name == "ferry.json" else None
        out.append((str(p.relative_to(base)), content or (st.st_size, st.st_mtime_ns)))
    return tuple(out)


def _served_less(report: Path) -> str | None:
    """``report``'s JSON, canonical, less the fields ferry writes while serving (what live
    placement learned, the sizes found to run the model); None: not a JSON object."""
    try:
        data = json.loads(report.read_text(encoding="utf-8"))
        kept = {k: v for k, v in data.items() if k not in ("placement", "found_inputs")}
    except (OSError, ValueError, AttributeError):
        return None  # its size and time stand for it
    return json.dumps(kept, sort_keys=True)


@dataclasses.dataclass(frozen=True)
class VersionFiles:
    """One version folder as found on disk: its model, a fingerprint, or why it cannot load."""

    version: int
    path: Path | None
    fingerprint: tuple[Any, ...]
    error: str | None = None
