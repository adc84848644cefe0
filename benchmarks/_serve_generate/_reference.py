"""``ferry generate``'s own decode speed on the artifact ``ferry serve`` loads, the yardstick of
issue 30's goal at concurrency 1 (one served stream within 10% of it): ``ferry bench ARTIFACT
--generate`` (a fresh process, greedy, exactly ``new_tokens`` tokens, eos ignored, the median of
three runs after a warm-up), on ONNX Runtime with the same threads."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

PROMPT_TOKENS = 64


def generate_reference(artifact: Path, *, threads: int, new_tokens: int) -> dict[str, Any]:
    """``{"decode_tokens_per_s", "ttft_ms", "label"}`` (medians) from ``ferry bench --generate``,
    or ``{"error": why}``."""
    with tempfile.TemporaryDirectory(prefix="ferry-serve-gen-ref-") as tmp:
        out = Path(tmp) / "bench.json"
        command = [sys.executable, "-m", "ferry.cli.main", "bench", str(artifact), "--generate"]
        command += ["--prompt-tokens", str(PROMPT_TOKENS), "--new-tokens", str(new_tokens)]
        command += ["--threads", str(threads), "-n", "3", "--backends", "onnxruntime"]
        command += ["--json", str(out)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not out.is_file():
            tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
            return {"error": f"ferry bench --generate failed ({done.returncode}): {tail[0]}"}
        results = json.loads(out.read_text(encoding="utf-8"))
    for row in results.get("configurations", []):
        if row.get("backend") == "onnxruntime" and not row.get("error") and not row.get("skipped"):
            return {
                "label": row.get("label"),
                "decode_tokens_per_s": row["decode_tokens_per_s"]["median"],
                "ttft_ms": row["ttft_ms"]["median"],
                "prompt_tokens": PROMPT_TOKENS,
                "new_tokens": new_tokens,
            }
    return {"error": "ferry bench --generate measured no ONNX Runtime configuration"}
