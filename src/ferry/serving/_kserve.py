"""``ferry deploy kserve``: a KServe InferenceService whose predictor is ``ferry serve``.

KServe runs a *custom predictor* as the container ``kserve-container`` of
``spec.predictor.containers`` (serving.kserve.io/v1beta1). ferry writes, into one output folder:

- ``inferenceservice.yaml``: the InferenceService. Its container runs ``ferry serve MODEL --host
  0.0.0.0 --port 8080`` (KServe's HTTP port, named ``http1``: ferry serve speaks HTTP/1.1, not
  h2c), with ``PROTOCOL=v2`` (how a custom predictor declares the Open Inference Protocol: the
  ``protocolVersion`` field belongs to the built-in model specs, which a custom container is
  not), readiness on ``/v2/health/ready`` (400 until every model loaded and warmed up), liveness
  on ``/v2/health/live`` (200 as soon as the server listens, models loading or not), resources
  and replicas.
- ``Dockerfile``: the predictor image. python:3.11-slim, ferry with its ``serve`` extra (and the
  extras of the engines asked for) from a wheel built from this checkout, installed under
  ``constraints.txt`` (the versions of ferry's dependencies installed here, the ones it was
  tested with), a non-root user, ``EXPOSE 8080`` and the same command as ``CMD``.
- ``README.txt``: how to build, push, upload the model, apply and query.
- ``ferry-kserve.json``: what was written, so that a later run may replace the folder.

Where the model lives in the container: ``/mnt/models/<MODEL's name>`` (the file, the artifact
folder or the repository folder, under its own name), so that a model is served under the same
name as ``ferry serve MODEL`` gives it here. Either

- the model is baked into the image (the default): it is copied into the folder's ``model/``
  (an ``.onnx`` file with its external data files, or the artifact or repository folder) and the
  Dockerfile copies that to ``/mnt/models/``; or
- ``storage_uri`` names where KServe's storage initializer downloads it from (``s3://``,
  ``gs://``, ``pvc://``, ``https://``...): the ``STORAGE_URI`` environment variable of a custom
  container (KServe's documented way; the built-in predictors' ``storageUri`` field), downloaded
  to ``/mnt/models`` before the container starts. The URI names the folder that holds MODEL
  under its own name (for a single ``.onnx`` file without external data, the file itself also
  does).

The user's model is only read. The folder is written atomically: built beside it, then renamed
into place; a non-empty folder that is not an earlier output is refused unless ``force``.
"""

from __future__ import annotations

import dataclasses
import decimal
import hashlib
import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ferry._folders import publish_dir, staging_dir
from ferry._version import __version__
from ferry.errors import FerryError, InvalidInputError, ModelLoadError

__all__ = [
    "CONTAINER_PORT",
    "DEFAULT_REGISTRY",
    "KSERVE_API_VERSION",
    "LIVENESS_PATH",
    "MODEL_MOUNT",
    "READINESS_PATH",
    "KServeDeployment",
    "build_wheel",
    "is_kserve_output",
    "kserve_manifests",
]

logger = logging.getLogger(__name__)

KSERVE_API_VERSION = "serving.kserve.io/v1beta1"
#: KServe's HTTP port for a predictor container (its ``InferenceServiceDefaultHttpPort``).
CONTAINER_PORT = 8080
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

#: The ferry extra that installs each built-in engine in the image (none: a core dependency).
_BACKEND_EXTRAS: dict[str, str | None] = {
    "onnxruntime": None,
    "openvino": "openvino",
    "tensorrt": "tensorrt",
    "litert": "tflite",
    "auto": None,
}
_GPU_BACKENDS = ("tensorrt",)
#: The URI schemes KServe's default storage initializer downloads (others need a
#: ClusterStorageContainer of the cluster's own).
_STORAGE_SCHEMES = ("s3", "gs", "pvc", "http", "https", "hdfs", "webhdfs", "hf", "oci")

