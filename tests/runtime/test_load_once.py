"""The runtime's seams (issue 28): ``ferry.load`` spells out its keywords and names them when one
is misspelt, ``auto`` and the pays check build each session they time once and hand the one kept
to ``load``, and every cache lives under one root.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
import pytest

import fake_engines
import ferry
from ferry.graph import prepare
from ferry.runtime import _auto, _load, _measure, _pays, _session
from ferry.runtime import load as runtime_load


def test_a_misspelt_keyword_to_load_names_the_keywords_it_takes() -> None:
    with pytest.raises(ferry.InvalidInputError) as info:
        ferry.load("never-read.onnx", backend="openvino")
    message = str(info.value)
    assert "'backend'" in message and "did you mean 'backends'?" in message
    for key in ("optimize", "backends", "threads", "cache_dir", "shapes", "check_pays"):
        assert key in message


def test_the_facade_spells_out_every_keyword_of_runtime_load() -> None:
    def keywords(function: Any) -> dict[str, Any]:
        return {
            name: param.default
            for name, param in inspect.signature(function).parameters.items()
            if param.kind is inspect.Parameter.KEYWORD_ONLY
        }

    facade = keywords(ferry.load)
    assert facade.pop("optimize") is False
    assert facade == keywords(runtime_load)


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_engines.register(monkeypatch)
    monkeypatch.setenv("FERRY_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every Session built meanwhile."""
    sessions: list[Any] = []
    init = _session.Session.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        sessions.append(self)

    monkeypatch.setattr(_session.Session, "__init__", counting)
    return sessions


def heavy() -> ir.Model:
    return prepare(ir.from_proto(fake_engines.heavy_model()))


def test_auto_builds_each_candidate_once_and_keeps_the_chosen_session(
    engines: None, built: list[Any]
) -> None:
    choice = _auto.auto_plan(heavy(), backends=["close", "wrong"], budget_s=0.05, cache=False)
    assert len(choice.candidates) == 3 and len(built) == 3
    assert choice.session is not None and choice.session.plan == choice.plan
    assert any(s is choice.session for s in built)


def test_load_auto_returns_the_session_it_timed(
    engines: None, built: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_load, "AUTO_BUDGET_S", 0.05)
    monkeypatch.setattr(_auto, "known_backends", lambda: ["close", "onnxruntime"])
    chosen: list[Any] = []

    def spying(*args: Any, **kwargs: Any) -> Any:
        chosen.append(_auto.auto_plan(*args, **kwargs))
        return chosen[-1]

    monkeypatch.setattr(_load, "auto_plan", spying)
    session = ferry.load(heavy(), backends="auto", cache_dir=False)
    (choice,) = chosen
    assert len(built) == len(choice.candidates) == 2  # not one more for the session returned
    assert session is choice.session and session.plan.backends == ["close"]
    # From the cache, nothing is measured: the one session built is the one returned.
    built.clear()
    again = ferry.load(heavy(), backends="auto", cache_dir=False)
    assert chosen[-1].from_cache and built == [again]


@pytest.mark.parametrize(("plan_ms", "alone_ms", "kept"), [(1.0, 2.0, "close"), (2.0, 1.0, None)])
def test_the_pays_check_returns_the_session_it_timed(
    engines: None,
    built: list[Any],
    monkeypatch: pytest.MonkeyPatch,
    plan_ms: float,
    alone_ms: float,
    kept: str | None,
) -> None:
    def timed(runs: list[Any], feeds: Any, budget_s: float) -> None:
        for contender, _ in runs:
            contender.latency_ms = plan_ms if contender.label == "plan" else alone_ms

    monkeypatch.setattr(_pays, "time_in_blocks", timed)
    session = ferry.load(heavy(), backends="close,onnxruntime", cache_dir=False)
    assert session.plan.backends == [kept or "onnxruntime"]
    assert len(built) == 2 and any(s is session for s in built)  # the plan and ONNX Runtime
    got = session.run({"x": np.ones((2, fake_engines.WIDTH), np.float32)})
    assert got["y"].shape == (2, fake_engines.WIDTH)


def test_every_cache_lives_under_one_root(
    engines: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("FERRY_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    root = tmp_path / "xdg" / "ferry"
    assert ferry.runtime.default_cache_dir() == root
    engines_cache = ferry.runtime.resolve_cache(None)
    assert engines_cache is not None and engines_cache.root == root
    assert _measure.verdicts_dir() == root / "auto"
    choice = _auto.auto_plan(heavy(), backends=["close"], budget_s=0.05)
    assert choice.cache_path is not None and choice.cache_path.parent == root / "auto"
    model = heavy()
    session = ferry.load(model, backends="close", cache_dir=False)
    feeds = {"x": np.ones((1, fake_engines.WIDTH), np.float32)}
    _pays.plan_pays(model, session, feeds)
    assert _pays.cached_verdict(model, session.plan, feeds) is not None
    assert [p.parent for p in root.glob("auto/pays-*.json")] == [root / "auto"]
    monkeypatch.setenv("FERRY_CACHE_DIR", str(tmp_path / "env"))
    assert _measure.verdicts_dir() == tmp_path / "env" / "auto"
    assert ferry.runtime.default_cache_dir() == tmp_path / "env"
