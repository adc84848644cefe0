"""``ferry deploy kserve``'s options checked and turned into what the manifest and image take:
names, storage URI, replicas, resources, engines and their extras, the API key's Secret, the
predictor's command.
"""

from __future__ import annotations

import decimal
import logging
import math
import re
from collections.abc import Sequence
from typing import Any

from ferry.deploy._generative import context_length, kv_bytes_per_token
from ferry.deploy._kserve_layout import (
    CONTAINER_PORT,
    DEFAULT_SECRET_KEY,
    DRAIN_TIMEOUT_S,
    GRPC_CONTAINER_PORT,
    ModelSource,
)
from ferry.errors import InvalidInputError
from ferry.serving._generative import GenerationSettings

__all__ = [
    "backends_and_extras",
    "check_image",
    "check_name",
    "check_namespace",
    "check_protocol",
    "check_storage_uri",
    "container_resources",
    "default_memory",
    "kv_cache_mib",
    "parse_secret",
    "predictor_command",
    "replica_bounds",
]

logger = logging.getLogger(__name__)

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


def check_name(name: str) -> str:
    """``name`` if it is a DNS-1035 label (an InferenceService's name), else InvalidInputError."""
    if len(name) > 63 or not _DNS_1035.fullmatch(name):
        raise InvalidInputError(
            f"InferenceService name {name!r} is not a DNS-1035 label: use lowercase letters, "
            "digits and '-', starting with a letter and ending with a letter or digit, at most "
            "63 characters (e.g. 'resnet-50')"
        )
    return name


def check_namespace(namespace: str) -> str:
    """``namespace`` if Kubernetes takes it (a DNS-1123 label), else InvalidInputError."""
    if not (len(namespace) <= 63 and _DNS_1123.fullmatch(namespace)):
        raise InvalidInputError(
            f"namespace {namespace!r} is not a valid Kubernetes namespace: lowercase letters, "
            "digits and '-', starting and ending with a letter or digit, at most 63 characters"
        )
    return namespace


def check_image(image: str) -> str:
    """``image`` if it is an image reference (REGISTRY/REPOSITORY[:TAG]), else InvalidInputError."""
    if not _IMAGE.fullmatch(image):
        raise InvalidInputError(
            f"image {image!r} is not an image reference; give REGISTRY/REPOSITORY[:TAG], e.g. "
            "ghcr.io/me/mlp:1 (repository in lowercase)"
        )
    return image


def check_storage_uri(uri: str) -> str:
    """``uri`` if it is a URI; a scheme KServe's default storage initializer lacks is warned about."""
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


def replica_bounds(
    replicas: int | None, autoscale: tuple[int, int] | str | None
) -> tuple[int, int]:
    """``(minReplicas, maxReplicas)`` from a fixed count or ``(min, max)``/``"MIN,MAX"``."""
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


def container_resources(cpu: str, memory: str, gpu: int) -> dict[str, dict[str, str]]:
    """The container's ``resources`` from ``REQUEST[,LIMIT]`` CPU and memory and a GPU count."""
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


def default_memory(src: ModelSource, generation: GenerationSettings | None = None) -> str:
    """1 GiB plus three times the model's size (the model, its engine, a second instance); for
    a generative model, twice its size (the weights read, the engine's copy: one decoder per
    model) plus its KV cache budget (:func:`kv_cache_mib`)."""
    size = src.size() / 2**20
    if src.generative:
        kv = sum(kv_cache_mib(section, generation) for section in src.generative.values())
        mib = 1024 + (2 if len(src.generative) == len(src.served) else 3) * size + kv
    else:
        mib = 1024 + 3 * size
    return f"{math.ceil(mib / 256) * 256}Mi"


def kv_cache_mib(section: dict[str, Any], generation: GenerationSettings | None) -> float:
    """The MiB a generative model's KV cache takes at most: ``kv_cache_mib`` when given, else
    ``max_num_seqs`` rows of ``max_model_len`` tokens (the model's context when not given), as
    :class:`ferry.generate.BatchEngine` reserves them. 0 when the manifest lacks the sizes."""
    settings = generation or GenerationSettings()
    if settings.kv_cache_mib is not None:
        return float(settings.kv_cache_mib)
    per_token = kv_bytes_per_token(section)
    tokens = settings.max_model_len or context_length(section)
    if per_token is None or tokens is None:
        return 0.0
    return settings.max_num_seqs * tokens * per_token / 2**20


def backends_and_extras(
    backends: str | Sequence[str] | None, gpu: int
) -> tuple[list[str], list[str]]:
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


def parse_secret(text: str) -> tuple[str, str]:
    """``(secret, key)`` from ``NAME`` or ``NAME:KEY`` of the API key's Kubernetes Secret."""
    secret, _, key = text.partition(":")
    key = key or DEFAULT_SECRET_KEY
    if not (len(secret) <= 253 and _DNS_1123.fullmatch(secret)) or not _SECRET_KEY.fullmatch(key):
        raise InvalidInputError(
            f"api key secret {text!r} is not NAME or NAME:KEY of a Kubernetes Secret (NAME: "
            "lowercase letters, digits and '-'; KEY: letters, digits, '-', '_', '.')"
        )
    return secret, key


def predictor_command(
    src: ModelSource,
    backends: list[str],
    precision: str | None,
    optimize: str | None,
    generation: GenerationSettings | None = None,
    protocol: str = "http",
) -> list[str]:
    """``ferry serve`` on the model in the container, on KServe's port, with these options
    (the generation settings when it serves a generative model, each one said; with ``protocol``
    grpc, Triton's gRPC service on :data:`GRPC_CONTAINER_PORT` too)."""
    command = ["ferry", "serve", src.container_path, "--host", "0.0.0.0"]
    command += ["--port", str(CONTAINER_PORT), "--drain-timeout", str(DRAIN_TIMEOUT_S)]
    if protocol == "grpc":
        command += ["--grpc-port", str(GRPC_CONTAINER_PORT)]
    if backends:
        command += ["--backends", ",".join(backends)]
    if precision is not None:
        command += ["--precision", precision]
    if optimize is not None and optimize != "none":
        command += ["--optimize", optimize]
    if src.generative:
        settings = generation or GenerationSettings()
        command += ["--max-num-seqs", str(settings.max_num_seqs)]
        if settings.max_model_len is not None:
            command += ["--max-model-len", str(settings.max_model_len)]
        if settings.kv_cache_mib is not None:
            command += ["--kv-cache-mib", f"{settings.kv_cache_mib:g}"]
        command += ["--max-queue", str(settings.max_queue)]
    return command


#: What ``--protocol`` takes: the one port KServe routes to the predictor speaks it.
PROTOCOLS = ("http", "grpc")


def check_protocol(protocol: str, src: ModelSource) -> str:
    """``protocol`` itself when KServe can route it to what ``src`` serves.

    Raises:
        InvalidInputError: not http or grpc, or grpc for a generative model (the OpenAI API is
            HTTP, and KServe routes one port).
    """
    if protocol not in PROTOCOLS:
        raise InvalidInputError(
            f"--protocol {protocol!r}: choose http (KServe v2 over HTTP, and the OpenAI API) or "
            "grpc (Triton's gRPC service)"
        )
    if protocol == "grpc" and src.generative:
        raise InvalidInputError(
            f"--protocol grpc: {', '.join(src.generative)} is generative, answered by the OpenAI "
            "API over HTTP, and KServe routes one port to the predictor; deploy it with "
            "--protocol http"
        )
    return protocol
