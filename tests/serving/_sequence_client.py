"""Streams through sequence batching and by hand, for the sequence tests (serving, e2e, real)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
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
    run: Callable[[Feeds], Feeds], stream: Sequence[Feeds], state: Feeds | None = None
) -> list[Feeds]:
    """``run`` on each chunk with the ``state_out:*`` outputs of the call before fed back as
    ``state:*`` (``state``: the first call's, None: the model's defaults); the other outputs."""
    state = dict(state or {})
    out = []
    for feeds in stream:
        got = run({**feeds, **state})
        state = {
            STATE_INPUT_PREFIX + k[len(STATE_OUTPUT_PREFIX) :]: v
            for k, v in got.items()
            if k.startswith(STATE_OUTPUT_PREFIX)
        }
        out.append({k: v for k, v in got.items() if not k.startswith(STATE_OUTPUT_PREFIX)})
    return out


def ort_runner(path: Any) -> Callable[[Feeds], Feeds]:
    """ONNX Runtime on a model file: feeds -> every output by name."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
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
