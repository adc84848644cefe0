"""Print the README's kit table from a real-tier run's report and the as-typed matrix's cells.

    FERRY_REAL_REPORT=real.json bash scripts/test.sh tests/real
    .venv/bin/python benchmarks/as_typed.py --json as_typed.json
    .venv/bin/python tests/real/table.py real.json as_typed.json [--keep README.md]

Each cell of the real tier's columns is the lowest task-level score a verb got on that model
(both kit inputs, every output judged): agreement as a fraction for top1 / mask / argmax_seq, the
similarity for cosine (6 decimals). The as-typed columns (``benchmarks/as_typed.py``: each verb
typed as its ``--help`` example shows, no ``--shape``, ``--input`` or ``--metric``) show the same
score where the verb wrote a model, ``ok`` where it wrote nothing to judge, and otherwise
``refused`` or ``fail`` with a note under the table. ``--keep README.md``: a cell no report
measured keeps the README's current value (a run of part of the tier).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

VERBS = ("convert", "ferry run", "ferry.load", "openvino+onnxruntime", "ferry serve")
#: The as-typed matrix's verbs shown in columns of their own, and their headers.
TYPED = {
    "optimize": "optimize",
    "quantize": "quantize",
    "tflite": "export tflite",
    "web": "export web",
    "ort-mobile": "export ort-mobile",
}
#: The as-typed verbs summarized in one column (each passing or refused cleanly).
TYPED_REST = ("run", "plan", "bench", "serve")
REST_HEADER = "as typed: run --random, plan auto, bench, serve"


def _kept(readme: Path) -> dict[tuple[str, str], str]:
    """The cells of the README's current kit table, by (model, header)."""
    lines = [ln for ln in readme.read_text(encoding="utf-8").splitlines() if ln.startswith("| ")]
    header: list[str] = []
    out: dict[tuple[str, str], str] = {}
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == "kit model":
            header = cells
        elif header and len(cells) == len(header):
            out.update({(cells[0], h): c for h, c in zip(header, cells)})
    return out


def main(reports: list[str], keep: str | None = None) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import kit_models

    worst: dict[tuple[str, str], float] = {}
    typed: dict[tuple[str, str], dict[str, object]] = {}
    for report in reports:
        for row in json.loads(Path(report).read_text(encoding="utf-8")):
            key = (row["model"], row["verb"])
            if "status" in row:  # an as-typed cell
                typed[key] = row
            else:
                worst[key] = min(worst.get(key, 1.0), float(row["score"]))
    kept = _kept(Path(keep)) if keep else {}
    notes: list[str] = []

    def note(text: str) -> int:
        text = re.sub(r"(?:/[\w.+-]+)+/(?=[\w.-]+)", "", text)  # a run's folders: names only
        text = text if len(text) <= 240 else text[:239] + "…"
        if text not in notes:
            notes.append(text)
        return notes.index(text) + 1

    headers = [*VERBS, *TYPED.values(), REST_HEADER]
    print("| kit model | format | judge | " + " | ".join(headers) + " |")
    print("|---" * (3 + len(headers)) + "|")
    for mid in kit_models.tensor_ids():
        entry = kit_models.entry(mid)
        judge = entry["judge"]["kind"]

        def score(value: float | None, digits: int = 6 if judge == "cosine" else 4) -> str:
            return "-" if value is None else f"{value:.{digits}f}"

        cells = []
        for verb in VERBS:
            if verb == "convert" and entry["format"] == "onnx":
                cells.append("(ONNX)")
            elif (mid, verb) in worst:
                cells.append(score(worst[mid, verb]))
            elif (mid, verb) in kept:
                cells.append(kept[mid, verb])
            elif verb == "ferry serve" and typed.get((mid, "serve"), {}).get("status") == "pass":
                # The as-typed matrix's serve cell is judged the same way (Triton's client).
                value = typed[mid, "serve"].get("score")
                cells.append("pass" if value is None else score(float(value)))  # type: ignore[arg-type]
            else:
                cells.append("-")
        for verb, header in TYPED.items():
            row = typed.get((mid, verb))
            if row is None:
                cells.append(kept.get((mid, header), "-"))
            elif row["status"] == "pass":
                value = row.get("score")
                cells.append("ok" if value is None else score(float(value)))  # type: ignore[arg-type]
            elif slower := re.search(
                r"slower on \w+: ([\d.]+) ms -> ([\d.]+) ms", str(row["detail"])
            ):
                # Refused as slower than the float model: the figures say it all.
                cells.append(f"refused: slower, {slower[1]} -> {slower[2]} ms")
            else:
                cells.append(f"{row['status']} ({note(str(row['detail']))})")
        rest = []
        for verb in TYPED_REST:
            row = typed.get((mid, verb))
            if row is not None and row["status"] != "pass":
                rest.append(f"{verb}: {row['status']} ({note(str(row['detail']))})")
        measured = any((mid, verb) in typed for verb in TYPED_REST)
        cells.append(
            ("; ".join(rest) or "all pass") if measured else kept.get((mid, REST_HEADER), "-")
        )
        print(f"| {mid} | {entry['format']} | {judge} | " + " | ".join(cells) + " |")
    if notes:
        print()
        for i, text in enumerate(notes, 1):
            print(f"({i}) {text.replace('|', '/')}  ")


if __name__ == "__main__":
    args = sys.argv[1:]
    readme = None
    if "--keep" in args:
        at = args.index("--keep")
        readme = args[at + 1]
        del args[at : at + 2]
    main(args, readme)
