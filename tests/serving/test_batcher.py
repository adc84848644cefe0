"""The dynamic batcher: batches form under concurrency, results split back exactly, failures stay local."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

import ferry
from ferry.errors import ExecutionError
from ferry.serving import DynamicBatcher, ExecutionRecord, Instance, InstancePool, run_items

sys.path.insert(0, str(Path(__file__).parents[1]))
import models


class Recorder:
    """A session stand-in: y = 2x + 1, records each batch's rows, fails on NaN, can be slow."""

    def __init__(self, delay: float = 0.0) -> None:
        self.batches: list[int] = []
        self.shapes: list[tuple[int, ...]] = []
        self.delay = delay
        self.lock = threading.Lock()

    def run(
        self, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        x = inputs["x"]
        with self.lock:
            self.batches.append(x.shape[0])
            self.shapes.append(x.shape)
        if self.delay:
            time.sleep(self.delay)
        if np.isnan(x).any():
            raise ExecutionError("NaN in the input")
        return {"y": 2 * x + 1, "z": x.sum(axis=tuple(range(1, x.ndim)))}


def pool_of(*sessions: Any) -> InstancePool:
    return InstancePool([Instance(s, ThreadPoolExecutor(1)) for s in sessions])


def test_batches_form_and_split_like_single_runs(tmp_path: Path) -> None:
    path = tmp_path / "mlp.onnx"
    path.write_bytes(models.mlp().SerializeToString())
    session = ferry.load(path, threads=1)
    reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    requests = [
        rng.standard_normal((int(rng.integers(1, 4)), 16)).astype(np.float32) for _ in range(40)
    ]
    records: list[ExecutionRecord] = []

    async def main() -> list[Any]:
        pool = pool_of(session)
        batcher = DynamicBatcher(
            pool, max_batch_size=8, max_queue_delay_us=2000, on_execution=records.append
        )
        batcher.start()
        try:
            return await asyncio.gather(
                *(batcher.submit({"x": x}, None, x.shape[0]) for x in requests)
            )
        finally:
            await batcher.close()
            pool.shutdown()

    outcomes = asyncio.run(main())
    for x, outcome in zip(requests, outcomes):
        (want,) = reference.run(None, {"x": x})
        assert outcome.outputs["y"].shape == want.shape
        np.testing.assert_allclose(outcome.outputs["y"], want, rtol=1e-6, atol=1e-7)
    sizes = [r.batch_size for r in records]
    assert sum(sizes) == sum(x.shape[0] for x in requests)
    assert max(sizes) <= 8
    assert len(records) < len(requests), "40 concurrent requests should share executions"


def test_preferred_size_is_sent_at_once() -> None:
    session = Recorder()

    async def main() -> None:
        pool = pool_of(session)
        # A long delay: only a preferred size (or a full batch) may leave before it.
        batcher = DynamicBatcher(
            pool, max_batch_size=8, max_queue_delay_us=5_000_000, preferred_batch_sizes=[4]
        )
        start = time.perf_counter()
        tasks = [
            asyncio.ensure_future(batcher.submit({"x": np.full((1, 2), i, np.float32)}, None, 1))
            for i in range(6)
        ]
        await asyncio.sleep(0)
        batcher.start()
        first = await asyncio.wait_for(asyncio.gather(*tasks[:4]), 2)
        assert time.perf_counter() - start < 2
        assert [o.batch_size for o in first] == [4] * 4
        for i, outcome in enumerate(first):
            assert outcome.outputs["y"].tolist() == [[2 * i + 1] * 2]
        await batcher.close()  # the last two leave when the batcher closes
        assert [t.result().batch_size for t in tasks[4:]] == [2, 2]
        pool.shutdown()

    asyncio.run(main())
    assert session.batches == [4, 2]


def test_full_batch_does_not_wait_for_the_delay() -> None:
    session = Recorder()

    async def main() -> float:
        pool = pool_of(session)
        batcher = DynamicBatcher(pool, max_batch_size=4, max_queue_delay_us=5_000_000)
        batcher.start()
        start = time.perf_counter()
        await asyncio.gather(
            *(batcher.submit({"x": np.ones((2, 3), np.float32)}, None, 2) for _ in range(2))
        )
        elapsed = time.perf_counter() - start
        await batcher.close()
        pool.shutdown()
        return elapsed

    assert asyncio.run(main()) < 2
    assert session.batches == [4]


def test_only_equal_shapes_batch_together() -> None:
    session = Recorder(delay=0.05)  # busy instance: the rest queue up meanwhile

    async def main() -> list[Any]:
        pool = pool_of(session)
        batcher = DynamicBatcher(pool, max_batch_size=8, max_queue_delay_us=0)
        batcher.start()
        shapes = [(1, 3), (1, 5), (2, 3), (1, 5), (1, 3), (3, 5)]
        requests = [np.full(s, i, np.float32) for i, s in enumerate(shapes)]
        results = await asyncio.gather(
            *(batcher.submit({"x": x}, None, x.shape[0]) for x in requests)
        )
        await batcher.close()
        pool.shutdown()
        return list(zip(requests, results))

    for x, outcome in asyncio.run(main()):
        np.testing.assert_array_equal(outcome.outputs["y"], 2 * x + 1)
        np.testing.assert_array_equal(outcome.outputs["z"], x.sum(axis=1))
    assert len({s[1:] for s in session.shapes}) == 2
    assert sorted(session.batches) != [1] * 6, "queued requests of equal shape should join"


def test_a_failing_request_fails_alone() -> None:
    session = Recorder(delay=0.02)

    async def main() -> list[Any]:
        pool = pool_of(session)
        batcher = DynamicBatcher(pool, max_batch_size=8, max_queue_delay_us=20_000)
        batcher.start()
        requests = [np.full((1, 2), i, np.float32) for i in range(5)]
        requests[2][0, 0] = np.nan
        results = await asyncio.gather(
            *(batcher.submit({"x": x}, None, 1) for x in requests), return_exceptions=True
        )
        await batcher.close()
        pool.shutdown()
        return results

    results = asyncio.run(main())
    assert isinstance(results[2], ExecutionError)
    for i in (0, 1, 3, 4):
        assert results[i].outputs["y"].tolist() == [[2 * i + 1] * 2]
    assert max(session.batches) > 1  # it was batched, then rerun one by one


def test_requested_outputs_are_picked_per_request() -> None:
    session = Recorder(delay=0.02)

    async def main() -> list[Any]:
        pool = pool_of(session)
        batcher = DynamicBatcher(pool, max_batch_size=8, max_queue_delay_us=20_000)
        batcher.start()
        x = np.ones((1, 2), np.float32)
        results = await asyncio.gather(
            batcher.submit({"x": x}, ["y"], 1),
            batcher.submit({"x": x}, ["z"], 1),
            batcher.submit({"x": x}, None, 1),
        )
        await batcher.close()
        pool.shutdown()
        return results

    y_only, z_only, both = asyncio.run(main())
    assert set(y_only.outputs) == {"y"}
    assert set(z_only.outputs) == {"z"}
    assert set(both.outputs) == {"y", "z"}


def test_two_instances_run_batches_in_parallel() -> None:
    sessions = [Recorder(delay=0.2), Recorder(delay=0.2)]

    async def main() -> float:
        pool = pool_of(*sessions)
        batcher = DynamicBatcher(pool, max_batch_size=2, max_queue_delay_us=0)
        batcher.start()
        start = time.perf_counter()
        await asyncio.gather(
            *(batcher.submit({"x": np.ones((1, 2), np.float32)}, None, 1) for _ in range(4))
        )
        elapsed = time.perf_counter() - start
        await batcher.close()
        pool.shutdown()
        return elapsed

    elapsed = asyncio.run(main())
    assert all(s.batches for s in sessions), "both instances should have run"
    assert elapsed < 0.7  # two rounds in parallel (~0.4 s), not four in a row (0.8 s)


def test_output_without_batch_dim_is_an_error() -> None:
    class Scalar:
        def run(self, inputs: Mapping[str, Any], outputs: Any = None) -> dict[str, np.ndarray]:
            return {"s": np.float32(inputs["x"].sum()).reshape(())}

    execution = run_items(
        Scalar(), [{"x": np.ones((1, 2))}, {"x": np.ones((1, 2))}], [1, 1], None, [None, None]
    )
    assert all(isinstance(r, ExecutionError) for r in execution.results)
    assert "cannot be split" in str(execution.results[0])


def test_submit_checks_the_batch_size() -> None:
    async def main() -> None:
        batcher = DynamicBatcher(pool_of(Recorder()), max_batch_size=2)
        with pytest.raises(ValueError, match="takes 1 to 2"):
            await batcher.submit({"x": np.ones((3, 1))}, None, 3)

    asyncio.run(main())


def test_cancelled_requests_are_dropped_and_close_does_not_wait_for_them() -> None:
    """What a drain timeout cuts off: queued requests whose callers went away never run, and
    close() does not wait for a running batch nobody waits for (an engine run cannot stop)."""
    release = threading.Event()
    runs: list[int] = []

    class Blocked:
        def run(
            self, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None
        ) -> dict[str, np.ndarray]:
            runs.append(inputs["x"].shape[0])
            release.wait(10)
            return {"y": inputs["x"]}

    async def main() -> float:
        pool = pool_of(Blocked())
        batcher = DynamicBatcher(pool, max_batch_size=1)
        batcher.start()
        x = np.zeros((1, 2), np.float32)
        tasks = [asyncio.ensure_future(batcher.submit({"x": x}, None, 1)) for _ in range(3)]
        await asyncio.sleep(0.1)  # the first runs (blocked), two wait in the queue
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        start = time.perf_counter()
        await batcher.close()
        elapsed = time.perf_counter() - start
        release.set()
        pool.shutdown()
        return elapsed

    try:
        elapsed = asyncio.run(main())
    finally:
        release.set()
    assert elapsed < 1.0
    assert runs == [1]


def test_queued_rows_are_shared_with_idle_instances() -> None:
    """With two instances free, 8 queued rows run as 4 + 4, not 8 on one and none on the other."""
    import asyncio

    from ferry.serving._batcher import DynamicBatcher

    seen: list[int] = []

    class Session:
        def run(self, inputs: dict, outputs=None):  # type: ignore[no-untyped-def]
            seen.append(len(inputs["x"]))
            return {"y": inputs["x"] * 2}

    async def main() -> None:
        from concurrent.futures import ThreadPoolExecutor

        from ferry.serving._scheduler import Instance, InstancePool

        pool = InstancePool([Instance(Session(), ThreadPoolExecutor(1)) for _ in range(2)])
        batcher = DynamicBatcher(pool, max_batch_size=16, max_queue_delay_us=20_000)
        batcher.start()
        rows = [np.full((1, 3), i, np.float32) for i in range(8)]
        results = await asyncio.gather(*(batcher.submit({"x": r}, None, 1) for r in rows))
        for row, outcome in zip(rows, results, strict=True):
            np.testing.assert_array_equal(outcome.outputs["y"], row * 2)
        await batcher.close()
        pool.shutdown()

    asyncio.run(main())
    assert sorted(seen) == [4, 4]


def test_a_batcher_whose_loop_dies_fails_its_requests_instead_of_hanging() -> None:
    import asyncio

    from ferry.serving._batcher import DynamicBatcher

    class BrokenPool:
        async def acquire(self) -> object:
            raise KeyError("a bug in the pool")

        def release(self, instance: object) -> None:
            pass

    async def main() -> None:
        batcher = DynamicBatcher(BrokenPool(), max_batch_size=4)
        batcher.start()
        with pytest.raises(RuntimeError, match="the batcher stopped: KeyError"):
            await asyncio.wait_for(batcher.submit({"x": np.ones((1, 2))}, None, 1), 5)
        with pytest.raises(RuntimeError, match="closed"):
            await batcher.submit({"x": np.ones((1, 2))}, None, 1)

    asyncio.run(main())
