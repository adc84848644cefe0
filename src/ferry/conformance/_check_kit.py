"""The kit check: a sample of the real-model kit's CNNs (models made by others) loaded with
``ferry.load(path, backends=[NAME, "onnxruntime"])`` and judged at the task against ONNX Runtime
alone, with each model's judge from the kit's manifest (``kit.json``) through
:func:`ferry.parity.judge`.

The kit's models are fetched by ``bash scripts/fetch-kit.sh`` into ``$FERRY_KIT`` (default
``~/.cache/ferry-kit``); its tools (``kit.json``, the manifest, and ``inputs.py``, which builds
each model's realistic inputs) come with the repository (``tests/real/kit``) and are found at
``kit_tools``, ``$FERRY_KIT_TOOLS``, the kit folder itself, or ``tests/real/kit`` under the
current folder (a checkout). ferry's package imports nothing from ``tests/``: the tools are the
kit's own files, read from where they lie. Without ``inputs.py`` (or what it imports) the inputs
are ferry's own found inputs (:func:`ferry.runtime.found_inputs`), said in the row.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ferry.conformance._checks import CheckResult
from ferry.conformance._runner import one_line

if TYPE_CHECKING:
    from types import ModuleType

    from ferry.backends import Backend

__all__ = ["FETCH_COMMAND", "KIT_SAMPLE", "check_kit", "kit_dir", "kit_tools"]

#: The kit models judged by default: four CNNs of different tasks.
KIT_SAMPLE = ("orientation", "open_nsfw", "captcha_det", "mtcnn_torch")
FETCH_COMMAND = "bash scripts/fetch-kit.sh"
_TOOLS = ("kit.json", "inputs.py")


def kit_dir() -> Path:
    """Where the kit's models are fetched: ``$FERRY_KIT``, else ``~/.cache/ferry-kit``."""
    return Path(os.environ.get("FERRY_KIT") or Path.home() / ".cache" / "ferry-kit")


def kit_tools(given: str | os.PathLike[str] | None = None) -> Path | None:
    """The folder holding the kit's ``kit.json`` (and ``inputs.py``), or None when none is found."""
    candidates = [given, os.environ.get("FERRY_KIT_TOOLS"), kit_dir(), Path("tests/real/kit")]
    for folder in candidates:
        if folder and (Path(folder) / _TOOLS[0]).is_file():
            return Path(folder).resolve()
    return None


def check_kit(
    backend: Backend,
    *,
    models: Sequence[str] = KIT_SAMPLE,
    tools: str | os.PathLike[str] | None = None,
    files: Mapping[str, str | os.PathLike[str]] | None = None,
) -> CheckResult:
    """Run the kit check on ``backend`` (see the module's docstring).

    Args:
        backend: the adapter, registered (``ferry.load`` reaches it by name).
        models: the kit model ids to judge.
        tools: the folder of the kit's ``kit.json`` and ``inputs.py`` (see :func:`kit_tools`).
        files: ONNX files to load for some ids instead of the kit's own file: a model the kit
            holds in another format (MTCNN's PyTorch state_dicts), converted with ``ferry
            convert``; its inputs and judge stay the kit's.
    """
    kit = kit_dir()
    if not (kit / "models" / ".done").is_file():
        line = f"the real-model kit is not fetched into {kit}: run `{FETCH_COMMAND}` (or set $FERRY_KIT)"
        return CheckResult("kit", "skip", line, details=[line])
    folder = kit_tools(tools)
    if folder is None:
        line = (
            "the kit's tools (kit.json, inputs.py) were not found: pass --kit-tools DIR "
            "(tests/real/kit in a checkout) or set $FERRY_KIT_TOOLS"
        )
        return CheckResult("kit", "skip", line, details=[line])
    text = (folder / _TOOLS[0]).read_text(encoding="utf-8")
    manifest = {e["id"]: e for e in json.loads(text)["models"]}
    recipes, why_not = _recipes(folder)
    given = {k: Path(v) for k, v in (files or {}).items()}
    rows = [
        _judge_model(backend.name, manifest.get(m), m, kit, recipes, given.get(m)) for m in models
    ]
    if why_not:
        for row in rows:
            if row["status"] != "skip":
                row["inputs"] = f"found by ferry ({why_not})"
    judged = [r for r in rows if r["status"] in ("pass", "fail", "error")]
    failed = [r for r in rows if r["status"] in ("fail", "error")]
    details = [f"kit tools: {folder}; models: {kit / 'models'}"]
    if failed:
        first = failed[0]
        summary = (
            f"{len(failed)} of {len(judged)} kit models fail: {first['model']}: {first['note']}"
        )
        return CheckResult("kit", "fail", summary, details=details, rows=rows)
    if not judged:
        return CheckResult(
            "kit", "skip", "no sampled kit model could be run", details=details, rows=rows
        )
    skipped = len(rows) - len(judged)
    summary = (
        f"{len(judged)} kit model{'s' if len(judged) != 1 else ''} judged at the task against "
        "ONNX Runtime alone, all pass" + (f"; {skipped} not run (see the table)" if skipped else "")
    )
    return CheckResult("kit", "pass", summary, details=details, rows=rows)


