"""The model ``ferry deploy kserve`` puts in the container: what ``ferry serve`` would serve from
it, the files that go with it, and its copy in the image's build context.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

from ferry.deploy._generative import generative_section
from ferry.deploy._kserve_layout import ModelSource
from ferry.errors import ModelLoadError

__all__ = ["copy_model", "default_name", "read_source"]

logger = logging.getLogger(__name__)


def read_source(path: Path) -> ModelSource:
    """What ``ferry serve path`` serves, checked the way it checks it, and the files it reads."""
    from ferry.serving import find_model_file, list_models, model_name_for

    if not path.exists():
        raise ModelLoadError(f"model or repository not found: {path}")
    path = path.resolve()
    if path.is_file() or (path / "model.onnx").is_file():
        if path.is_file() and path.suffix.lower() != ".onnx":
            raise ModelLoadError(
                f"{path} is not an .onnx model; ferry deploy kserve takes what ferry serve "
                "takes: an .onnx file, an artifact folder or a model repository (convert other "
                "formats with ferry convert)"
            )
        if path.is_file():
            files = (Path(path.name), *_external_data(path))
            return ModelSource(path, "file", files, path.parent, (model_name_for(path),))
        _load_checked(path)
        name = model_name_for(path)
        section = generative_section(path)
        generative = {name: section} if section is not None else {}
        return ModelSource(path, "artifact", _tree(path), path, (name,), generative)
    if not path.is_dir():
        raise ModelLoadError(f"{path} is neither a file nor a folder")
    served = []
    generative = {}
    for model in list_models(path):
        versions = [v for v in (path / model).iterdir() if v.is_dir() and v.name.isdigit()]
        for version in versions:
            try:
                found = find_model_file(version)
            except ModelLoadError as e:
                logger.warning("%s", e)
                continue
            served.append(model)
            section = generative_section(found if found.is_dir() else found.parent)
            if section is not None:
                generative[model] = section
            break
    if not served:
        raise ModelLoadError(
            f"no models in {path}: a repository holds <model>/<version>/model.onnx (e.g. "
            "REPO/mlp/1/model.onnx); or pass a model file or an artifact folder"
        )
    return ModelSource(path, "repository", _tree(path), path, tuple(served), generative)


def _load_checked(path: Path) -> Any:
    from ferry.graph import load_model

    return load_model(path)


def _external_data(path: Path) -> list[Path]:
    """The external data files of the model at ``path``, relative to its folder: each must be a
    file in that folder (the image gets the folder's copy)."""
    from ferry.graph import external_files

    model = _load_checked(path)  # names the file itself when an initializer's data is missing
    try:
        locations = external_files(model, inside=path.parent)
    except ModelLoadError as e:  # its message names the tensor: add the model
        raise ModelLoadError(f"{path}: {e}") from None
    return [Path(location) for location in locations]


def _ignored(name: str) -> bool:
    return name.startswith(".") or name == "__pycache__"


def _tree(root: Path) -> tuple[Path, ...]:
    """Every file under ``root`` (dot entries and __pycache__ left out), relative to it."""
    out = []
    for folder, dirs, names in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not _ignored(d))
        for file in sorted(names):
            if not _ignored(file):
                out.append((Path(folder) / file).relative_to(root))
    return tuple(out)


def copy_model(src: ModelSource, dest: Path) -> None:
    """Copy the model into the build context: readable by the container's non-root user
    whatever the source's permissions (files 0644, folders 0755)."""
    base = dest if src.kind == "file" else dest / src.path.name
    for rel in src.files:
        target = base / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src.root / rel, target)
        target.chmod(0o644)
    for folder in [dest, *(p for p in dest.rglob("*") if p.is_dir())]:
        folder.chmod(0o755)


def default_name(path: Path) -> str:
    """A DNS-1035 label from the model's name: ``ResNet_50.onnx`` -> ``resnet-50``."""
    stem = path.stem if path.is_file() else path.name
    name = re.sub(r"[^a-z0-9]+", "-", stem.lower())
    name = re.sub(r"^[^a-z]+", "", name)[:63].rstrip("-")
    return name or "ferry-model"
