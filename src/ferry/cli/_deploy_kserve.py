"""``ferry deploy kserve``: a KServe InferenceService running ``ferry serve``, and its image build."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.markup import escape

from ferry.cli._common import console, generation_options
from ferry.errors import InvalidInputError

__all__ = ["kserve_command"]

#: Exit status of a usage error, as for every other error the user can fix.
_EXIT_USAGE = 2


class _UsageError(click.ClickException):
    """A usage error (unknown option, bad value) said on one line, as ferry says its errors."""

    exit_code = _EXIT_USAGE

    def __init__(self, message: str, command_path: str) -> None:
        super().__init__(message)
        self.command_path = command_path

    def show(self, file: Any = None) -> None:
        message = self.format_message().rstrip(".")
        click.echo(f"error: {message} (see {self.command_path} --help)", err=True)


class _OneLineUsage(click.Command):
    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as e:
            path = e.ctx.command_path if e.ctx is not None else (info_name or "ferry")
            message = e.format_message()
            raise _UsageError(message[:1].lower() + message[1:], path) from None


@click.command("kserve", cls=_OneLineUsage)
@click.argument("model", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="The folder to write (replaced if it holds an earlier output).",
)
@click.option(
    "--name",
    default=None,
    help="The InferenceService's name, a DNS-1035 label (lowercase letters, digits, '-'; "
    "starting with a letter). Default: made from the model's name.",
)
@click.option("--namespace", default=None, help="Its namespace (default: kubectl's current one).")
@click.option(
    "--storage-uri",
    default=None,
    metavar="URI",
    help="Where KServe downloads the model from (s3://, gs://, pvc://, https://...), to "
    "/mnt/models: the folder that holds MODEL under its own name. Default: the model is "
    "copied into the image.",
)
@click.option(
    "--image",
    default=None,
    metavar="REF",
    help="The predictor image's reference, e.g. ghcr.io/me/mlp:1. Default: "
    "dev.local/ferry-NAME:TAG (for kind or minikube: `kind load docker-image`).",
)
@click.option(
    "--replicas",
    type=click.IntRange(min=1),
    default=None,
    help="A fixed number of replicas (default 1).",
)
@click.option(
    "--autoscale",
    default=None,
    metavar="MIN,MAX",
    help="Let KServe scale between MIN and MAX replicas (MIN 0: scale to zero on Knative).",
)
@click.option(
    "--cpu",
    default="1",
    show_default=True,
    metavar="REQUEST[,LIMIT]",
    help="CPU in Kubernetes units (2, 500m); one value is request and limit.",
)
@click.option(
    "--memory",
    default=None,
    metavar="REQUEST[,LIMIT]",
    help="Memory (4Gi, 512Mi); one value is request and limit. Default: 1 GiB plus three "
    "times the model's size.",
)
@click.option(
    "--gpu",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="NVIDIA GPUs (nvidia.com/gpu), for --backends tensorrt,onnxruntime.",
)
@click.option(
    "--backends",
    default=None,
    metavar="NAMES",
    help="As for ferry serve; the image gets their ferry extras (openvino, tensorrt...).",
)
@click.option("--precision", default=None, metavar="NAME", help="As for ferry serve.")
@click.option(
    "--optimize",
    type=click.Choice(["none", "basic", "extended"]),
    default="none",
    show_default=True,
    help="As for ferry serve.",
)
@click.option(
    "--api-key-secret",
    default=None,
    metavar="NAME[:KEY]",
    help="A Kubernetes Secret whose KEY (default api-key) holds the API key: ferry serve reads "
    "it as FERRY_API_KEY and asks for 'Authorization: Bearer KEY' on inference.",
)
@generation_options(
    "a pod",
    seqs_note="; KServe scales on requests in flight with this target",
    kv_note="; the default --memory counts it",
)
@click.option(
    "--protocol",
    type=click.Choice(["http", "grpc"]),
    default="http",
    show_default=True,
    help="What KServe routes to the predictor (one port): KServe v2 over HTTP, or Triton's gRPC "
    "service (ferry serve --grpc-port, port h2c, probes through grpc.health.v1).",
)
@click.option(
    "--wheel",
    "wheel_file",
    default=None,
    type=click.Path(path_type=Path, dir_okay=False),
    metavar="FILE",
    help="Put this ferry wheel in the image instead of building one from ferry's checkout.",
)
@click.option(
    "--no-wheel",
    is_flag=True,
    help="Write no wheel (README.txt gives the command that makes it before docker build).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace the output folder even when it holds files that are not an earlier output.",
)
def kserve_command(
    model: Path,
    output: Path,
    name: str | None,
    namespace: str | None,
    storage_uri: str | None,
    image: str | None,
    replicas: int | None,
    autoscale: str | None,
    cpu: str,
    memory: str | None,
    gpu: int,
    backends: str | None,
    precision: str | None,
    optimize: str,
    api_key_secret: str | None,
    max_num_seqs: int,
    max_model_len: int | None,
    kv_cache_mib: float | None,
    max_queue: int,
    protocol: str,
    wheel_file: Path | None,
    no_wheel: bool,
    force: bool,
) -> None:
    """Write a KServe InferenceService that serves MODEL with `ferry serve`, and its image.

    MODEL is what `ferry serve` takes: an .onnx file, an artifact folder or a model repository
    (REPO/<model>/<version>/model.onnx). OUTPUT gets inferenceservice.yaml (serving.kserve.io/
    v1beta1: a custom predictor running `ferry serve` on port 8080 with the v2 protocol,
    readiness on /v2/health/ready, liveness on /v2/health/live, resources and replicas), a
    Dockerfile for the predictor image (ferry's wheel, built from this checkout, and the model
    unless --storage-uri), and README.txt: build, push, apply. MODEL is only read; OUTPUT is
    written atomically.

    A generative artifact (a decoder folder from `ferry convert`) is served with the generation
    flags below: the pod also answers the OpenAI API at /v1, KServe scales it on requests in
    flight, and its default memory counts the KV cache.

    \b
    Examples:
      ferry deploy kserve model.onnx -o manifests/
      ferry deploy kserve models/ -o manifests/ --name shop --namespace ml --autoscale 1,4
      ferry deploy kserve model.onnx -o manifests/ --storage-uri s3://bucket/models \\
          --image ghcr.io/me/ferry-mlp:1 --cpu 2 --memory 4Gi
      ferry deploy kserve model.onnx -o manifests/ --backends openvino --precision bf16
      ferry deploy kserve model.onnx -o manifests/ --api-key-secret mlp-key
      ferry deploy kserve model.onnx -o manifests/ --protocol grpc
      ferry deploy kserve model.onnx -o manifests/ --backends tensorrt,onnxruntime --gpu 1
      ferry deploy kserve smollm2/ -o manifests/ --max-num-seqs 8 --max-model-len 2048 --cpu 4
    """
    from ferry.deploy import kserve_manifests

    if wheel_file is not None and no_wheel:
        raise InvalidInputError("give --wheel FILE or --no-wheel, not both")
    deployment = kserve_manifests(
        model,
        output,
        name=name,
        namespace=namespace,
        storage_uri=storage_uri,
        image=image,
        replicas=replicas,
        autoscale=autoscale,
        cpu=cpu,
        memory=memory,
        gpu=gpu,
        backends=backends,
        precision=precision,
        optimize=None if optimize == "none" else optimize,
        api_key_secret=api_key_secret,
        force=force,
        wheel=wheel_file if wheel_file is not None else not no_wheel,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        kv_cache_mib=kv_cache_mib,
        max_queue=max_queue,
        protocol=protocol,
    )
    for line in deployment.lines():
        console.print(escape(line))
