"""``python -m ferry.conformance``: run a backend's conformance, or regenerate a rule table.

::

    python -m ferry.conformance [run] --backend NAME --out DIR [--op OP] [--workers N] ...
    python -m ferry.conformance rules onnxruntime [--op OP] [--out FILE | -]
    python -m ferry.conformance rules openvino [--op OP] [--out FILE | -] [--jobs N]
        [--results runs.json] [--reuse runs.json [--rerun A,B]]

``run`` (the default) writes ``<backend>.md`` and ``<backend>.json`` into DIR; ``rules`` rewrites
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

from ferry.conformance._cases import collect_cases, sample_cases
from ferry.conformance._runner import DEFAULT_TIMEOUT, run_conformance
from ferry.conformance._tables import write_table, write_text
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
    logging.basicConfig(level=logging.INFO, format="%(message)s")
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
        description="Run ONNX's node test cases on a ferry backend for the ops its rules claim, "
        "and write its table.",
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
        "--op",
        action="append",
        default=None,
        help="only this op (repeatable; 'domain::Op' outside the ONNX domain)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes; 0 runs in-process, without timeouts or crash "
        "isolation (default: 1)",
    )
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per case")
    parser.add_argument(
        "--per-op",
        type=int,
        default=None,
        help="run at most this many cases per op (a sample; default: all)",
    )
    parser.add_argument(
        "--include-unclaimed", action="store_true", help="also run the cases the rules do not claim"
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when a claimed op fails a case"
    )
    args = parser.parse_args(argv)

    ops = None
    if args.op:
        ops = {tuple(o.split("::", 1)) if "::" in o else ("", o) for o in args.op}
    status = 0
    for name in args.backend:
        try:
            backend = _backend_from_cli(name)
        except FerryError as e:
            logger.error("%s", e)
            status = 2
            continue
        cases = collect_cases(ops)
        if args.per_op is not None:
            cases = sample_cases(cases, args.per_op)
        report = run_conformance(
            backend,
            ops,
            cases=cases,
            workers=args.workers,
            timeout=args.timeout,
            include_unclaimed=args.include_unclaimed,
        )
        path = write_table(report, args.out)
        logger.info("%s\nwrote %s and %s", report.summary(), path, path.with_suffix(".json"))
        bad = report.claimed_failures()
        for op, failed in bad.items():
            logger.info("claimed but failing: %s: %s", op, ", ".join(c.case_name for c in failed))
        if args.check and bad:
            status = max(status, 1)
    return status


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
