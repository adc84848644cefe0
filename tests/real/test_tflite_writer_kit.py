"""The TFLite writer on the kit's ``.tflite`` models (made by TensorFlow's converter for Basic
Pitch, the FER emotion classifier and microWakeWord): read, written back, and run in LiteRT on the
kit's realistic inputs against the original file.

The written file must compute the same outputs bit for bit, call after call. The wake-word model
is stateful (resource variables carry its streaming buffers): both files get the same stream of
calls, each on a fresh interpreter, and the values the model assigns to its variables must agree
too. Reading the written file gives back the model read, field by field, and the op versions the
writer computes are the ones TensorFlow's converter chose.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kit_models
from ferry.tflite import read_tflite, write_tflite
from tf_references import LiteRTStream, litert_output_quantization

pytest.importorskip("ai_edge_litert.interpreter", reason="ai-edge-litert (LiteRT) is not installed")

TFLITE_IDS = kit_models.ids("tflite")
#: Calls per model: enough for the wake-word model's buffers to fill and its state to move.
STREAM = {"wakeword_int8": 12}


def _assert_same(a: Any, b: Any, where: str = "model") -> None:
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), where
        for field in dataclasses.fields(a):
            _assert_same(getattr(a, field.name), getattr(b, field.name), f"{where}.{field.name}")
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"), where
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}[{key!r}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.fixture(scope="module", params=TFLITE_IDS)
def written(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(model id, the kit file, the file the writer made of what the reader read)."""
    mid = request.param
    if not kit_models.kit_ready():
        pytest.skip("the real-model kit is not fetched: run scripts/fetch-kit.sh")
    source = kit_models.path(mid)
    out = tmp_path_factory.mktemp(mid) / "written.tflite"
    out.write_bytes(write_tflite(read_tflite(source.read_bytes(), str(source))))
    return mid, source, out


def test_written_model_runs_bit_exact(written: tuple[str, Path, Path]) -> None:
    mid, source, out = written
    original, rewritten = LiteRTStream(source), LiteRTStream(out)
    assert sorted(original.assigned) == sorted(rewritten.assigned)
    calls = STREAM.get(mid, 2)
    got_all: list[dict[str, np.ndarray]] = []
    want_all: list[dict[str, np.ndarray]] = []
    for step in range(calls):
        feeds = kit_models.feeds(mid, step % 6)
        want, want_vars = original.step(feeds)
        got, got_vars = rewritten.step(feeds)
        assert list(got) == list(want), step
        for name in want:
            assert got[name].dtype == want[name].dtype, (step, name)
            assert np.array_equal(got[name], want[name], equal_nan=True), f"call {step}: {name}"
        for var in want_vars:
            assert np.array_equal(got_vars[var], want_vars[var]), f"call {step}: variable {var}"
        got_all.append(got)
        want_all.append(want)
    if original.assigned:
        # The stream moved the state, so agreeing on it proved something.
        first, last = LiteRTStream(source).step(kit_models.feeds(mid, 0))[1], want_vars
        assert any(not np.array_equal(first[v], last[v]) for v in first)
    stacked = {k: np.concatenate([g[k] for g in got_all]) for k in got_all[0]}
    reference = {k: np.concatenate([w[k] for w in want_all]) for k in want_all[0]}
    kit_models.judged(
        mid,
        f"write_tflite round trip ({calls} calls)",
        stacked,
        reference,
        dequantize=litert_output_quantization(source) or None,
    )


def test_written_model_reads_back_the_same(written: tuple[str, Path, Path]) -> None:
    """Field by field (tensors, constants, quantization, operators, options, signatures,
    metadata); a file without signatures gains the default one."""
    _, source, out = written
    model = read_tflite(source.read_bytes(), str(source))
    again = read_tflite(out.read_bytes(), str(out))
    if not model.signatures:
        (sig,) = again.signatures
        assert (sig.key, sig.subgraph) == ("serving_default", 0)
        again.signatures = []
    _assert_same(model, again)


def test_computed_versions_are_the_converters(written: tuple[str, Path, Path]) -> None:
    """Versions cleared and recomputed are what TensorFlow's converter wrote (one per builtin:
    the highest its instances need)."""
    _, source, _ = written
    model = read_tflite(source.read_bytes(), str(source))
    theirs: dict[str, set[int]] = {}
    for graph in model.subgraphs:
        for op in graph.operators:
            theirs.setdefault(op.display_name, set()).add(op.version)
            op.version = 0
    start = time.perf_counter()
    content = write_tflite(model)
    elapsed = time.perf_counter() - start
    ours: dict[str, int] = {}
    for graph in read_tflite(content, "written").subgraphs:
        for op in graph.operators:
            ours[op.display_name] = max(ours.get(op.display_name, 0), op.version)
    assert {k: {v} for k, v in ours.items()} == theirs
    assert elapsed < 2.0, f"writing {len(content)} bytes took {elapsed:.2f} s"
