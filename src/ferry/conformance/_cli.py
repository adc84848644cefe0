"""``python -m ferry.conformance``: run a backend's conformance, or regenerate a rule table.

::

    python -m ferry.conformance [run] --backend NAME [--out DIR] [--checks node,cache,dynamic,
        bad-inputs,threads,kit] [--sample N] [--op OP] [--workers N] [--kit-tools DIR] ...
    python -m ferry.conformance rules onnxruntime [--op OP] [--out FILE | -]
    python -m ferry.conformance rules openvino [--op OP] [--out FILE | -] [--jobs N]
        [--results runs.json] [--reuse runs.json [--rerun A,B]]

``run`` (the default) runs the adapter kit's checks and writes ``<backend>.md`` and
``<backend>.json`` into DIR; its exit status is 0 only when every check passed (1: one failed;
2: the backend is missing, named with what to install, or an argument is wrong). ``rules`` rewrites
the generated module in ``ferry/backends/`` (or FILE; ``-`` prints it), which then wants
``ruff format``. With ``--op`` a generator measures only those ops and prints the partial table
unless ``--out`` says where to write it: a smoke run, never a table to commit.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ferry.conformance._check_kit import KIT_SAMPLE
from ferry.conformance._checks import CHECKS
from ferry.conformance._kit import run_adapter_kit
from ferry.conformance._kit_tables import write_adapter_report
from ferry.conformance._runner import DEFAULT_TIMEOUT
from ferry.conformance._tables import write_text
from ferry.errors import FerryError

if TYPE_CHECKING:
    from ferry.backends import Backend

__all__ = ["main"]

logger = logging.getLogger(__name__)

#: The generated rule module of each backend with a generator, in ``ferry/backends/``.
_TABLES = {"onnxruntime": "_onnxruntime_ops.py", "openvino": "_openvino_rules.py"}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    # ferry's own progress at INFO; libraries' (onnxscript's pass manager...) only when they warn.
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("ferry").setLevel(logging.INFO)
    if args[:1] == ["rules"]:
        return _rules(args[1:])
    if args[:1] == ["run"]:
        args = args[1:]
    return _run(args)


# --------------------------------------------------------------------------------------------------
# run


def _run(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ferry.conformance [run]",
        description="Run the adapter conformance kit on an installed ferry backend (ONNX's node "
        "test cases for the ops its rules claim, caching, dynamic sizes, bad inputs, thread "
        "safety, kit models judged at the task) and write <backend>.md and <backend>.json. "
        "Exit status 0 only when every check passed.",
        epilog="Regenerate a rule table: python -m ferry.conformance rules {onnxruntime,openvino} "
        "--help",
    )
    parser.add_argument(
        "--backend",
        action="append",
        required=True,
        help="registered backend name, or module:Class for one not registered (repeatable)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("docs/conformance"),
        help="folder for <backend>.md and <backend>.json",
    )
    parser.add_argument(
        "--checks",
        default=",".join(CHECKS),
        help=f"the checks to run, comma-separated (default: all: {','.join(CHECKS)})",
    )
    parser.add_argument(
        "--op",
        action="append",
        default=None,
        help="node cases of this op only (repeatable; 'domain::Op' outside the ONNX domain)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes for the node cases; 0 runs in-process, without timeouts or crash "
        "isolation (default: 1)",
    )
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per case")
    parser.add_argument(
        "--sample",
        "--per-op",
        dest="per_op",
        type=int,
        default=None,
        help="run at most N node cases per op (a sample, said in the table; default: all)",
    )
    parser.add_argument(
        "--kit-models",
        default=None,
        help=f"kit models to judge, comma-separated (default: {','.join(KIT_SAMPLE)})",
    )
    parser.add_argument(
        "--kit-tools",
        default=None,
        help="folder of the kit's kit.json and inputs.py (default: $FERRY_KIT_TOOLS, the kit "
        "folder, or tests/real/kit under the current folder)",
    )
    parser.add_argument(
        "--kit-file",
        action="append",
        default=[],
        metavar="ID=FILE",
        help="judge this ONNX file for kit model ID (one the kit holds in another format, "
        "converted with ferry convert; repeatable)",
    )
    parser.add_argument(
        "--check", action="store_true", help="(kept for old scripts: the exit status always says)"
    )
    args = parser.parse_args(argv)

    checks = [c.strip() for c in args.checks.split(",") if c.strip()]
    unknown = [c for c in checks if c not in CHECKS]
    if unknown or not checks:
        logger.error(
            "--checks: unknown check %s; choose from %s",
            ", ".join(map(repr, unknown)) or "(none given)",
            ",".join(CHECKS),
        )
        return 2
    ops = None
    if args.op:
        ops = {tuple(o.split("::", 1)) if "::" in o else ("", o) for o in args.op}
    kit_models = [m.strip() for m in args.kit_models.split(",")] if args.kit_models else None
    bad_files = [f for f in args.kit_file if "=" not in f]
    if bad_files:
        logger.error("--kit-file wants ID=FILE, got %s", ", ".join(map(repr, bad_files)))
        return 2
    kit_files = dict(f.split("=", 1) for f in args.kit_file)
    command = _command_tail(args, checks)
    status = 0
    for name in args.backend:
        try:
            backend = _backend_from_cli(name)
        except FerryError as e:
            logger.error("%s", _install_line(name, e))
            status = 2
            continue
        report = run_adapter_kit(
            backend,
            checks,
            per_op=args.per_op,
            ops=ops,
            workers=args.workers,
            timeout=args.timeout,
            kit_models=kit_models,
            kit_tools=args.kit_tools,
            kit_files=kit_files,
        )
        path = write_adapter_report(report, args.out, command)
        logger.info("%s\nwrote %s and %s", report.summary(), path, path.with_suffix(".json"))
        for check in report.checks:
            if check.failed:
                logger.info("%s %s: %s", check.check, check.status, check.summary)
        if not report.passed:
            status = max(status, 1)
    return status


def _command_tail(args: argparse.Namespace, checks: Sequence[str]) -> list[str]:
    """The options of this run that shape its report, for the table's header."""
    tail: list[str] = []
    if list(checks) != list(CHECKS):
        tail += ["--checks", ",".join(checks)]
    if args.per_op is not None:
        tail += ["--sample", str(args.per_op)]
    for op in args.op or []:
        tail += ["--op", op]
    if args.kit_models:
        tail += ["--kit-models", args.kit_models]
    for given in args.kit_file:
        model, _, file = given.partition("=")
        tail += ["--kit-file", f"{model}={Path(file).name}"]
    return tail