_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS_1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_CPU = re.compile(r"(?P<number>\d+(?:\.\d+)?|\.\d+)(?P<suffix>m)?")
_MEMORY = re.compile(r"(?P<number>\d+(?:\.\d+)?|\.\d+)(?P<suffix>[KMGTPE]i|[kMGTPE])?")
_SUFFIX: dict[str, decimal.Decimal | int] = {
    "": 1,
    "m": decimal.Decimal("0.001"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(
    rf"(?:[A-Za-z0-9.-]+(?::\d+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)


@dataclasses.dataclass(frozen=True)
class KServeDeployment:
    """What :func:`kserve_manifests` wrote.

    Attributes:
        out_dir: the output folder.
        name: the InferenceService's name.
        namespace: its namespace (None: kubectl's current one).
        image: the predictor image the manifest names (build it from ``out_dir``).
        command: the predictor container's command and arguments (the Dockerfile's CMD too).
        model_path: where the model is in the container.
        served_models: the model names ferry serve answers under (``/v2/models/NAME``).
        storage_uri: where KServe downloads the model from; None when it is in the image.
        wheel: the ferry wheel in ``out_dir`` (None when it was not built: see the README).
        manifest: the InferenceService as a dict (what ``inferenceservice.yaml`` holds).
        files: the files written, relative to ``out_dir``.
    """

    out_dir: Path
    name: str
    namespace: str | None
    image: str
    command: tuple[str, ...]
    model_path: str
    served_models: tuple[str, ...]
    storage_uri: str | None
    wheel: Path | None
    manifest: dict[str, Any]
    files: tuple[str, ...]

    @property
    def manifest_path(self) -> Path:
        return self.out_dir / MANIFEST_FILE

    @property
    def dockerfile(self) -> Path:
        return self.out_dir / DOCKERFILE

    @property
    def readme(self) -> Path:
        return self.out_dir / README_FILE

    def lines(self) -> list[str]:
        """A short human-readable report (the CLI prints it)."""
        ns = f" -n {self.namespace}" if self.namespace else ""
        where = f"KServe downloads {self.storage_uri}" if self.storage_uri else "in the image"
        steps = [] if self.wheel else [f"build ferry's wheel into {self.out_dir / WHEEL_DIR}"]
        steps += [
            f"docker build -t {self.image} {self.out_dir}",
            f"kind load docker-image {self.image}"
            if self.image.startswith(f"{DEFAULT_REGISTRY}/")
            else f"docker push {self.image}",
            f"kubectl apply{ns} -f {self.manifest_path}",
        ]
        return [
            f"InferenceService {self.name!r} ({KSERVE_API_VERSION}) written to {self.out_dir}: "
            f"{MANIFEST_FILE}, {DOCKERFILE}, {README_FILE} ({len(self.files)} files)",
            f"predictor: {' '.join(self.command)}",
            f"model {self.model_path} ({where}), served as {', '.join(self.served_models)}",
            f"image {self.image}",
            "next: " + " && ".join(steps) + f" (see {README_FILE})",
        ]


@dataclasses.dataclass(frozen=True)
class _Source:
    """The model as ferry serve will see it: its kind, the files to copy, its served names."""

    path: Path
    kind: str  # "file", "artifact" or "repository"
    files: tuple[Path, ...]  # relative to `root`
    root: Path  # what `files` are relative to
    served: tuple[str, ...]

    @property
    def container_path(self) -> str:
        return f"{MODEL_MOUNT}/{self.path.name}"

    def size(self) -> int:
        return sum((self.root / f).stat().st_size for f in self.files)


def kserve_manifests(
    source: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    name: str | None = None,
    namespace: str | None = None,
    storage_uri: str | None = None,
    image: str | None = None,
    replicas: int | None = None,
    autoscale: tuple[int, int] | str | None = None,
    cpu: str = "1",
    memory: str | None = None,
    gpu: int = 0,
    backends: str | Sequence[str] | None = None,
    precision: str | None = None,
    optimize: str | None = None,
    api_key_secret: str | None = None,
    force: bool = False,
    wheel: bool | str | os.PathLike[str] = True,
) -> KServeDeployment:
    """Write a KServe InferenceService running ``ferry serve`` on ``source`` (see the module doc).

    Args:
        source: an ``.onnx`` file (its external data files beside it), an artifact folder
            (``model.onnx`` inside) or a model repository (``REPO/<model>/<version>/model.onnx``):
            what ``ferry serve`` takes. It is only read.
        out_dir: the folder to write. It must not exist, be empty, or hold an earlier output
            (which is replaced), unless ``force``.
        name: the InferenceService's name, a DNS-1035 label (lowercase letters, digits and
            '-', starting with a letter, at most 63 characters); None: made from the model's.
        namespace: its namespace (None: none written, kubectl's current one applies).
        storage_uri: where KServe downloads the model from (``s3://bucket/models``, ``pvc://
            claim/models``, ...): the folder that holds the model under its own name. None: the
            model is baked into the image.
        image: the predictor image's reference (None: ``dev.local/ferry-<name>:<tag>``, a name
            Knative does not resolve, for kind/minikube; give your registry's for a cluster).
        replicas: a fixed number of replicas (minReplicas = maxReplicas); not with ``autoscale``.
        autoscale: ``(min, max)`` or ``"MIN,MAX"`` replicas (min 0: scale to zero, on Knative).
            Neither: one replica.
        cpu: ``"REQUEST"`` or ``"REQUEST,LIMIT"`` in Kubernetes CPU units (``"2"``, ``"500m"``);
            one value is both (whole CPUs then give the pod Guaranteed QoS).
        memory: ``"REQUEST"`` or ``"REQUEST,LIMIT"`` (``"2Gi"``, ``"512Mi"``); None: 1 GiB plus
            three times the model's size (the model, its engine, a second instance).
        gpu: NVIDIA GPUs (the limit ``nvidia.com/gpu``); only the ``tensorrt`` engine uses one.
        backends: engines for ``ferry serve --backends`` (their ferry extras go into the image).
        precision: ``ferry serve --precision`` (fp32, bf16, fp16, int8).
        optimize: ``ferry serve --optimize`` (none, basic, extended).
        api_key_secret: ``NAME`` or ``NAME:KEY`` of a Kubernetes Secret whose key (default
            ``api-key``) holds the API key: the container gets it as ``FERRY_API_KEY``, and ferry
            serve then asks for ``Authorization: Bearer KEY`` on inference (health stays open).
        force: replace ``out_dir`` even when it holds other files.
        wheel: True: build ferry's wheel from this checkout into ``wheels/`` (``pip wheel
            --no-deps``, about a second); a path: copy that ferry wheel; False: write no wheel
            (the README says the one command that makes it before ``docker build``).

    Returns:
        What was written (:class:`KServeDeployment`).

    Raises:
        ModelLoadError: ``source`` is missing or not a model, artifact or repository.
        InvalidInputError: a bad option (name, resources, replicas, URI, image, backends...),
            or ``out_dir`` holds other files, or would hold the model it is made from.
        FerryError: ferry's wheel could not be built.
    """
    src = _read_source(Path(source))
    out = Path(out_dir)
    _check_out_dir(out, src, force)
    name = _check_name(name) if name is not None else _default_name(src.path)
    if namespace is not None and not (len(namespace) <= 63 and _DNS_1123.fullmatch(namespace)):
        raise InvalidInputError(
            f"namespace {namespace!r} is not a valid Kubernetes namespace: lowercase letters, "
            "digits and '-', starting and ending with a letter or digit, at most 63 characters"
        )
    if storage_uri is not None:
        storage_uri = _check_storage_uri(storage_uri)
    min_replicas, max_replicas = _replicas(replicas, autoscale)
    resources = _resources(cpu, memory if memory is not None else _default_memory(src), gpu)
    backend_names, extras = _backends(backends, gpu)
    if precision is not None:
        from ferry.serving._config import check_precision

        check_precision(precision, "precision")
    if optimize is not None:
        from ferry.serving._config import check_optimize

        check_optimize(optimize, "optimize")
    secret = _secret(api_key_secret) if api_key_secret is not None else None
    if image is not None and not _IMAGE.fullmatch(image):
        raise InvalidInputError(
            f"image {image!r} is not an image reference; give REGISTRY/REPOSITORY[:TAG], e.g. "
            "ghcr.io/me/mlp:1 (repository in lowercase)"
        )
    wheel_file = _check_wheel_file(Path(wheel)) if not isinstance(wheel, bool) else None

    command = _command(src, backend_names, precision, optimize)
    staging = staging_dir(out)
    try:
        files: list[str] = []
        built: Path | None = None
        if wheel is True:
            built = build_wheel(staging / WHEEL_DIR)
        elif wheel_file is not None:
            (staging / WHEEL_DIR).mkdir()
            built = staging / WHEEL_DIR / wheel_file.name
            shutil.copyfile(wheel_file, built)
        wheel_name = built.name if built is not None else _expected_wheel_name()
        (staging / CONSTRAINTS_FILE).write_text(_constraints(extras), encoding="utf-8")
        if storage_uri is None:
            _copy_model(src, staging / MODEL_DIR)
        dockerfile = _dockerfile(name, command, wheel_name, extras, baked=storage_uri is None)
        (staging / DOCKERFILE).write_text(dockerfile, encoding="utf-8")
        if image is None:
            image = f"{DEFAULT_REGISTRY}/ferry-{name}:{_tag(staging)}"
        manifest = _inference_service(
            name=name,
            namespace=namespace,
            image=image,
            command=command,
            storage_uri=storage_uri,
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            resources=resources,
            secret=secret,
        )
        (staging / MANIFEST_FILE).write_text(_yaml(manifest), encoding="utf-8")
        readme = _readme(
            src=src,
            name=name,
            namespace=namespace,
            image=image,
            storage_uri=storage_uri,
            wheel_name=None if built is not None else wheel_name,
            secret=secret,
        )
        (staging / README_FILE).write_text(readme, encoding="utf-8")
        files = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file())
        marker = {
            "format": OUTPUT_FORMAT,
            "ferry_version": __version__,
            "name": name,
            "namespace": namespace,
            "image": image,
            "source": str(src.path),
            "source_kind": src.kind,
            "model_path": src.container_path,
            "served_models": list(src.served),
            "storage_uri": storage_uri,
            "command": command,
            "files": [*files, MARKER_FILE],
        }
        (staging / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        publish_dir(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("wrote the KServe InferenceService %r into %s", name, out)
    return KServeDeployment(
        out_dir=out,
        name=name,
        namespace=namespace,
        image=image,
        command=tuple(command),
        model_path=src.container_path,
        served_models=src.served,
        storage_uri=storage_uri,
        wheel=out / WHEEL_DIR / built.name if built is not None else None,
        manifest=manifest,
        files=tuple([*files, MARKER_FILE]),
    )


# -- the model ----------------------------------------------------------------------------------


def _read_source(path: Path) -> _Source:
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
            return _Source(path, "file", files, path.parent, (model_name_for(path),))
        _load_checked(path)
        return _Source(path, "artifact", _tree(path), path, (model_name_for(path),))
    if not path.is_dir():
        raise ModelLoadError(f"{path} is neither a file nor a folder")
    served = []
    for model in list_models(path):
        versions = [v for v in (path / model).iterdir() if v.is_dir() and v.name.isdigit()]
        for version in versions:
            try:
                find_model_file(version)
            except ModelLoadError as e:
                logger.warning("%s", e)
                continue
            served.append(model)
            break
    if not served:
        raise ModelLoadError(
            f"no models in {path}: a repository holds <model>/<version>/model.onnx (e.g. "
            "REPO/mlp/1/model.onnx); or pass a model file or an artifact folder"
        )
    return _Source(path, "repository", _tree(path), path, tuple(served))


def _load_checked(path: Path) -> Any:
    from ferry.graph import load_model

    return load_model(path)


def _external_data(path: Path) -> list[Path]:
    """The external data files of the model at ``path``, relative to its folder."""
    import onnx_ir as ir

    model = _load_checked(path)
    tensors: list[Any] = []
    graphs = [model.graph, *model.graph.subgraphs()]
    for graph in graphs:
        tensors.extend(v.const_value for v in graph.initializers.values())
    nodes = [*model.graph.all_nodes()]
    for function in model.functions.values():
        nodes.extend(function)
    for node in nodes:
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.TENSOR:
                tensors.append(attr.value)
            elif attr.type == ir.AttributeType.TENSORS:
                tensors.extend(attr.value)
    locations: dict[str, Path] = {}
    for tensor in tensors:
        if not isinstance(tensor, ir.ExternalTensor):
            continue
        location = Path(tensor.location)
        if location.is_absolute() or ".." in location.parts:
            raise ModelLoadError(
                f"{path} keeps weights in {tensor.location!r}, outside its own folder; save it "
                "with its external data beside it (ferry convert MODEL -o NEW.onnx does)"
            )
        if not (path.parent / location).is_file():
            raise ModelLoadError(
                f"{path} keeps weights in external data file {tensor.location!r}, which is "
                "missing; copy it next to the model"
            )
        locations[location.as_posix()] = location
    return [locations[k] for k in sorted(locations)]


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


def _copy_model(src: _Source, dest: Path) -> None:
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


def _default_name(path: Path) -> str:
    """A DNS-1035 label from the model's name: ``ResNet_50.onnx`` -> ``resnet-50``."""
    stem = path.stem if path.is_file() else path.name
    name = re.sub(r"[^a-z0-9]+", "-", stem.lower())
    name = re.sub(r"^[^a-z]+", "", name)[:63].rstrip("-")
    return name or "ferry-model"


def _check_name(name: str) -> str:
    if len(name) > 63 or not _DNS_1035.fullmatch(name):
        raise InvalidInputError(
            f"InferenceService name {name!r} is not a DNS-1035 label: use lowercase letters, "
            "digits and '-', starting with a letter and ending with a letter or digit, at most "
            "63 characters (e.g. 'resnet-50')"
        )
    return name


# -- options ------------------------------------------------------------------------------------


def _check_storage_uri(uri: str) -> str:
    match = re.fullmatch(r"([a-z][a-z0-9+.-]*)://\S+", uri)
    if not match:
        raise InvalidInputError(
            f"storage URI {uri!r} is not a URI KServe downloads from; give one such as "
            "s3://bucket/models, gs://bucket/models, pvc://claim/models or https://host/model.tar.gz"
        )
    if match.group(1) not in _STORAGE_SCHEMES:
        logger.warning(
            "storage URI scheme %r is not one KServe's default storage initializer downloads "
            "(%s): the cluster needs a ClusterStorageContainer for it",
            match.group(1),
            ", ".join(_STORAGE_SCHEMES),
        )
    return uri


def _replicas(replicas: int | None, autoscale: tuple[int, int] | str | None) -> tuple[int, int]:
    if replicas is not None and autoscale is not None:
        raise InvalidInputError("give either replicas (a fixed number) or autoscale MIN,MAX")
    if replicas is not None:
        if type(replicas) is not int or replicas < 1:
            raise InvalidInputError(f"replicas must be an integer >= 1, got {replicas!r}")
        return replicas, replicas
    if autoscale is None:
        return 1, 1
    if isinstance(autoscale, str):
        parts = autoscale.split(",")
        try:
            low, high = (int(p) for p in parts)
        except ValueError:
            raise InvalidInputError(
                f"autoscale takes MIN,MAX replicas as two integers, e.g. 1,4, got {autoscale!r}"
            ) from None
    else:
        low, high = autoscale
    if low < 0 or high < 1 or low > high:
        raise InvalidInputError(
            f"autoscale MIN,MAX needs 0 <= MIN <= MAX and MAX >= 1, got {low},{high}"
        )
    return low, high


def _quantity(text: str, what: str, pattern: re.Pattern[str], example: str) -> decimal.Decimal:
    match = pattern.fullmatch(text)
    if not match:
        raise InvalidInputError(f"{what} {text!r} is not a Kubernetes quantity; e.g. {example}")
    value = decimal.Decimal(match.group("number")) * _SUFFIX[match.group("suffix") or ""]
    if value <= 0:
        raise InvalidInputError(f"{what} must be more than 0, got {text!r}")
    return value


def _request_limit(text: str, what: str, pattern: re.Pattern[str], example: str) -> tuple[str, str]:
    parts = [p.strip() for p in text.split(",")]
    if len(parts) not in (1, 2):
        raise InvalidInputError(f"{what} takes REQUEST or REQUEST,LIMIT, got {text!r}")
    values = [_quantity(p, what, pattern, example) for p in parts]
    if len(values) == 2 and values[1] < values[0]:
        raise InvalidInputError(f"{what} limit {parts[1]} is below its request {parts[0]}")
    return parts[0], parts[-1]


def _resources(cpu: str, memory: str, gpu: int) -> dict[str, dict[str, str]]:
    cpu_req, cpu_lim = _request_limit(cpu, "cpu", _CPU, "2, 500m or 1,4 (request,limit)")
    mem_req, mem_lim = _request_limit(
        memory, "memory", _MEMORY, "4Gi, 512Mi or 2Gi,4Gi (request,limit)"
    )
    if type(gpu) is not int or gpu < 0:
        raise InvalidInputError(f"gpu must be a whole number of GPUs >= 0, got {gpu!r}")
    limits = {"cpu": cpu_lim, "memory": mem_lim}
    if gpu:
        # An extended resource is asked for by its limit; Kubernetes makes the request equal.
        limits["nvidia.com/gpu"] = str(gpu)
    return {"requests": {"cpu": cpu_req, "memory": mem_req}, "limits": limits}


def _default_memory(src: _Source) -> str:
    mib = 1024 + 3 * src.size() / 2**20
    return f"{math.ceil(mib / 256) * 256}Mi"


def _backends(backends: str | Sequence[str] | None, gpu: int) -> tuple[list[str], list[str]]:
    """The engine names (as ``--backends`` takes them) and the ferry extras the image needs."""
    from ferry.backends import known_backends, parse_backends

    names = parse_backends(backends) if backends is not None else []
    known = set(known_backends()) | set(_BACKEND_EXTRAS)
    extras = ["serve"]
    for backend in names:
        if backend not in known:
            raise InvalidInputError(
                f"unknown backend {backend!r}; known backends: {', '.join(sorted(known))}"
            )
        if backend not in _BACKEND_EXTRAS:
            logger.warning(
                "backend %r comes from another package than ferry: add that package to the "
                "Dockerfile's pip install, or the predictor will not load the model",
                backend,
            )
            continue
        extra = _BACKEND_EXTRAS[backend]
        if extra and extra not in extras:
            extras.append(extra)
    if gpu and not any(b in _GPU_BACKENDS for b in names):
        logger.warning(
            "%d GPU(s) asked for, but only the %s engine runs on one: add --backends "
            "tensorrt,onnxruntime, or the GPU stays idle",
            gpu,
            "/".join(_GPU_BACKENDS),
        )
    if not gpu and any(b in _GPU_BACKENDS for b in names):
        logger.warning("the tensorrt engine needs an NVIDIA GPU: ask for one (gpu=1, --gpu 1)")
    return names, extras


def _secret(text: str) -> tuple[str, str]:
    secret, _, key = text.partition(":")
    key = key or DEFAULT_SECRET_KEY
    if not (len(secret) <= 253 and _DNS_1123.fullmatch(secret)) or not _SECRET_KEY.fullmatch(key):
        raise InvalidInputError(
            f"api key secret {text!r} is not NAME or NAME:KEY of a Kubernetes Secret (NAME: "
            "lowercase letters, digits and '-'; KEY: letters, digits, '-', '_', '.')"
        )
    return secret, key


def _command(
    src: _Source, backends: list[str], precision: str | None, optimize: str | None
) -> list[str]:
    command = ["ferry", "serve", src.container_path, "--host", "0.0.0.0"]
    command += ["--port", str(CONTAINER_PORT), "--drain-timeout", str(DRAIN_TIMEOUT_S)]
    if backends:
        command += ["--backends", ",".join(backends)]
    if precision is not None:
        command += ["--precision", precision]
    if optimize is not None and optimize != "none":
        command += ["--optimize", optimize]
    return command


# -- ferry's wheel and its dependencies ---------------------------------------------------------


def _project_root() -> Path | None:
    """The source checkout ferry runs from (src layout), or None for an installed ferry."""
    root = Path(__file__).resolve().parents[3]  # <root>/src/ferry/serving/_kserve.py
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and re.search(
        r'(?m)^name\s*=\s*"ferry"', pyproject.read_text(encoding="utf-8")
    ):
        return root
    return None


def build_wheel(dest: Path) -> Path:
    """Build ferry's wheel from its source checkout into ``dest`` (``pip wheel --no-deps``).

    The sources are copied to a temporary folder first, so that the build leaves nothing in the
    checkout (setuptools writes ``build/`` and ``*.egg-info`` beside its sources) and concurrent
    builds do not meet.

    Raises:
        FerryError: ferry is not running from a source checkout, or the build failed.
    """
    root = _project_root()
    if root is None:
        raise FerryError(
            "cannot build ferry's wheel: ferry is installed, not running from its source "
            "checkout; pass a ferry wheel (--wheel FILE) or --no-wheel"
        )
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ferry-wheel-") as tmp:
        tree = Path(tmp) / "src-tree"
        tree.mkdir()
        for item in root.iterdir():
            if item.is_file() and (
                item.name in ("pyproject.toml", "setup.cfg", "setup.py", "MANIFEST.in")
                or item.name.upper().startswith(("README", "LICENSE", "NOTICE"))
            ):
                shutil.copyfile(item, tree / item.name)
        shutil.copytree(
            root / "src",
            tree / "src",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".*"),
        )
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(dest)]
        try:
            import setuptools  # noqa: F401  (present: build here, without fetching it again)

            cmd.append("--no-build-isolation")
        except ImportError:
            pass
        try:
            done = subprocess.run(
                [*cmd, str(tree)], capture_output=True, text=True, timeout=600, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise FerryError(f"building ferry's wheel failed: {e}") from e
        if done.returncode != 0:
            tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            raise FerryError(f"building ferry's wheel (pip wheel {root}) failed: {tail}")
    wheels = sorted(dest.glob("ferry-*.whl"))
    if len(wheels) != 1:
        raise FerryError(f"building ferry's wheel left {len(wheels)} wheels in {dest}")
    logger.info("built %s", wheels[0])
    return wheels[0]


def _check_wheel_file(path: Path) -> Path:
    if not path.is_file() or not re.fullmatch(r"ferry-[^-]+-.+\.whl", path.name):
        raise InvalidInputError(
            f"{path} is not a ferry wheel (ferry-VERSION-...whl); make one with "
            "`pip wheel --no-deps -w DIR CHECKOUT`, or leave the wheel out to build it"
        )
    return path


def _expected_wheel_name() -> str:
    """The name ``pip wheel`` gives ferry's wheel (a pure-Python wheel of this version)."""
    try:
        from packaging.version import Version

        version = str(Version(__version__))
    except ImportError:
        version = __version__
    return f"ferry-{version.replace('-', '_')}-py3-none-any.whl"


def _constraints(extras: list[str]) -> str:
    """Pins (``name==version``) of ferry's dependencies with these extras, as installed here."""
    head = (
        "# The versions of ferry's dependencies installed where this was written (ferry's tests\n"
        "# ran against them); the Dockerfile installs under these constraints.\n"
    )
    try:
        pins = sorted(_installed_closure(extras).items())
    except ImportError:  # no `packaging` to read requirements with: leave the versions free
        logger.warning("cannot read ferry's requirements (no 'packaging'); versions left free")
        pins = []
    return head + "".join(f"{name}=={version}\n" for name, version in pins)


def _installed_closure(extras: list[str]) -> dict[str, str]:
    from importlib import metadata

    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    pins: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    queue: list[tuple[str, frozenset[str]]] = [("ferry", frozenset(extras))]
    while queue:
        name, wanted = queue.pop()
        if (name, wanted) in seen:
            continue
        seen.add((name, wanted))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        key = canonicalize_name(dist.metadata["Name"])
        version = dist.version
        if key != "ferry" and "+" not in version:  # a local build (2.1+cpu) is on no index
            pins[key] = version
        for text in dist.requires or []:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            environments = [{"extra": e} for e in sorted(wanted)] or [{"extra": ""}]
            if req.marker is not None and not any(req.marker.evaluate(e) for e in environments):
                continue
            queue.append((canonicalize_name(req.name), frozenset(req.extras)))
    return pins


# -- the files ----------------------------------------------------------------------------------


def _dockerfile(
    name: str, command: list[str], wheel_name: str, extras: list[str], *, baked: bool
) -> str:
    wheel = f"/tmp/ferry/{wheel_name}"
    spec = f"{wheel}[{','.join(extras)}]"
    lines = [
        f"# The predictor image of the KServe InferenceService {name!r}: ferry serve (KServe v2,",
        f"# the Open Inference Protocol) on port {CONTAINER_PORT}. Written by `ferry deploy "
        f"kserve` (ferry {__version__}).",
        "# Build it from this folder: docker build -t IMAGE .   (see README.txt)",
        f"FROM {BASE_IMAGE}",
        "ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \\",
        "    PIP_DISABLE_PIP_VERSION_CHECK=1 FERRY_CACHE_DIR=/tmp/ferry-cache",
        f"COPY {CONSTRAINTS_FILE} {WHEEL_DIR}/{wheel_name} /tmp/ferry/",
        f"RUN pip install --constraint /tmp/ferry/{CONSTRAINTS_FILE} {_sh_quote(spec)} \\",
        "    && rm -rf /tmp/ferry",
        f"RUN useradd --uid {USER_ID} --user-group --create-home --home-dir /home/ferry ferry",
    ]
    if baked:
        lines.append(f"COPY {MODEL_DIR}/ {MODEL_MOUNT}/")
    else:
        lines.append(f"# The model is not in the image: KServe downloads it to {MODEL_MOUNT}.")
    lines += [
        f"USER {USER_ID}:{USER_ID}",
        "WORKDIR /home/ferry",
        f"EXPOSE {CONTAINER_PORT}",
        f"CMD {json.dumps(command)}",
        "",
    ]
    return "\n".join(lines)


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _tag(staging: Path) -> str:
    """The image tag: ferry's version and a hash of the build context (what goes into the image),
    so that an image with another model or ferry gets another tag (no stale IfNotPresent pull)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in staging.rglob("*") if p.is_file()):
        digest.update(path.relative_to(staging).as_posix().encode() + b"\0")
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    version = re.sub(r"[^A-Za-z0-9_.-]", "-", __version__)
    return f"{version}-{digest.hexdigest()[:12]}"


def _inference_service(
    *,
    name: str,
    namespace: str | None,
    image: str,
    command: list[str],
    storage_uri: str | None,
    min_replicas: int,
    max_replicas: int,
    resources: dict[str, dict[str, str]],
    secret: tuple[str, str] | None,
) -> dict[str, Any]:
    env: list[dict[str, Any]] = [{"name": "PROTOCOL", "value": "v2"}]
    if storage_uri is not None:
        env.append({"name": "STORAGE_URI", "value": storage_uri})
    if secret is not None:
        env.append(
            {
                "name": "FERRY_API_KEY",
                "valueFrom": {"secretKeyRef": {"name": secret[0], "key": secret[1]}},
            }
        )
    container: dict[str, Any] = {
        "name": "kserve-container",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": command[:2],
        "args": command[2:],
        "env": env,
        "ports": [{"name": "http1", "containerPort": CONTAINER_PORT, "protocol": "TCP"}],
        # Ready once every model loaded and warmed up: that may take a while, and failing here
        # only holds traffic back.
        "readinessProbe": {
            "httpGet": {"path": READINESS_PATH, "port": CONTAINER_PORT},
            "initialDelaySeconds": 5,
            "periodSeconds": 5,
            "timeoutSeconds": 3,
            "failureThreshold": 3,
        },
        # Live as soon as the server listens (models load in the background): a restart only
        # after a minute and a half without an answer, never for a model still loading.
        "livenessProbe": {
            "httpGet": {"path": LIVENESS_PATH, "port": CONTAINER_PORT},
            "initialDelaySeconds": 30,
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 6,
        },
        "resources": resources,
        "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False},
    }
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": KSERVE_API_VERSION,
        "kind": "InferenceService",
        "metadata": metadata,
        "spec": {
            "predictor": {
                "minReplicas": min_replicas,
                "maxReplicas": max_replicas,
                "containers": [container],
            }
        },
    }


def _yaml(manifest: dict[str, Any]) -> str:
    import yaml

    head = (
        "# Written by `ferry deploy kserve`: a KServe InferenceService whose predictor runs\n"
        "# ferry serve (KServe v2). Build and push its image first (README.txt), then:\n"
        f"#   kubectl apply -f {MANIFEST_FILE}\n"
    )
    return head + yaml.safe_dump(manifest, sort_keys=False, default_flow_style=False)


def _readme(
    *,
    src: _Source,
    name: str,
    namespace: str | None,
    image: str,
    storage_uri: str | None,
    wheel_name: str | None,
    secret: tuple[str, str] | None,
) -> str:
    ns = f" -n {namespace}" if namespace else ""
    model = src.served[0]
    lines = [
        f"KServe InferenceService {name!r}: ferry serve (KServe v2 / Open Inference Protocol)",
        f"serving {src.path} ({src.kind}) as {', '.join(src.served)}.",
        "",
        "Files",
        f"  {MANIFEST_FILE:<24}the InferenceService ({KSERVE_API_VERSION})",
        f"  {DOCKERFILE:<24}the predictor image: {BASE_IMAGE}, ferry[serve], non-root, port "
        f"{CONTAINER_PORT}",
        f"  {WHEEL_DIR + '/':<24}ferry's wheel, built from its source",
        f"  {CONSTRAINTS_FILE:<24}the versions of ferry's dependencies it was tested with",
    ]
    if storage_uri is None:
        lines.append(
            f"  {MODEL_DIR + '/':<24}the model, copied into the image at {src.container_path}"
        )
    lines += ["", "Steps (from this folder)"]
    step = 1
    if wheel_name is not None:
        checkout = _project_root() or "/path/to/ferry-checkout"
        lines += [
            f"{step}. Build ferry's wheel into {WHEEL_DIR}/ (the Dockerfile installs "
            f"{WHEEL_DIR}/{wheel_name}):",
            f"     pip wheel --no-deps -w {WHEEL_DIR} {checkout}",
        ]
        step += 1
    lines += [
        f"{step}. Build the image and push it where the cluster pulls from:",
        f"     docker build -t {image} .",
    ]
    if image.startswith(f"{DEFAULT_REGISTRY}/"):
        lines += [
            "     # on kind: kind load docker-image IMAGE; on minikube: minikube image load IMAGE.",
            "     # For a registry, write this folder again with --image REGISTRY/NAME:TAG, then",
            "     # docker push REGISTRY/NAME:TAG.",
        ]
    else:
        lines.append(f"     docker push {image}")
    step += 1
    if storage_uri is not None:
        there = src.path.name
        lines += [
            f"{step}. Upload the model: KServe downloads {storage_uri} to {MODEL_MOUNT} before the",
            f"   predictor starts, and ferry serves {src.container_path}: the URI must name the",
            f"   folder that holds {there!r} under that name"
            + (
                " (or the .onnx file itself, if it has no external data)."
                if src.kind == "file"
                else "."
            ),
        ]
        if storage_uri.startswith(("s3://", "gs://")):
            tool = "aws s3 cp" if storage_uri.startswith("s3://") else "gcloud storage cp"
            target = storage_uri.rstrip("/") + "/"
            if src.kind == "file":
                for rel in src.files:
                    lines.append(f"     {tool} {src.root / rel} {target}{rel.as_posix()}")
            else:
                lines.append(f"     {tool} --recursive {src.path} {target}{there}")
        lines.append(
            "   Credentials: a Secret and ServiceAccount as KServe's storage docs say "
            "(then add serviceAccountName to the predictor)."
        )
        step += 1
    if secret is not None:
        lines += [
            f"{step}. Create the API key's Secret (the predictor reads FERRY_API_KEY from it):",
            f"     kubectl create secret generic {secret[0]}{ns} "
            f'--from-literal={secret[1]}="$FERRY_API_KEY"',
        ]
        step += 1
    lines += [
        f"{step}. Apply it and wait for READY (the model loads and warms up first):",
        f"     kubectl apply{ns} -f {MANIFEST_FILE}",
        f"     kubectl get inferenceservice {name}{ns}",
        "",
        "Query it (tritonclient, perf_analyzer and curl speak the same protocol):",
        f"  URL=$(kubectl get inferenceservice {name}{ns} -o jsonpath='{{.status.url}}')",
        f"  curl $URL{READINESS_PATH}",
        f"  curl $URL/v2/models/{model}                 # its inputs and outputs",
        f"  curl -X POST $URL/v2/models/{model}/infer -d '{{\"inputs\": [...]}}'"
        + (' -H "Authorization: Bearer $FERRY_API_KEY"' if secret is not None else ""),
        "",
        "Notes",
        f"- Probes: readiness {READINESS_PATH} (400 until the model is loaded and warmed up),",
        f"  liveness {LIVENESS_PATH} (200 once the server listens, also while a model loads).",
        "- ferry sizes its engine threads from the CPUs the container may run on (its CPU",
        "  affinity), not from the CPU limit: give whole CPUs with requests = limits (Guaranteed",
        "  QoS), which the kubelet's static CPU manager pins.",
        f"- On SIGTERM ferry serve drains requests in flight for up to {DRAIN_TIMEOUT_S} s.",
        "",
    ]
    return "\n".join(lines)


# -- the output folder --------------------------------------------------------------------------


def is_kserve_output(folder: Path) -> bool:
    """Whether ``folder`` holds an earlier ``ferry deploy kserve`` output (its marker says so)."""
    try:
        marker = json.loads((folder / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("format") == OUTPUT_FORMAT


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _check_out_dir(out: Path, src: _Source, force: bool) -> None:
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
