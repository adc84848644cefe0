"""``ferry deploy kserve``'s layout: the container's paths and port, the output folder's files,
the model as the container sees it (:class:`ModelSource`), and which folders may be written.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ferry.errors import InvalidInputError

__all__ = [
    "BASE_IMAGE",
    "CONSTRAINTS_FILE",
    "CONTAINER_PORT",
    "DEFAULT_REGISTRY",
    "DEFAULT_SECRET_KEY",
    "DOCKERFILE",
    "DRAIN_TIMEOUT_S",
    "GRPC_CONTAINER_PORT",
    "KSERVE_API_VERSION",
    "LIVENESS_PATH",
    "MANIFEST_FILE",
    "MARKER_FILE",
    "MODEL_DIR",
    "MODEL_MOUNT",
    "OUTPUT_FORMAT",
    "READINESS_PATH",
    "README_FILE",
    "USER_ID",
    "WHEEL_DIR",
    "ModelSource",
    "check_out_dir",
    "is_kserve_output",
]

KSERVE_API_VERSION = "serving.kserve.io/v1beta1"
#: KServe's HTTP port for a predictor container (its ``InferenceServiceDefaultHttpPort``).
CONTAINER_PORT = 8080
#: The predictor's gRPC port with ``--protocol grpc`` (KServe routes a port named ``h2c``).
GRPC_CONTAINER_PORT = 8081
#: Where KServe's storage initializer puts the model (and where a baked model goes too).
MODEL_MOUNT = "/mnt/models"
READINESS_PATH = "/v2/health/ready"
LIVENESS_PATH = "/v2/health/live"
#: The registry of the default image name: one Knative does not resolve tags in (its default
#: ``registries-skipping-tag-resolving``), and that no one can publish an image under.
DEFAULT_REGISTRY = "dev.local"

MANIFEST_FILE = "inferenceservice.yaml"
DOCKERFILE = "Dockerfile"
README_FILE = "README.txt"
CONSTRAINTS_FILE = "constraints.txt"
MARKER_FILE = "ferry-kserve.json"
MODEL_DIR = "model"
WHEEL_DIR = "wheels"
OUTPUT_FORMAT = "ferry-kserve/1"
BASE_IMAGE = "python:3.11-slim"
#: The container's user (numeric, so that Kubernetes' runAsNonRoot can check it).
USER_ID = 1000
#: ferry serve's drain on SIGTERM must end before Kubernetes' default 30 s grace period does.
DRAIN_TIMEOUT_S = 25
#: The key of the Kubernetes Secret that holds the API key, unless NAME:KEY says another.
DEFAULT_SECRET_KEY = "api-key"


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """The model as ferry serve will see it: its kind, the files to copy, its served names."""

    path: Path
    kind: str  # "file", "artifact" or "repository"
    files: tuple[Path, ...]  # relative to `root`
    root: Path  # what `files` are relative to
    served: tuple[str, ...]
    #: The generative models among ``served``: their manifests' ``generative`` sections.
    generative: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    @property
    def container_path(self) -> str:
        return f"{MODEL_MOUNT}/{self.path.name}"

    def size(self) -> int:
        return sum((self.root / f).stat().st_size for f in self.files)


# -- the output folder ----------------------------------------------------------------------------


def is_kserve_output(folder: Path) -> bool:
    """Whether ``folder`` holds an earlier ``ferry deploy kserve`` output (its marker says so)."""
    try:
        marker = json.loads((folder / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("format") == OUTPUT_FORMAT


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_out_dir(out: Path, src: ModelSource, force: bool) -> None:
    """Refuse an output folder that holds or lies in the model, is a file, or holds other
    files than an earlier output (unless ``force``).

    Raises:
        InvalidInputError: naming the folder and what to do instead.
    """
    resolved = out.resolve()
    if _within(src.path, resolved):
        raise InvalidInputError(
            f"output folder {out} holds the model {src.path}, which it would replace; choose "
            "another folder"
        )
    if src.kind != "file" and _within(resolved, src.path):
        raise InvalidInputError(
            f"output folder {out} lies inside the model folder {src.path}; choose a folder "
            "outside it"
        )
    if out.exists() and not out.is_dir():
        raise InvalidInputError(f"{out} is a file; ferry deploy kserve writes a folder (-o DIR/)")
    if out.is_dir() and any(out.iterdir()) and not is_kserve_output(out) and not force:
        raise InvalidInputError(
            f"output folder {out} is not empty and holds no earlier ferry deploy kserve output; "
            "choose a new folder, or pass --force (force=True) to replace everything in it"
        )
