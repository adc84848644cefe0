"""The ``ferry`` command: a click group whose commands live one per module, thin over the library."""

from __future__ import annotations

import logging
from typing import Any

import click

from ferry._version import __version__
from ferry.errors import FerryError

__all__ = ["cli", "main"]

EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 1


class FerryGroup(click.Group):
    """Turns errors into one line on stderr: exit 2 for the user's, exit 1 for ferry's own bugs."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except FerryError as e:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"error: {e}", err=True)
            ctx.exit(EXIT_USER_ERROR)
        except OSError as e:
            # A file ferry was told to read or write: missing folder, no permission, disk full.
            if ctx.obj and ctx.obj.get("debug"):
                raise
            where = f": {e.filename}" if e.filename else ""
            click.echo(f"error: {e.strerror or e}{where}", err=True)
            ctx.exit(EXIT_USER_ERROR)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)
        except Exception as e:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(
                f"internal error: {type(e).__name__}: {e}\n"
                "This is a bug in ferry; run again with `ferry --debug ...` for the traceback "
                "and report it.",
                err=True,
            )
            ctx.exit(EXIT_INTERNAL_ERROR)


@click.group(cls=FerryGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", "-V", prog_name="ferry")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.option("-v", "--verbose", is_flag=True, help="Show progress logs.")
@click.pass_context
def cli(ctx: click.Context, debug: bool, verbose: bool) -> None:
    """ferry: convert, inspect, run and benchmark models on any engine.

    \b
    Examples:
      ferry info model.onnx
      ferry run model.onnx --random
      ferry convert model.onnx -o model17.onnx --opset 17
      ferry optimize model.onnx -o model.opt.onnx
      ferry compress model.onnx -o small.onnx --data calib.npz --recipe prune:channel=0.3,distill:epochs=5
      ferry bench model.onnx --iterations 200
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    level = logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


def _register() -> None:
    import importlib

    # One module per command; each defines ``command``.
    for name in (
        "info",
        "run",
        "generate",
        "convert",
        "optimize",
        "quantize",
        "prune",
        "distill",
        "compress",
        "export",
        "plan",
        "bench",
        "agent",
        "serve",
        "deploy",
    ):
        cli.add_command(importlib.import_module(f"ferry.cli._{name}").command)


_register()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv, prog_name="ferry")


if __name__ == "__main__":  # pragma: no cover
    main()
