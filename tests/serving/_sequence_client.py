"""Streams through sequence batching and by hand, for the sequence tests (serving, e2e, real)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ferry._state_names import STATE_INPUT_PREFIX, STATE_OUTPUT_PREFIX

Feeds = dict[str, np.ndarray]


def stream_over_http(
    url: str, model: str, sequence_id: int | str, stream: Sequence[Feeds], end: bool = True
) -> list[Feeds]:
    """One sequence sent with ``tritonclient.http`` (start on the first chunk, end on the last
    unless ``end`` is false): each response's outputs."""
    import tritonclient.http as httpclient
    from tritonclient.utils import np_to_triton_dtype

    client = httpclient.InferenceServerClient(url.removeprefix("http://"))
    try:
        out = []
        for i, feeds in enumerate(stream):
            inputs = []
            for name, array in feeds.items():
                tensor = httpclient.InferInput(
                    name, list(array.shape), np_to_triton_dtype(array.dtype)
                )
                tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            result = client.infer(
                model,
                inputs,
                sequence_id=sequence_id,
                sequence_start=i == 0,
                sequence_end=end and i == len(stream) - 1,
            )
            names = [o["name"] for o in result.get_response()["outputs"]]
            out.append({n: result.as_numpy(n) for n in names})
        return out
    finally:
        client.close()


def interleaved(
    url: str, model: str, ids: Sequence[int | str], streams: Sequence[Sequence[Feeds]]
) -> list[list[Feeds]]:
    """Every stream at once, one thread per sequence."""
    with concurrent.futures.ThreadPoolExecutor(len(streams)) as pool:
        return list(
            pool.map(
                lambda i: stream_over_http(url, model, ids[i], streams[i]), range(len(streams))
            )
        )


def by_hand(
    run: Callable[[Feeds], Feeds],
    stream: Sequence[Feeds],
    state: Feeds | None = None,
    pairs: Mapping[str, str] | None = None,
) -> list[Feeds]:
    """``run`` on each chunk with the state outputs of the call before fed back as the state
    inputs (``pairs``: state output -> state input; None: ``state_out:<v>`` -> ``state:<v>``);
    ``state``: the first call's (None: the model's defaults). Returns the other outputs."""
    if pairs is None:

        def feeds_of(name: str) -> str | None:
            if name.startswith(STATE_OUTPUT_PREFIX):
                return STATE_INPUT_PREFIX + name[len(STATE_OUTPUT_PREFIX) :]
            return None
    else:
        feeds_of = pairs.get
    state = dict(state or {})
    out = []
    for feeds in stream:
        got = run({**feeds, **state})
        state = {feeds_of(k): v for k, v in got.items() if feeds_of(k) is not None}  # type: ignore[misc]
        out.append({k: v for k, v in got.items() if feeds_of(k) is None})
    return out


def ort_runner(path: Any) -> Callable[[Feeds], Feeds]:
    """ONNX Runtime on a model file (or its bytes): feeds -> every output by name."""
    import onnxruntime as ort

    model = path if isinstance(path, bytes) else str(path)
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: dict(zip(names, session.run(names, feeds)))


def max_difference(got: Sequence[Sequence[Feeds]], want: Sequence[Sequence[Feeds]]) -> float:
    """The largest absolute difference between two sets of streams' outputs (same names, shapes)."""
    worst = 0.0
    for g_stream, w_stream in zip(got, want, strict=True):
        for g, w in zip(g_stream, w_stream, strict=True):
            assert g.keys() == w.keys(), (sorted(g), sorted(w))
            for name in g:
                assert g[name].shape == w[name].shape, name
                diff = np.abs(g[name].astype(np.float64) - w[name].astype(np.float64))
                worst = max(worst, float(diff.max(initial=0.0)))
    return worst
