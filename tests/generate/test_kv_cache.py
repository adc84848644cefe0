"""The decoder's key/value cache kept by the engine (issue 29): ONNX Runtime's I/O binding with
past and present sharing one buffer allocated once for the sequence (GroupQueryAttention graphs),
its presents handed back as OrtValues otherwise, and the numpy feed-back for other engines. Every
way gives the logits of the whole prompt run at once, on every tiny architecture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.generate.test_graph_decoder import CONFIGS, IDS, Runner, make_weights

from ferry.backends import CopyingKVRunner, KVLayout
from ferry.backends._onnxruntime_kv import OrtKVRunner
from ferry.backends._openvino_kv import OpenVINOKVRunner
from ferry.generate._graph import build_decoder
from ferry.runtime import load


def layout(cfg: Any, capacity: int, in_place: bool, batch: int = 1) -> KVLayout:
    past = tuple(
        f"past_key_values.{i}.{k}" for i in range(cfg.num_layers) for k in ("key", "value")
    )
    present = tuple(f"present.{i}.{k}" for i in range(cfg.num_layers) for k in ("key", "value"))
    return KVLayout(
        past,
        present,
        "logits",
        cfg.num_kv_heads,
        cfg.head_dim,
        np.float32,
        capacity,
        in_place,
        batch,
    )


def saved(model: Any, folder: Path) -> Path:
    import onnx_ir as ir

    path = folder / "model.onnx"
    ir.save(model, path)
    return path


def run_steps(runner: Any, ids: np.ndarray, cuts: list[int], capacity: int) -> np.ndarray:
    """The prompt fed in chunks ending at ``cuts``, through ``runner``'s cache."""
    out, start = [], 0
    for stop in cuts:
        width = capacity if runner.in_place else stop
        mask = np.zeros((1, width), np.int64)
        mask[0, :stop] = 1
        feeds = {
            "input_ids": ids[None, start:stop],
            "attention_mask": mask,
            "position_ids": np.arange(start, stop, dtype=np.int64)[None],
        }
        out.append(runner.run(feeds)[0])
        start = stop
    return np.concatenate(out)


