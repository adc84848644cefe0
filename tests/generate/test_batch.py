"""Continuous batching (issue 30): sequences join and leave the running batch at every step and
each gets exactly the tokens it gets alone; the cache is a pool under a budget (requests wait),
a full queue is refused, a cancelled stream frees its row, a drain finishes or aborts."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tests.generate.test_artifact import tiny_config, tiny_model, write_tiny

from ferry.backends import PerRowKVPool
from ferry.backends._onnxruntime_kv_pool import OrtKVPool
from ferry.errors import EngineBusyError, EngineClosedError, InvalidInputError
from ferry.generate import (
    BatchEngine,
    DecoderSession,
    Generation,
    GenerationRequest,
    TokenEvent,
)
from ferry.generate._sampling import sampling_options

PROMPTS = [[5, 6, 7], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50], [9], [100, 3, 3, 3, 100]]
PROMPTS += [[200 + i for i in range(20)], [17, 18]]


@pytest.fixture(scope="module")
def ort_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ort") / "tiny"
    return write_tiny(folder, model=tiny_model(tiny_config(), "ort"))


@pytest.fixture(scope="module")
def standard_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny(tmp_path_factory.mktemp("standard") / "tiny")


async def collect(engine: BatchEngine, request: GenerationRequest) -> Generation:
    async for item in engine.submit(request):
        if isinstance(item, Generation):
            return item
    raise AssertionError("no Generation")


def together(engine: BatchEngine, requests: list[GenerationRequest]) -> list[Generation]:
    async def main() -> list[Generation]:
        return list(await asyncio.gather(*(collect(engine, r) for r in requests)))

    return asyncio.run(main())


@pytest.mark.parametrize(
    ("flavour", "backends", "pool"),
    [
        ("ort", "onnxruntime", OrtKVPool),
        ("standard", "onnxruntime", PerRowKVPool),
        ("ort", "openvino", PerRowKVPool),
    ],
)
def test_each_sequence_gets_the_tokens_it_gets_alone(
    flavour: str, backends: str, pool: type, ort_folder: Path, standard_folder: Path
) -> None:
    if backends == "openvino":
        pytest.importorskip("openvino")
    folder = ort_folder if flavour == "ort" else standard_folder
    decoder = DecoderSession.from_folder(folder, backends=backends)
    alone = [decoder.generate(ids=p, max_new_tokens=12).ids for p in PROMPTS]
    # a chunk of 4 reads the longer prompts in several steps, between decode steps
    engine = BatchEngine(decoder, max_num_seqs=4, prefill_chunk=4)
    try:
        assert isinstance(engine._pool, pool)
        requests = [GenerationRequest(p, 12) for p in PROMPTS]
        got = together(engine, requests)
        assert [g.ids for g in got] == alone
        assert all(g.prompt_tokens == len(p) for g, p in zip(got, PROMPTS))
        # and sampled with a seed: the same tokens alone and among others
        sampled = [
            GenerationRequest(p, 10, sampling_options(temperature=0.9, top_p=0.9, seed=i))
            for i, p in enumerate(PROMPTS)
        ]
        first = [asyncio.run(collect(engine, r)).ids for r in sampled]
        assert [g.ids for g in together(engine, sampled)] == first
        assert engine.stats()["running"] == 0
    finally:
        engine.close()


def test_stop_strings_and_the_context_end_a_sequence(ort_folder: Path) -> None:
    decoder = DecoderSession.from_folder(ort_folder)
    want = decoder.generate(ids=PROMPTS[0], max_new_tokens=20)
    engine = BatchEngine(decoder, max_model_len=len(PROMPTS[0]) + 5)
    try:
        got = asyncio.run(collect(engine, GenerationRequest(PROMPTS[0], 20)))
        assert got.ids == want.ids[:5] and got.finish_reason == "length"
        if want.text:
            stop = want.text[len(want.text) // 2 :][:2]
            alone = decoder.generate(ids=PROMPTS[0], max_new_tokens=20, stop=stop)
            engine2 = BatchEngine(decoder)
            try:
                mine = asyncio.run(
                    collect(engine2, GenerationRequest(PROMPTS[0], 20, stop=(stop,)))
                )
            finally:
                engine2.close()
            assert (mine.text, mine.finish_reason) == (alone.text, alone.finish_reason)
    finally:
        engine.close()


def test_bad_requests_and_settings_are_refused(ort_folder: Path) -> None:
    decoder = DecoderSession.from_folder(ort_folder)
    with pytest.raises(InvalidInputError, match="max_model_len=1000"):
        BatchEngine(decoder, max_model_len=1000)
    with pytest.raises(InvalidInputError, match="max_num_seqs"):
        BatchEngine(decoder, max_num_seqs=0)
    with pytest.raises(InvalidInputError, match="--kv-cache-mib"):
        BatchEngine(decoder, kv_cache_mib=1e-6)
    engine = BatchEngine(decoder)

    async def main() -> None:
        with pytest.raises(InvalidInputError, match="the context is 64 tokens"):
            engine.submit(GenerationRequest(list(range(64)), 4))
        with pytest.raises(InvalidInputError, match="empty"):
            engine.submit(GenerationRequest([], 4))
        with pytest.raises(InvalidInputError, match="max_new_tokens"):
            engine.submit(GenerationRequest([1], 0))

    try:
        asyncio.run(main())
    finally:
        engine.close()


class Log:
    """An EngineObserver that writes down what happens, in order."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.reasons: list[str] = []

    def admitted(self, queued_seconds: float) -> None:
        self.events.append("admitted")

    def token(self, first: bool, seconds: float) -> None:
        assert seconds >= 0

    def finished(self, prompt_tokens: int, new_tokens: int, reason: str) -> None:
        self.events.append("finished")
        self.reasons.append(reason)


