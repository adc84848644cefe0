"""Print the README's kit table from a real-tier run's report.

    FERRY_REAL_REPORT=real.json bash scripts/test.sh tests/real
    .venv/bin/python tests/real/table.py real.json

Each cell is the lowest task-level score a verb got on that model (both kit inputs, every output
judged): agreement as a fraction for top1 / mask / argmax_seq, the similarity for cosine
(6 decimals).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

VERBS = ("convert", "ferry run", "ferry.load", "openvino+onnxruntime", "ferry serve")


def main(report: str) -> None:
    rows = json.loads(Path(report).read_text(encoding="utf-8"))
    sys.path.insert(0, str(Path(__file__).parent))
    import kit_models

    worst: dict[tuple[str, str], float] = {}
    for row in rows:
        key = (row["model"], row["verb"])
        worst[key] = min(worst.get(key, 1.0), float(row["score"]))
    print("| kit model | format | judge | " + " | ".join(VERBS) + " |")
    print("|---" * (3 + len(VERBS)) + "|")
    for mid in kit_models.ids():
        entry = kit_models.entry(mid)
        judge = entry["judge"]["kind"]
        cells = []
        for verb in VERBS:
            score = worst.get((mid, verb))
            if verb == "convert" and entry["format"] == "onnx":
                cells.append("(ONNX)")
            else:
                digits = 6 if judge == "cosine" else 4
                cells.append("-" if score is None else f"{score:.{digits}f}")
        print(f"| {mid} | {entry['format']} | {judge} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
