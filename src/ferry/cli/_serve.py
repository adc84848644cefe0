"""``ferry serve``: serve models over HTTP with KServe v2 (the Open Inference Protocol)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from ferry.cli._common import console, generation_options
from ferry.serving import DEFAULT_DRAIN_TIMEOUT, DEFAULT_MAX_QUEUE_SIZE, DEFAULT_MAX_REQUEST_BYTES


@click.command("serve")
@click.argument("source", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="Port to listen on (0: a free one).",
)
@click.option(
    "--grpc-port",
    type=click.IntRange(0, 65535),
    default=None,
    metavar="PORT",
    help="Also serve Triton's gRPC protocol (tritonclient.grpc, perf_analyzer -i grpc) on this "
    "port, from the same models (0: a free one; Triton's is 8001). Default: HTTP only.",
)
@click.option(
    "--backends",
    default=None,
    metavar="NAMES",
    help="Comma-separated backends for models whose config.json names none (default: onnxruntime).",
)
@click.option(
    "--precision",
    default=None,
    metavar="NAME",
    help="Precision (fp32, bf16, fp16, int8) for models whose config.json names none, on every "
    "engine of their plan that offers it, e.g. --backends openvino --precision bf16 (ONNX "
    "Runtime runs fp32 only: a model it alone runs then fails to load). Default: fp32.",
)
@click.option(
    "--optimize",
    type=click.Choice(["none", "basic", "extended"]),
    default="none",
    show_default=True,
    help="Optimize models whose config names no 'optimize' at load (ferry optimize --level), "
    "for their first engine; a result that computes something else or runs slower is not used.",
)
@click.option(
    "--placement",
    type=click.Choice(["live", "fixed"]),
    default="live",
    show_default=True,
    help="With several engines (--backends openvino,onnxruntime or auto) and sizes unknown: "
    "live learns each model's plan from the calls it serves (switches in /metrics); fixed keeps "
    "the plan made at load. A config.json 'placement' wins.",
)
@click.option(
    "--isolate",
    is_flag=True,
    help="Run each model's instances in worker processes: an engine that crashes (a segfault) "
    "takes only its model down, until its worker is restarted. A config.json 'isolate' wins.",
)
@click.option(
    "--api-key",
    envvar="FERRY_API_KEY",
    default=None,
    metavar="KEY",
    help="Require 'Authorization: Bearer KEY' on inference and repository endpoints "
    "(also read from $FERRY_API_KEY).",
)
@click.option(
    "--max-request-bytes",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_REQUEST_BYTES,
    show_default=True,
    help="Largest request body accepted (413 above it).",
)
@click.option(
    "--poll",
    "poll",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="Rescan the repository this often; new or changed versions hot-reload.",
)
@click.option(
    "--drain-timeout",
    type=click.FloatRange(min=0),
    default=DEFAULT_DRAIN_TIMEOUT,
    show_default=True,
    metavar="SECONDS",
    help="At Ctrl-C or SIGTERM, how long the requests in flight get to finish; those still "
    "running then are cut off (answered 503).",
)
@click.option(
    "--strict-readiness/--no-strict-readiness",
    default=True,
    show_default=True,
    help="/v2/health/ready answers ready only while every model that should be loaded is READY "
    "(Triton's default); --no-strict-readiness: once the server is up.",
)
@click.option(
    "--explicit", is_flag=True, help="Load no model at start but those named with --load."
)
@click.option(
    "--max-queue-size",
    type=click.IntRange(min=0),
    default=DEFAULT_MAX_QUEUE_SIZE,
    show_default=True,
    help="Requests a model may hold waiting for an instance when its config sets no "
    "default_queue_policy.max_queue_size; one more is answered 429 with Retry-After at once "
    "(0: no limit).",
)
@click.option(
    "--load",
    "load_names",
    multiple=True,
    metavar="NAME",
    help="A model to load at start in --explicit mode (repeatable).",
)
@click.option(
    "--web",
    "web",
    multiple=True,
    metavar="[NAME=]DIR",
    help="Also serve this web bundle (ferry export --target web) at /web/NAME/ (default NAME: "
    "the folder's name; a folder of bundles mounts each). Bundles of served models "
    "(REPO/<model>/web/, or SOURCE itself) are served without it.",
)
@generation_options()
def command(
    source: Path,
    host: str,
    port: int,
    grpc_port: int | None,
    backends: str | None,
    precision: str | None,
    optimize: str,
    placement: str,
    isolate: bool,
    api_key: str | None,
    max_request_bytes: int,
    poll: float | None,
    drain_timeout: float,
    strict_readiness: bool,
    explicit: bool,
    load_names: tuple[str, ...],
    max_queue_size: int,
    web: tuple[str, ...],
    max_num_seqs: int,
    max_model_len: int | None,
    kv_cache_mib: float | None,
    max_queue: int,
) -> None:
    """Serve SOURCE (a model repository, an .onnx file or an artifact folder) over HTTP.

    Clients speak KServe v2 (Open Inference Protocol): Triton's client, KServe's, or plain HTTP.
    A generative artifact (ferry convert of a GGUF or a Hugging Face checkpoint) is served with
    the OpenAI API (/v1/chat/completions, /v1/completions, /v1/models) and Triton's generate
    extension, its requests decoded together by continuous batching.
    A repository is laid out as Triton's: REPO/<model>/<version>/model.onnx with an optional
    REPO/<model>/config.json. Ctrl-C or SIGTERM stops accepting requests, lets those in flight
    finish (up to --drain-timeout), and exits 0; a second Ctrl-C stops at once (exit 130).

    \b
    Examples:
      ferry serve model.onnx
      ferry serve models/ --port 8000 --poll 5
      ferry serve models/ --grpc-port 8001     # HTTP on 8000, gRPC on 8001
      ferry serve models/ --backends openvino --precision bf16
      ferry serve models/ --explicit --load mlp --api-key "$KEY"
      ferry serve site/                   # a web bundle: its page at /web/site/
      ferry serve smollm/ --max-num-seqs 16 --kv-cache-mib 1024   # a decoder: the OpenAI API
    """
    from ferry.errors import FerryError
    from ferry.serving import (
        GenerationSettings,
        GrpcServer,
        ServerThread,
        create_app,
        sigterm_interrupts,
    )

    app = create_app(
        source,
        backends=backends,
        precision=precision,
        optimize=None if optimize == "none" else optimize,
        placement=placement,
        isolate=isolate,
        api_key=api_key,
        max_request_bytes=max_request_bytes,
        max_queue_size=max_queue_size,
        poll_interval=poll,
        explicit=explicit,
        load=list(load_names) or None,
        strict_readiness=strict_readiness,
        web=list(web),
        generation=GenerationSettings(
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            kv_cache_mib=kv_cache_mib,
            max_queue=max_queue,
        ),
    )
    state = app.state.ferry
    if host not in ("127.0.0.1", "localhost", "::1") and api_key is None:
        console.print(
            f"[yellow]warning:[/] listening on {escape(host)} without --api-key: anyone who can "
            "reach this address can run and load models"
        )
    server = ServerThread(
        app, host=host, port=port, log_level="warning", drain_timeout=drain_timeout
    )
    grpc_server = None
    with sigterm_interrupts():
        try:
            server.start()
            if grpc_port is not None:
                grpc_server = GrpcServer(app, host, grpc_port, drain_timeout=drain_timeout).start()
            if state.startup_error is not None:
                raise FerryError(f"the server failed to start: {state.startup_error}")
            rows = state.index(engines=True)
            ready = [r for r in rows if r["state"] == "READY"]
            if not ready and not explicit and poll is None:
                reasons = "; ".join(f"{r['name']}: {r['reason']}" for r in rows if r["reason"])
                raise FerryError(f"no model could be loaded ({reasons or 'nothing to serve'})")
            console.print(f"serving on [bold]{escape(server.url)}[/] (KServe v2; Ctrl-C to stop)")
            if grpc_server is not None:
                console.print(f"gRPC on [bold]{escape(grpc_server.address)}[/] (Triton's protocol)")
            _print_models(rows)
            _print_web(server.url, app.state.ferry_web, [r["name"] for r in rows])
            server.wait(
                lambda: console.print("draining in-flight requests (Ctrl-C again to stop at once)")
            )
        finally:
            server.stop()
    # gRPC's RPCs drain with HTTP's requests (the HTTP server's drain stops both).
    drained = server.drained + (grpc_server.drained if grpc_server else 0)
    cut_off = server.cut_off + (grpc_server.cut_off if grpc_server else 0)
    if drained and not cut_off:
        s = "" if drained == 1 else "s"
        console.print(
            f"drained: {drained} request{s} in flight finished in {server.drain_seconds:.2f} s"
        )
    console.print("stopped")
    if cut_off or server.forced:
        # Engine runs that were cut off cannot be stopped: exit now rather than wait for them at
        # interpreter exit (and tear down engines that may still be running).
        _exit_now(130 if server.forced else 0)


def _exit_now(code: int) -> None:
    import logging
    import os
    import sys

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _print_web(url: str, bundles: object, names: list[str]) -> None:
    find = getattr(bundles, "find", None)
    mounted = getattr(bundles, "mounts", {})
    shown = dict.fromkeys([*mounted, *names])
    for name in shown:
        if find is not None and find(name) is not None:
            console.print(f"web page: [bold]{escape(url)}/web/{escape(name)}/[/]")


def _print_models(rows: list[dict[str, str]]) -> None:
    table = Table("model", "version", "state", "engines", "reason", box=None, show_edge=False)
    for row in rows:
        state = row["state"]
        style = "green" if state == "READY" else "red" if row["reason"] else "dim"
        table.add_row(
            escape(row["name"]),
            escape(row["version"] or "-"),
            f"[{style}]{state}[/]",
            escape(row.get("engines") or "-"),
            escape(row["reason"]),
        )
    console.print(table)