def test_requests_wait_for_the_cache_budget(ort_folder: Path) -> None:
    decoder = DecoderSession.from_folder(ort_folder)
    layout = decoder.kv_layout(64)
    slot = len(layout.past) * layout.kv_heads * layout.head_dim * 4
    log = Log()
    # room for one sequence of 3 + 20 tokens at a time, not two
    engine = BatchEngine(decoder, max_num_seqs=4, kv_cache_mib=30 * slot / 2**20, observer=log)
    try:
        got = together(engine, [GenerationRequest(PROMPTS[0], 20)] * 3)
        assert [g.ids for g in got] == [got[0].ids] * 3
        assert log.events == ["admitted", "finished"] * 3
        assert engine.stats()["kv_cache_usage"] == 0
    finally:
        engine.close()
    log = Log()
    engine = BatchEngine(decoder, max_num_seqs=4, observer=log)
    try:
        together(engine, [GenerationRequest(PROMPTS[0], 20)] * 3)
        assert log.events[:3] == ["admitted"] * 3  # without the budget, all run at once
    finally:
        engine.close()


def test_a_full_queue_is_refused_and_a_cancelled_stream_frees_its_row(ort_folder: Path) -> None:
    decoder = DecoderSession.from_folder(ort_folder)
    log = Log()
    engine = BatchEngine(decoder, max_num_seqs=1, max_queue=1, observer=log)

    async def main() -> Generation:
        first = engine.submit(GenerationRequest(PROMPTS[0], 40))
        items = aiter(first)
        assert isinstance(await anext(items), TokenEvent)  # admitted and running
        waiting = engine.submit(GenerationRequest(PROMPTS[2], 5))
        with pytest.raises(EngineBusyError, match="retry later") as busy:
            engine.submit(GenerationRequest(PROMPTS[2], 5))
        assert busy.value.retry_after > 0
        first.cancel()  # the client went away: its row goes to the one waiting
        result: Any = None
        async for item in waiting:
            result = item
        return result

    try:
        done = asyncio.run(main())
        assert isinstance(done, Generation) and done.prompt_tokens == 1
        assert log.reasons[0] == "cancelled"  # the metrics count it
        assert engine.stats() == {"running": 0.0, "waiting": 0.0, "kv_cache_usage": 0.0}
    finally:
        engine.close()


def test_a_drain_finishes_admitted_requests_or_aborts_them(ort_folder: Path) -> None:
    decoder = DecoderSession.from_folder(ort_folder)
    engine = BatchEngine(decoder, max_num_seqs=1)

    async def main() -> tuple[list[Generation], bool]:
        streams = [engine.submit(GenerationRequest(p, 30)) for p in PROMPTS[:3]]
        finished = await engine.drain(timeout=60)
        with pytest.raises(EngineClosedError):
            engine.submit(GenerationRequest(PROMPTS[0], 5))
        out = []
        for stream in streams:
            async for item in stream:
                if isinstance(item, Generation):
                    out.append(item)
        return out, finished

    try:
        got, finished = asyncio.run(main())
        assert finished and [g.finish_reason for g in got] != ["abort"] * 3
        assert all(g.finish_reason in ("stop", "length") for g in got)
    finally:
        engine.close()

    engine = BatchEngine(decoder, max_num_seqs=1)

    async def cut() -> list[str]:
        streams = [engine.submit(GenerationRequest(p, 60)) for p in PROMPTS[:2]]
        assert not await engine.drain(timeout=0)
        reasons = []
        for stream in streams:
            async for item in stream:
                if isinstance(item, Generation):
                    reasons.append(item.finish_reason)
        return reasons

    try:
        assert "abort" in asyncio.run(cut())
    finally:
        engine.close()


def test_a_lone_row_can_decode_beside_an_idle_one(ort_folder: Path) -> None:
    """Where one row alone rounds differently from rows in company, the engine finds it out and
    decodes at least two rows a step; the tokens are those of the batch either way."""
    decoder = DecoderSession.from_folder(ort_folder)
    engine = BatchEngine(decoder, max_num_seqs=4)
    try:
        assert engine.min_batch in (1, 2)
        want = together(engine, [GenerationRequest(p, 10) for p in PROMPTS])
        engine._pool.min_batch = 2  # type: ignore[attr-defined]
        alone = [asyncio.run(collect(engine, GenerationRequest(p, 10))) for p in PROMPTS]
        assert [g.ids for g in alone] == [g.ids for g in want]
    finally:
        engine.close()


def test_min_batch_is_found_by_comparing_one_row_with_two(ort_folder: Path) -> None:
    decoder = DecoderSession.from_folder(ort_folder)
    pool = decoder.session.kv_pool(decoder.kv_layout(64), 4)
    real_run = pool.run

    def one_row_rounds_differently(rows: Any, feeds: Any) -> Any:
        out = real_run(rows, feeds)
        if len(rows) == 1 and feeds["input_ids"].shape[1] == 1:
            out = out + 1e-6
        return out

    pool.run = one_row_rounds_differently  # type: ignore[method-assign]
    decoder.session.kv_pool = lambda layout, rows: pool  # type: ignore[method-assign]
    engine = BatchEngine(decoder, max_num_seqs=4)
    try:
        assert engine.min_batch == 2 and pool.min_batch == 2
    finally:
        engine.close()