CUTS = [4, 5, 6, 9, len(IDS)]  # a prompt chunk, single tokens, a chunk, a token


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_in_place_cache_matches_the_whole_prompt(name: str, tmp_path: Path) -> None:
    cfg = CONFIGS[name]
    model = build_decoder(cfg, make_weights(cfg), flavour="ort")
    session = load(saved(model, tmp_path), backends="onnxruntime")
    capacity = len(IDS) + 3  # wider than used: the empty slots are masked
    runner = session.kv_runner(layout(cfg, capacity, in_place=True))
    assert isinstance(runner, OrtKVRunner) and runner.in_place
    full = Runner(model, cfg).prompt(IDS)
    np.testing.assert_allclose(run_steps(runner, IDS, CUTS, capacity), full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("flavour", ["standard", "ort"])
def test_bound_presents_fed_back_match_the_whole_prompt(flavour: str, tmp_path: Path) -> None:
    cfg = CONFIGS["llama_gqa"]
    model = build_decoder(cfg, make_weights(cfg), flavour=flavour)
    session = load(saved(model, tmp_path), backends="onnxruntime")
    runner = session.kv_runner(layout(cfg, len(IDS), in_place=False))
    assert isinstance(runner, OrtKVRunner) and not runner.in_place
    full = Runner(model, cfg).prompt(IDS)
    np.testing.assert_allclose(run_steps(runner, IDS, CUTS, len(IDS)), full, rtol=1e-4, atol=1e-4)


def test_a_left_padded_batch_grows_its_cache(tmp_path: Path) -> None:
    """Two rows, the short one left-padded, each as if alone; GroupQueryAttention takes a batch's
    prompt only without a past, so a batch is not given the in-place buffer."""
    cfg = CONFIGS["llama_gqa"]
    model = build_decoder(cfg, make_weights(cfg), flavour="ort")
    session = load(saved(model, tmp_path), backends="onnxruntime")
    runner = session.kv_runner(layout(cfg, len(IDS) + 2, in_place=True, batch=2))
    assert not runner.in_place
    short = IDS[:6]
    pad = len(IDS) - len(short)
    ids = np.stack([IDS, np.concatenate([np.zeros(pad, np.int64), short])])
    mask = np.ones((2, len(IDS)), np.int64)
    mask[1, :pad] = 0
    pos = np.stack([np.arange(len(IDS)), np.clip(np.arange(len(IDS)) - pad, 0, None)])
    first = runner.run({"input_ids": ids, "attention_mask": mask, "position_ids": pos})
    reference = Runner(model, cfg)
    np.testing.assert_allclose(first[0], reference.prompt(IDS), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(first[1, pad:], reference.prompt(short), rtol=1e-4, atol=1e-4)
    mask = np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)
    step = runner.run(
        {
            "input_ids": np.array([[7], [7]]),
            "attention_mask": mask,
            "position_ids": np.array([[len(IDS)], [len(short)]]),
        }
    )
    np.testing.assert_allclose(
        step[0, 0], reference.prompt(np.append(IDS, 7))[-1], rtol=1e-4, atol=1e-4
    )
    np.testing.assert_allclose(
        step[1, 0], reference.prompt(np.append(short, 7))[-1], rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("flavour", ["standard", "ort"])
def test_openvino_keeps_the_cache_in_its_states(flavour: str, tmp_path: Path) -> None:
    pytest.importorskip("openvino")
    cfg = CONFIGS["llama_gqa"]
    model = build_decoder(cfg, make_weights(cfg), flavour=flavour)
    session = load(saved(model, tmp_path), backends="openvino")
    assert session.plan.backends == ["openvino"]
    runner = session.kv_runner(layout(cfg, len(IDS), in_place=False))
    assert isinstance(runner, OpenVINOKVRunner) and not runner.in_place
    full = Runner(model, cfg).prompt(IDS)
    np.testing.assert_allclose(run_steps(runner, IDS, CUTS, len(IDS)), full, rtol=1e-3, atol=1e-3)
    # a second sequence starts empty
    again = session.kv_runner(layout(cfg, len(IDS), in_place=False))
    np.testing.assert_allclose(run_steps(again, IDS, CUTS, len(IDS)), full, rtol=1e-3, atol=1e-3)


def test_an_engine_that_keeps_no_cache_gets_the_numpy_feed_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ferry.backends import BackendBase
    from ferry.backends._onnxruntime import OnnxRuntimeBackend

    # An engine that says nothing about caches (BackendBase's default).
    monkeypatch.setattr(OnnxRuntimeBackend, "kv_runner", BackendBase.kv_runner)
    cfg = CONFIGS["llama_gqa"]
    model = build_decoder(cfg, make_weights(cfg), flavour="standard")
    session = load(saved(model, tmp_path), backends="onnxruntime")
    runner = session.kv_runner(layout(cfg, len(IDS), in_place=False))
    assert isinstance(runner, CopyingKVRunner)
    full = Runner(model, cfg).prompt(IDS)
    np.testing.assert_allclose(run_steps(runner, IDS, CUTS, len(IDS)), full, rtol=1e-3, atol=1e-3)


def test_decoder_session_uses_the_in_place_cache(tmp_path: Path) -> None:
    """The token loop on an ORT-flavour artifact keeps its cache in place and gives the same
    greedy tokens as the numpy feed-back and as the standard-flavour graph."""
    from tests.generate.test_artifact import tiny_config, tiny_model, write_tiny

    from ferry.generate._loop import DecoderSession

    standard = DecoderSession.from_folder(write_tiny(tmp_path / "standard"))
    assert not standard.in_place_cache
    fused_folder = write_tiny(tmp_path / "fused", model=tiny_model(tiny_config(), "ort"))
    fused = DecoderSession.from_folder(fused_folder)
    assert fused.in_place_cache
    copying = DecoderSession.from_folder(fused_folder)
    copying.session.kv_runner = lambda layout: CopyingKVRunner(copying.session.run, layout)  # type: ignore[method-assign]
    want = standard.generate(ids=[5, 6, 7], max_new_tokens=8).ids
    assert fused.generate(ids=[5, 6, 7], max_new_tokens=8).ids == want
    assert copying.generate(ids=[5, 6, 7], max_new_tokens=8).ids == want


@pytest.mark.parametrize("flavour", ["standard", "ort"])
def test_the_head_runs_on_the_last_position_when_asked(flavour: str, tmp_path: Path) -> None:
    """logits_to_keep (default 0: all) lets the prompt skip the output head but for its last
    position; the token loop asks for it, a teacher-forced pass does not."""
    from tests.generate.test_artifact import tiny_config, tiny_model, write_tiny

    from ferry.generate._loop import DecoderSession

    folder = write_tiny(tmp_path / flavour, model=tiny_model(tiny_config(), flavour))
    decoder = DecoderSession.from_folder(folder)
    prompt = [5, 6, 7, 8]
    every = decoder.step(decoder.kv_runner(8), prompt, 0)
    last = decoder.step(decoder.kv_runner(8), prompt, 0, last_only=True)
    assert every.shape[0] == len(prompt) and last.shape[0] == 1
    np.testing.assert_allclose(last[0], every[-1], rtol=1e-5, atol=1e-5)
    copying = decoder.step(
        CopyingKVRunner(decoder.session.run, _layout_of(decoder, 8)), prompt, 0, last_only=True
    )
    assert copying.shape[0] == 1


def _layout_of(decoder: Any, capacity: int) -> KVLayout:
    return decoder.kv_runner(capacity).layout
