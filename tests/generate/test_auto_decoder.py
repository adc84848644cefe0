"""``backends="auto"`` on a decoder (issue 29): every engine that runs the whole graph generates
for real (prompt, then greedy tokens through its cache), is timed on decode tokens/s and judged
by teacher-forced greedy agreement with ONNX Runtime; the choice is cached."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.generate.test_artifact import tiny_config, tiny_model, write_tiny

import ferry
from ferry.errors import FerryError
from ferry.generate._auto import AGREEMENT, NEW_TOKENS, DecoderCandidate, _choose
from ferry.generate._loop import DecoderSession


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FERRY_CACHE_DIR", str(tmp_path / "cache"))
    # A quiet machine, whatever else runs beside the tests (a busy one caches nothing).
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    return tmp_path / "cache"


def test_a_busy_machine_measures_but_caches_nothing(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    decoder = ferry.load(write_tiny(tmp_path / "tiny"), backends="onnxruntime", threads=1)
    assert decoder.auto is None  # only "auto" measures
    decoder = ferry.load(write_tiny(tmp_path / "busy"), backends="auto", threads=1)
    assert decoder.auto.busy.startswith("load average 64.0") and decoder.auto.cache_path is None
    assert not list(cache.glob("auto/decoder-*.json"))


def test_auto_measures_each_engine_and_keeps_the_tokens(tmp_path: Path, cache: Path) -> None:
    folder = write_tiny(tmp_path / "tiny")
    decoder = ferry.load(folder, backends="auto", threads=1)
    assert isinstance(decoder, DecoderSession)
    choice = decoder.auto
    rows = {row["label"]: row for row in choice.table}
    reference = rows["onnxruntime fp32"]
    assert reference["agreement"] == 1.0 and reference["decode_tokens_per_s"] > 0
    assert reference["ttft_ms"] > 0
    if "openvino" in ferry.backends.known_backends():
        assert {"openvino fp32"} <= set(rows)
        assert rows["openvino fp32"]["error"] is None
        assert rows["openvino fp32"]["agreement"] >= AGREEMENT
    chosen = rows[choice.label]
    assert chosen["passed"] and decoder.session.plan.backends == [choice.backend]
    assert 2 <= choice.new_tokens <= NEW_TOKENS and not choice.from_cache
    again = ferry.load(folder, backends="auto", threads=1)
    assert again.auto.from_cache and again.auto.label == choice.label
    assert (
        again.generate(ids=[5, 6], max_new_tokens=4).ids
        == decoder.generate(ids=[5, 6], max_new_tokens=4).ids
    )
    assert list(cache.glob("auto/decoder-*.json"))


def test_an_engine_that_cannot_run_the_whole_graph_is_named(tmp_path: Path, cache: Path) -> None:
    pytest.importorskip("ai_edge_litert")
    folder = write_tiny(tmp_path / "fused", model=tiny_model(tiny_config(), "ort"))
    decoder = ferry.load(folder, backends="auto", threads=1, cache_dir=False)
    rows = {row["label"]: row for row in decoder.auto.table}
    assert "does not run the whole decoder" in rows["litert fp32"]["error"], rows
    assert rows[decoder.auto.label]["passed"]
    assert not list(cache.glob("auto/decoder-*.json"))  # cache_dir=False: nothing kept


def candidate(label: str, rate: float, agreement: float) -> DecoderCandidate:
    name, precision = label.split()
    return DecoderCandidate(label, name, precision, decode_tokens_per_s=rate, agreement=agreement)


def test_the_fastest_that_keeps_the_tokens_wins() -> None:
    ref = candidate("onnxruntime fp32", 100, 1.0)
    lossy = candidate("openvino bf16", 300, AGREEMENT - 0.01)
    faster = candidate("openvino fp32", 150, 0.99)
    assert _choose([ref, lossy, faster]) is faster
    # within TIE of the fastest, the reference
    assert _choose([ref, candidate("openvino fp32", 102, 1.0)]) is ref
    with pytest.raises(FerryError, match="openvino bf16: agreement"):
        _choose([candidate("onnxruntime fp32", 0, 0.5), lossy])
