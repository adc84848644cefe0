"""Every verb on every non-generative kit model, typed as its ``--help`` example shows (issue 31).

    .venv/bin/python benchmarks/as_typed.py [--models a,b] [--verbs run,optimize] [--jobs 2]
        [--timeout 600] [--work /tmp/as-typed] [--json as_typed.json] [--failures FILE]

No ``--shape``, ``--input`` or ``--metric`` anywhere: each cell passes (the verb exits 0 and what
it wrote answers the task at the kit's judge), is refused cleanly (exit 2 or 3, one ``error:``
line naming what to give) or fails (a traceback, exit 1, a timeout, a judge's verdict). Kit
models that are not ONNX are converted first as the real tier converts them
(``kit_models.convert``), once, into ``WORK/converted``. The cells are in
``tests/real/typed_cells.py``; ``--json`` keeps them for ``tests/real/table.py``; ``--failures``
writes one line per failed cell with its owner. ``tests/real/test_as_typed.py`` is the same
matrix under pytest.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# Not this folder: a module here named like a package would hide it (a tflite.py once did).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "real"))

import kit_models  # noqa: E402
import typed_cells  # noqa: E402


def onnx_path(mid: str, work: Path) -> Path:
    """The model as an ONNX file: the kit's own, or converted once into ``work/converted``."""
    if kit_models.entry(mid)["format"] == "onnx":
        return kit_models.path(mid)
    out = work / "converted" / f"{mid}.onnx"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        kit_models.convert(mid, out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="", help="comma-separated kit ids (default: all)")
    parser.add_argument("--verbs", default="", help="comma-separated verbs (default: all)")
    parser.add_argument("--jobs", type=int, default=1, help="cells at once")
    parser.add_argument("--timeout", type=float, default=typed_cells.TIMEOUT_S)
    parser.add_argument("--work", type=Path, default=Path("/tmp/as-typed"))
    parser.add_argument("--json", type=Path, help="write the cells here (merged by model, verb)")
    parser.add_argument("--failures", type=Path, help="write the failed cells here, with owners")
    args = parser.parse_args()
    models = args.models.split(",") if args.models else typed_cells.tensor_models()
    verbs = args.verbs.split(",") if args.verbs else list(typed_cells.VERBS)
    args.work.mkdir(parents=True, exist_ok=True)

    paths: dict[str, Path] = {}
    for mid in models:
        missing = kit_models.missing_framework(mid)
        if missing is not None:
            print(f"{mid}: skipped ({missing})", flush=True)
            continue
        try:
            paths[mid] = onnx_path(mid, args.work)
        except Exception as e:  # a conversion that fails is itself a result
            print(f"{mid}: conversion failed: {e}", flush=True)

    def one(key: tuple[str, str]) -> typed_cells.Cell:
        mid, verb = key
        cell = typed_cells.run_cell(mid, verb, paths[mid], args.work, args.timeout)
        score = "" if cell.score is None else f" (worst score {cell.score:.6f})"
        line = f"{mid:22} {verb:10} {cell.status:8} {cell.seconds:6.1f}s  {cell.detail}{score}"
        print(line, flush=True)
        return cell

    # Verb by verb (fast verbs first), every model: a slow verb does not hold the others back.
    keys = [(mid, verb) for verb in verbs for mid in models if mid in paths]
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        cells = list(pool.map(one, keys))
    total = time.monotonic() - start
    counts = {s: sum(c.status == s for c in cells) for s in ("pass", "refused", "fail")}
    print(f"{len(cells)} cells in {total / 60:.1f} min: {counts}", flush=True)

    if args.json:
        old = json.loads(args.json.read_text(encoding="utf-8")) if args.json.is_file() else []
        fresh = {(c.model, c.verb) for c in cells}
        kept = [r for r in old if (r["model"], r["verb"]) not in fresh]
        rows = kept + [c.to_dict() for c in cells]
        args.json.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    if args.failures:
        lines = [
            f"- {c.model} | {c.verb} | {c.detail} | {typed_cells.owner(c)}"
            for c in cells
            if c.status == "fail"
        ]
        args.failures.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
