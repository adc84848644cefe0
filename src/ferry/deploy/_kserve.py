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

This module puts the folder together; the jobs it calls live beside it: the container's paths
and the output folder's files (``_kserve_layout``), the model read as ``ferry serve`` reads it
(``_kserve_source``), the options checked (``_kserve_options``), the image's wheel, constraints
and Dockerfile (``_kserve_image``), and the manifest and README (``_kserve_manifest``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ferry._folders import publish_dir, staging_dir
from ferry._version import __version__
from ferry.deploy._generative import check_model_len, context_length
from ferry.deploy._kserve_image import (
    build_wheel,
    check_wheel_file,
    constraints,
    dockerfile_text,
    expected_wheel_name,
    image_tag,
)
from ferry.deploy._kserve_layout import (
    CONSTRAINTS_FILE,
    CONTAINER_PORT,
    DEFAULT_REGISTRY,
    DOCKERFILE,
    KSERVE_API_VERSION,
    LIVENESS_PATH,
    MANIFEST_FILE,
    MARKER_FILE,
    MODEL_DIR,
    MODEL_MOUNT,
    OUTPUT_FORMAT,
    READINESS_PATH,
    README_FILE,
    WHEEL_DIR,
    check_out_dir,
    is_kserve_output,
)
from ferry.deploy._kserve_manifest import inference_service, manifest_yaml, readme_text
from ferry.deploy._kserve_options import (
    backends_and_extras,
    check_image,
    check_name,
    check_namespace,
    check_protocol,
    check_storage_uri,
    container_resources,
    default_memory,
    parse_secret,
    predictor_command,
    replica_bounds,
)
from ferry.deploy._kserve_source import copy_model, default_name, read_source
from ferry.serving._generative import GenerationSettings

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
        generative_models: the served models that generate (the OpenAI API at ``/v1``).
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
    generative_models: tuple[str, ...] = ()

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
            *(
                [
                    f"OpenAI API at $URL/v1 for {', '.join(self.generative_models)} (see {README_FILE})"
                ]
                if self.generative_models
                else []
            ),
            f"image {self.image}",
            "next: " + " && ".join(steps) + f" (see {README_FILE})",
        ]


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
    max_num_seqs: int = 16,
    max_model_len: int | None = None,
    kv_cache_mib: float | None = None,
    max_queue: int = 256,
    protocol: str = "http",
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
        max_num_seqs, max_model_len, kv_cache_mib, max_queue: for a generative artifact (a
            decoder folder ``ferry convert`` writes), ``ferry serve``'s options of these names,
            put on the predictor's command. Its pod then also answers the OpenAI API at
            ``/v1`` (and Triton's generate extension), KServe scales it on requests in flight
            (target ``max_num_seqs``), a request may stream for 15 minutes, and the default
            memory is the weights twice plus the KV cache budget plus 1 GiB.
        protocol: what KServe routes to the predictor (one port): ``"http"`` (KServe v2 over
            HTTP; the OpenAI API for a generative model) or ``"grpc"`` (Triton's gRPC service,
            ``ferry serve --grpc-port``, on a port named ``h2c``; probes through gRPC's health
            service). Not grpc for a generative model.

    Returns:
        What was written (:class:`KServeDeployment`).

    Raises:
        ModelLoadError: ``source`` is missing or not a model, artifact or repository.
        InvalidInputError: a bad option (name, resources, replicas, URI, image, backends...),
            or ``out_dir`` holds other files, or would hold the model it is made from.
        FerryError: ferry's wheel could not be built.
    """
    src = read_source(Path(source))
    out = Path(out_dir)
    check_out_dir(out, src, force)
    name = check_name(name) if name is not None else default_name(src.path)
    if namespace is not None:
        namespace = check_namespace(namespace)
    if storage_uri is not None:
        storage_uri = check_storage_uri(storage_uri)
    min_replicas, max_replicas = replica_bounds(replicas, autoscale)
    protocol = check_protocol(protocol, src)
    generation = GenerationSettings(
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        kv_cache_mib=kv_cache_mib,
        max_queue=max_queue,
    )
    for model, section in src.generative.items():
        check_model_len(model, max_model_len, context_length(section))
    default = default_memory(src, generation)
    resources = container_resources(cpu, memory if memory is not None else default, gpu)
    backend_names, extras = backends_and_extras(backends, gpu)
    if src.generative:
        extras.append("generate")  # the tokenizer and the chat template's renderer
    if precision is not None:
        from ferry.serving._config import check_precision

        check_precision(precision, "precision")
    if optimize is not None:
        from ferry.serving._config import check_optimize

        check_optimize(optimize, "optimize")
    secret = parse_secret(api_key_secret) if api_key_secret is not None else None
    if image is not None:
        image = check_image(image)
    wheel_file = check_wheel_file(Path(wheel)) if not isinstance(wheel, bool) else None

    command = predictor_command(src, backend_names, precision, optimize, generation, protocol)
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
        wheel_name = built.name if built is not None else expected_wheel_name()
        (staging / CONSTRAINTS_FILE).write_text(constraints(extras), encoding="utf-8")
        if storage_uri is None:
            copy_model(src, staging / MODEL_DIR)
        dockerfile = dockerfile_text(name, command, wheel_name, extras, baked=storage_uri is None)
        (staging / DOCKERFILE).write_text(dockerfile, encoding="utf-8")
        if image is None:
            image = f"{DEFAULT_REGISTRY}/ferry-{name}:{image_tag(staging)}"
        manifest = inference_service(
            name=name,
            namespace=namespace,
            image=image,
            command=command,
            storage_uri=storage_uri,
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            resources=resources,
            secret=secret,
            max_num_seqs=max_num_seqs if src.generative else None,
            protocol=protocol,
        )
        (staging / MANIFEST_FILE).write_text(manifest_yaml(manifest), encoding="utf-8")
        readme = readme_text(
            src=src,
            name=name,
            namespace=namespace,
            image=image,
            storage_uri=storage_uri,
            wheel_name=None if built is not None else wheel_name,
            secret=secret,
            protocol=protocol,
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
            "generative_models": list(src.generative),
            "storage_uri": storage_uri,
            "command": command,
            "protocol": protocol,
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
        generative_models=tuple(src.generative),
    )