def _recipes(folder: Path) -> tuple[ModuleType | None, str | None]:
    """The kit's ``inputs.py`` loaded from ``folder``, or None and why not."""
    path = folder / _TOOLS[1]
    if not path.is_file():
        return None, f"no {_TOOLS[1]} beside kit.json"
    spec = importlib.util.spec_from_file_location("ferry_kit_inputs", path)
    if spec is None or spec.loader is None:
        return None, f"{path} cannot be loaded"
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # what the recipes import (Pillow, scikit-image) may be absent
        return None, f"the kit's inputs.py does not import here: {one_line(e, 120)}"
    return module, None


def _judge_model(
    name: str,
    entry: dict[str, Any] | None,
    model_id: str,
    kit: Path,
    recipes: ModuleType | None,
    file: Path | None,
) -> dict[str, Any]:
    """One table row: the model on ``name`` and ONNX Runtime against ONNX Runtime alone (from
    ``file`` when given, else the kit's own file)."""
    row: dict[str, Any] = {
        "model": model_id,
        "placed": "",
        "agreement": "",
        "status": "skip",
        "inputs": "",
        "seconds": 0.0,
        "note": "",
    }
    if entry is None:
        row["note"] = "not in the kit's manifest"
        return row
    if file is None and entry["format"] != "onnx":
        row["note"] = (
            f"a {entry['format']} model, not ONNX: convert it (ferry convert) and pass "
            f"--kit-file {model_id}=FILE.onnx"
        )
        return row
    path = file if file is not None else kit / "models" / entry["file"]
    import time

    start = time.perf_counter()
    try:
        _run_model(name, entry, path, kit, recipes, row)
        if file is not None:
            row["note"] = "; ".join(
                x for x in (f"converted file given: {file.name}", row["note"]) if x
            )
    except Exception as e:
        row["status"], row["note"] = "error", one_line(e, 200)
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def _run_model(
    name: str,
    entry: dict[str, Any],
    path: Path,
    kit: Path,
    recipes: ModuleType | None,
    row: dict[str, Any],
) -> None:
    from ferry.parity import judge
    from ferry.runtime import found_inputs, load

    if recipes is not None:
        feeds = {k: np.asarray(v) for k, v in recipes.feeds(entry["id"], kit).items()}
        row["inputs"] = "the kit's recipes"
    else:
        feeds = dict(found_inputs(path).feeds)
    want = load(path, backends=["onnxruntime"]).run(feeds)
    session = load(
        path,
        backends=[name, "onnxruntime"],
        placement="fixed",
        check_pays=False,
        example_inputs=feeds,
    )
    total = sum(len(p.nodes) for p in session.plan.partitions)
    on = sum(len(p.nodes) for p in session.plan.partitions if p.backend == name)
    row["placed"] = f"{on}/{total}"
    got = session.run(feeds)
    spec = dict(entry["judge"])
    verdicts = judge(spec)(dict(got), dict(want))
    kinds: dict[str, list[Any]] = {}
    for v in verdicts:
        kinds.setdefault(v.kind, []).append(v)
    row["agreement"] = "; ".join(
        f"{kind} {min(v.score for v in vs):.4f} (>= {vs[0].threshold:g})"
        + (f", the worst of {len(vs)} outputs" if len(vs) > 1 else "")
        for kind, vs in kinds.items()
    )
    bad = [v for v in verdicts if not v.passed]
    if bad:
        row["status"] = "fail"
        row["note"] = "; ".join(f"{v.output}: {v.detail}" for v in bad)
    else:
        row["status"] = "pass"
        row["note"] = "" if on else f"no node placed on {name}: ONNX Runtime ran it all"
