"""The MTCNN state_dicts, through the PyTorch modules written from their layer names (``mtcnn``),
converted by ``ferry.convert`` and judged against PyTorch itself."""

from __future__ import annotations

import numpy as np
import torch

import ferry
import kit_models
import mtcnn


def test_mtcnn_converts_and_matches_pytorch() -> None:
    module = mtcnn.MTCNN(kit_models.path("mtcnn_torch"))
    result = ferry.convert(module, example_inputs=kit_models.feeds("mtcnn_torch"))
    assert result.parity.passed
    assert [v.name for v in result.model.graph.inputs] == ["pnet", "rnet", "onet"]
    session = ferry.load(result.model)
    for index in (0, 1):
        feeds = kit_models.feeds("mtcnn_torch", index)
        with torch.no_grad():
            want = [t.numpy() for t in module(*(torch.from_numpy(feeds[n]) for n in feeds))]
        got = session.run(feeds)
        assert [g.shape for g in got.values()] == [w.shape for w in want]
        kit_models.judged("mtcnn_torch", "convert", got, want)
    # The face crops really are faces to R-Net and O-Net: the conversion keeps that answer.
    assert np.argmax(got[list(got)[3]]) == 1 and np.argmax(got[list(got)[6]]) == 1
