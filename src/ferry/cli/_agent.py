"""``ferry agent``: serve benchmarks on this device to ``ferry bench --device``."""

from __future__ import annotations

import click
from rich.markup import escape

from ferry.cli._common import console


@click.command("agent")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on; 0.0.0.0 for every interface (reachable from the network).",
)
@click.option(
    "--port",
    type=click.IntRange(min=0, max=65535),
    default=8765,
    show_default=True,
    help="Port to listen on (0: a free one).",
)
@click.option(
    "--token",
    envvar="FERRY_AGENT_TOKEN",
    required=True,
    help="Secret clients must send (Authorization: Bearer TOKEN); default $FERRY_AGENT_TOKEN.",
)
@click.option(
    "--max-upload-mb",
    type=click.FloatRange(min=0, min_open=True),
    default=1024.0,
    show_default=True,
    help="Largest upload (and unpacked archive) accepted, in MiB.",
)
@click.option(
    "--max-queue",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Jobs that may wait while one runs.",
)
@click.option(
    "--job-timeout",
    type=click.FloatRange(min=1),
    default=3600.0,
    show_default=True,
    help="Seconds a job may run before it is stopped.",
)
@click.option(
    "--job-memory",
    type=click.FloatRange(min=64),
    default=None,
    metavar="MB",
    help="Memory a job may allocate (MiB); past it the job fails with an out-of-memory error "
    "and the agent serves on. Default: no limit beyond the machine's.",
)
@click.option(
    "--max-unpack-ratio",
    type=click.FloatRange(min=1),
    default=100.0,
    show_default=True,
    help="Largest ratio of an uploaded archive's unpacked size to its size (decompression bombs "
    "above it are refused).",
)
def command(
    host: str,
    port: int,
    token: str,
    max_upload_mb: float,
    max_queue: int,
    job_timeout: float,
    job_memory: float | None,
    max_unpack_ratio: float,
) -> None:
    """Run benchmarks on this device for `ferry bench --device http://HOST:PORT --token TOKEN`.

    Jobs run one at a time (others queue), each in its own process; uploads live in a temporary
    folder removed after the job. Plain HTTP: the token travels in clear, so listen on a trusted
    network, or keep the default 127.0.0.1 and reach it through an SSH tunnel
    (ssh -L 8765:127.0.0.1:8765 device).

    \b
    Examples:
      ferry agent --token "$(openssl rand -hex 16)"
      FERRY_AGENT_TOKEN=s3cret ferry agent --host 0.0.0.0 --port 8765
      ferry agent --token "$TOKEN" --job-timeout 600 --job-memory 4096
    """
    from ferry.bench import create_agent_app, device_info, device_summary
    from ferry.serving import ServerThread, sigterm_interrupts

    app = create_agent_app(
        token,
        max_upload_bytes=int(max_upload_mb * (1 << 20)),
        max_queue=max_queue,
        job_timeout_s=job_timeout,
        job_memory_bytes=None if job_memory is None else int(job_memory * (1 << 20)),
        max_unpack_ratio=max_unpack_ratio,
    )
    # Status requests long-poll up to a minute: let them end as before, with no drain limit.
    server = ServerThread(app, host=host, port=port, drain_timeout=None)
    with sigterm_interrupts():
        try:
            server.start()
            shown = f"[{host}]" if ":" in host else host
            console.print(f"device: {escape(device_summary(device_info()))}")
            console.print(
                f"ferry agent listening on http://{shown}:{server.port} (uploads up to "
                f"{max_upload_mb:g} MiB, {max_queue} queued jobs at most); Ctrl-C stops it"
            )
            if host not in ("127.0.0.1", "localhost", "::1"):
                console.print(
                    "[yellow]note:[/yellow] plain HTTP: the token and the models travel "
                    "unencrypted; use a trusted network or an SSH tunnel"
                )
            server.wait()
        finally:
            server.stop()
