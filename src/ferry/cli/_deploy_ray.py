"""``ferry deploy ray``: serve models on a Ray Serve cluster, scaled by replicas."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.markup import escape
from rich.table import Table

from ferry.cli._common import console, generation_options

if TYPE_CHECKING:
    from ferry.deploy.ray import DeployedModel


def _autoscale(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> tuple[int, int] | None:
    if value is None:
        return None
    parts = value.split(",")
    try:
        low, high = (int(p) for p in parts)
    except ValueError:
        raise click.BadParameter(f"expected MIN,MAX replicas, e.g. 1,4; got {value!r}") from None
    if not 0 <= low <= high or high < 1:
        raise click.BadParameter(f"need 0 <= MIN <= MAX and MAX >= 1; got {value!r}")
    return low, high


@click.command("ray")
@click.argument("source", type=click.Path(path_type=Path), required=False)
@click.option(
    "--replicas",
    type=click.IntRange(min=1),
    default=None,
    help="Replicas per model (default 1). Deploying again with another count rescales in "
    "place: replicas are added or drained while the others serve.",
)
@click.option(
    "--autoscale",
    callback=_autoscale,
    default=None,
    metavar="MIN,MAX",
    help="Let Ray Serve's autoscaler keep each model between MIN and MAX replicas.",
)
@click.option(
    "--address",
    default=None,
    help="The Ray cluster (e.g. 10.0.0.5:6379 or ray://head:10001). Default: the cluster on "
    "this machine, else a new local one (`ray start --head`), which keeps running.",
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Engine threads per replica.",
)
@click.option(
    "--replica-cpus",
    type=click.FloatRange(min=0),
    default=None,
    help="CPUs Ray reserves per replica (default: --threads).",
)
@click.option("--backends", default=None, metavar="NAMES", help="As for ferry serve.")
@click.option("--precision", default=None, metavar="NAME", help="As for ferry serve.")
@click.option(
    "--optimize",
    type=click.Choice(["none", "basic", "extended"]),
    default="none",
    show_default=True,
    help="As for ferry serve.",
)
@click.option(
    "--api-key",
    envvar="FERRY_API_KEY",
    default=None,
    metavar="KEY",
    help="Require 'Authorization: Bearer KEY' on inference and the repository index "
    "(also read from $FERRY_API_KEY).",
)
@click.option(
    "--http-host",
    default="127.0.0.1",
    show_default=True,
    help="Where Ray Serve's HTTP proxy listens, when ferry starts Serve on the cluster.",
)
@click.option(
    "--http-port",
    type=click.IntRange(1, 65535),
    default=8000,
    show_default=True,
    help="Its port, likewise.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    metavar="SECONDS",
    help="How long to wait for the models to serve.",
)
@generation_options(
    "each replica",
    seqs_note="; a replica takes this many requests and as many again waiting, Ray Serve "
    "queues the rest",
)
@click.option("--down", is_flag=True, help="Remove ferry's applications from the cluster.")
@click.option("--status", "show_status", is_flag=True, help="List ferry's applications.")
@click.pass_context
def ray_command(
    ctx: click.Context,
    source: Path | None,
    replicas: int | None,
    autoscale: tuple[int, int] | None,
    address: str | None,
    threads: int,
    replica_cpus: float | None,
    backends: str | None,
    precision: str | None,
    optimize: str,
    api_key: str | None,
    http_host: str,
    http_port: int,
    timeout: float,
    max_num_seqs: int,
    max_model_len: int | None,
    kv_cache_mib: float | None,
    max_queue: int,
    down: bool,
    show_status: bool,
) -> None:
    """Serve SOURCE (an .onnx file, an artifact folder or a repository) on Ray Serve.

    Each model becomes a Ray Serve application at /v2/models/<model> whose replicas run
    `ferry serve`'s server on it, batching with Ray Serve's batching; a front application
    answers /v2, health and the repository index. Clients speak KServe v2 to Ray Serve's
    proxy, as to `ferry serve`: Triton's client and perf_analyzer work unchanged. Model files
    must be readable on every node that runs a replica.

    A generative model (a decoder folder from `ferry convert`) batches continuously inside each
    replica and also speaks the OpenAI API (chat/completions, completions, models, streaming) at
    http://HOST:PORT/v1, the request's "model" choosing among the deployed models, and at its
    own base URL http://HOST:PORT/v2/models/<model>/v1.

    \b
    Examples:
      ferry deploy ray models/ --replicas 2
      ferry deploy ray models/ --replicas 4          # rescale in place
      ferry deploy ray model.onnx --autoscale 1,8 --threads 2
      ferry deploy ray models/ --address 10.0.0.5:6379 --http-host 0.0.0.0 --api-key "$KEY"
      ferry deploy ray smollm2/ --replicas 2 --max-num-seqs 16 --max-model-len 2048
      ferry deploy ray --status
      ferry deploy ray --down
    """
    from ferry.deploy import ray as ferry_ray
    from ferry.errors import InvalidInputError

    ferry_ray.serve_module()  # Ray Serve sets its logger up when imported: before it is quietened
    if not (ctx.obj or {}).get("debug"):
        # Ray's own progress lines ("Started Serve...", "Deleting app...") are not ours to print.
        for name in ("ray", "ray.serve"):
            logging.getLogger(name).setLevel(logging.ERROR)
    if down or show_status:
        given = [f"--{n}" for n, v in (("replicas", replicas), ("autoscale", autoscale)) if v]
        if source is not None or given or (down and show_status):
            raise InvalidInputError(
                "--down and --status take no SOURCE or scaling options, and not each other"
            )
        if down:
            removed = ferry_ray.undeploy(address)
            if removed:
                console.print(f"removed {', '.join(escape(n) for n in removed)}")
            else:
                console.print("no ferry applications on this cluster")
            console.print("the Ray cluster keeps running; `ray stop` ends a local one")
            return
        _print(ferry_ray.deployed(address))
        return
    if source is None:
        raise InvalidInputError("give a model, artifact or repository to deploy (or --down)")
    if http_host not in ("127.0.0.1", "localhost", "::1") and api_key is None:
        console.print(
            f"[yellow]warning:[/] Ray Serve will listen on {escape(http_host)} without --api-key: "
            "anyone who can reach it can run the models"
        )
    models = ferry_ray.deploy(
        source,
        address=address,
        http_host=http_host,
        http_port=http_port,
        timeout=timeout,
        replicas=replicas,
        autoscale=autoscale,
        threads=threads,
        replica_cpus=replica_cpus,
        backends=backends,
        precision=precision,
        optimize=None if optimize == "none" else optimize,
        api_key=api_key,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        kv_cache_mib=kv_cache_mib,
        max_queue=max_queue,
    )
    url = ferry_ray.proxy_url(http_host, http_port)
    console.print(f"serving on [bold]{escape(url)}[/] (KServe v2 through Ray Serve's proxy)")
    _print(models)
    generative = ferry_ray.generative_models(source)
    if generative:
        console.print(
            f'OpenAI API: [bold]{escape(url)}/v1[/] (the request\'s "model" picks the model)'
        )
    for name in generative:
        console.print(f"OpenAI API of {escape(name)}: {escape(ferry_ray.openai_url(url, name))}")


def _print(models: list[DeployedModel]) -> None:
    table = Table("application", "route", "status", "message", box=None, show_edge=False)
    for m in models:
        style = "green" if m.status == "RUNNING" else "red" if m.message else "dim"
        table.add_row(escape(m.app), escape(m.route), f"[{style}]{m.status}[/]", escape(m.reason))
    console.print(table)