def _install_line(name: str, error: FerryError) -> str:
    """One line: why ``name`` cannot be run, and what to install."""
    text = " ".join(str(error).split())
    if text.startswith("unknown backend"):
        text += (
            f"; install the adapter package that registers {name!r} in the 'ferry.backends' "
            "entry-point group (pip install <its package>) and run again"
        )
    return text


def _backend_from_cli(spec: str) -> Backend:
    """A registered backend by name, or ``module:Class`` instantiated directly."""
    from ferry.backends import get_backend
    from ferry.errors import BackendUnavailableError

    if ":" not in spec:
        return get_backend(spec)
    module_name, _, attr = spec.partition(":")
    try:
        backend: Backend = getattr(importlib.import_module(module_name), attr)()
    except (ImportError, AttributeError) as e:
        raise BackendUnavailableError(f"cannot import backend {spec!r}: {e}") from e
    if not backend.available():
        raise BackendUnavailableError(f"backend {spec!r} is not available on this machine")
    return backend


# --------------------------------------------------------------------------------------------------
# rules


def _rules(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ferry.conformance rules",
        description="Measure a backend's engine and regenerate its rule table in "
        "ferry/backends/ (then run ruff format on it).",
    )
    engines = parser.add_subparsers(dest="engine", required=True)
    ort = engines.add_parser(
        "onnxruntime",
        help="ONNX Runtime's CPU kernels and loadable ops -> _onnxruntime_ops.py (minutes)",
    )
    ov = engines.add_parser(
        "openvino",
        help="ONNX's single-node cases run through OpenVINO -> _openvino_rules.py (hours)",
    )
    for sub in (ort, ov):
        sub.add_argument(
            "--op",
            action="append",
            default=None,
            help="only this op type (repeatable): a smoke run, printed unless --out is given",
        )
        sub.add_argument(
            "--out",
            default=None,
            help="the file to write ('-': print it); default: the table in ferry/backends/",
        )
    ov.add_argument("--jobs", type=int, default=2, help="worker processes (default: 2)")
    ov.add_argument("--results", type=Path, help="save every form's verdict here (JSON)")
    ov.add_argument("--reuse", type=Path, help="derive from saved verdicts instead of running")
    ov.add_argument("--rerun", default="", help="with --reuse: run these ops' forms again (A,B)")
    args = parser.parse_args(argv)

    ops = set(args.op) if args.op else None
    out = args.out if args.out is not None else ("-" if ops else str(_table_path(args.engine)))
    target = None if out == "-" else Path(out)
    text: str | None
    if args.engine == "onnxruntime":
        from ferry.conformance._gen_onnxruntime import measure, render

        status, text = 0, render(*measure(ops))
    else:
        from ferry.conformance._gen_openvino import regenerate

        rerun = {op.strip() for op in args.rerun.split(",") if op.strip()}
        status, text = regenerate(
            jobs=args.jobs, results=args.results, reuse=args.reuse, rerun=rerun, ops=ops
        )
    if text is None:
        logger.error("nothing written")
    elif target is None:
        sys.stdout.write(text)
    else:
        write_text(target, text)
        logger.info("wrote %s; now run: ruff format %s", target, target)
    return status


def _table_path(engine: str) -> Path:
    import ferry.backends

    return Path(ferry.backends.__file__).parent / _TABLES[engine]
