"""``scripts/demo.sh``, the first of the README's two commands, runs every verb and each is verified.

The demo trains the digits CNN, then converts, optimizes, inspects, runs, quantizes, prunes and
distills, exports for TFLite and the web, scores every model it made on the 360 test digits in
each one's own runtime, benchmarks and serves. This runs it whole (a couple of minutes on 2
cores) and checks each step printed its verdict, and that no model it made lost accuracy.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "scripts" / "demo.sh"

#: Each step's header, and what its verb prints when it is done (any one of them).
STEPS: list[tuple[str, tuple[str, ...]]] = [
    ("1. the bundled example", ("PyTorch test accuracy: ",)),
    ("2. ferry convert", ("/model.onnx (opset 20, checked)",)),
    ("3. ferry convert again", ("/model17.onnx (opset 17, checked)",)),
    ("4. ferry optimize", ("wrote {out}/model.opt.onnx", "not written")),
    ("5. ferry info", ("nodes: 7",)),
    ("6. ferry run", ("predicted digits: [",)),
    ("7. ferry quantize", ("wrote {out}/model.int8.onnx", "quantize refused int8 here")),
    ("8. ferry prune + ferry distill", ("wrote {out}/pruned.onnx",)),
    ("8. ferry prune + ferry distill", ("wrote {out}/distilled.onnx",)),
    ("9. ferry export --target tflite", ("wrote {out}/model.tflite",)),
    ("10. ferry export --target web", ("in Node (onnxruntime-web, wasm) vs ONNX Runtime: parity ok",)),
    ("11. every model made above", ("site in Node (onnxruntime-web, wasm): test accuracy",)),
    ("12. ferry bench", ("results saved in",)),
    ("13. ferry serve", ("served model", "server stopped cleanly")),
]  # fmt: skip


def _venv_ready() -> str | None:
    """Why the demo cannot run here without installing anything, or None when it can."""
    venv = ROOT / ".venv"
    stamp = venv / ".ferry-installed"
    want = hashlib.sha256(
        (ROOT / "pyproject.toml").read_bytes() + (ROOT / "scripts" / "setup.sh").read_bytes()
    ).hexdigest()
    if not stamp.is_file() or stamp.read_text().strip() != want:
        return "the demo's .venv is not set up (run `bash scripts/setup.sh` or scripts/test.sh)"
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "the demo's web step needs Node.js and npm: run scripts/browser-env.sh"
    return None


@pytest.mark.slow
def test_demo_runs_every_verb(tmp_path: Path) -> None:
    why = _venv_ready()
    if why is not None:
        if os.environ.get("FERRY_CI") == "1":
            pytest.fail(f"{why} (CI sets it up)")
        pytest.skip(why)
    out = tmp_path / "demo-out"
    proc = subprocess.run(
        ["bash", str(DEMO), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "Traceback" not in log, log[-4000:]
    for header, verdicts in STEPS:
        section = log.split(f"==> {header}", 1)
        assert len(section) == 2, f"step {header!r} did not run:\n{log[-3000:]}"
        body = re.split(r"\n==> ", section[1], maxsplit=1)[0]
        wanted = [v.format(out=out) for v in verdicts]
        assert any(v in body for v in wanted), f"step {header!r} printed none of {wanted}:\n{body}"
    assert re.search(r"demo done in \d+ s", log), log[-2000:]
    # Every model made, in its own runtime, on the 360 test digits: none lost more than a point.
    scores = {
        Path(m.group(1)).name: float(m.group(2))
        for m in re.finditer(r"^(\S+) in .+?: test accuracy ([\d.]+)%$", log, re.MULTILINE)
    }
    made = {"model.onnx", "model.opt.onnx", "distilled.onnx", "model.tflite", "site"}
    assert made <= set(scores), scores
    for name in made | ({"model.int8.onnx"} & set(scores)):
        assert scores[name] >= scores["model.onnx"] - 1.0, (name, scores)
