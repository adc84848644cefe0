"""Converting a live paddle.nn.Layer, checked in a process of its own (see test_layer_in_memory)."""

from __future__ import annotations

from typing import Any

import numpy as np

import ferry
from ferry.converters import PaddleConverter

ATOL, RTOL = 1e-5, 1e-4


def main() -> None:
    import paddle

    class TwoHeads(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.conv = paddle.nn.Conv2D(3, 4, 3)
            self.bn = paddle.nn.BatchNorm2D(4)
            self.fc = paddle.nn.Linear(4, 5)

        def forward(self, image: Any, bias: Any) -> Any:
            x = paddle.nn.functional.relu(self.bn(self.conv(image)))
            x = paddle.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
            logits = self.fc(x) + bias
            return logits, paddle.nn.functional.softmax(logits, -1)

    paddle.seed(0)
    layer = TwoHeads()  # left in training mode: the converter must use eval mode and restore it
    rng = np.random.default_rng(0)
    layer.bn._mean.set_value(rng.normal(0, 0.5, 4).astype("float32"))
    image = rng.standard_normal((2, 3, 8, 8)).astype("float32")
    bias = rng.standard_normal((2, 5)).astype("float32")

    assert PaddleConverter().accepts(layer)
    result = ferry.convert(layer, example_inputs=(image, bias))
    assert result.parity.passed
    assert layer.training
    assert [v.name for v in result.model.graph.inputs] == ["image", "bias"]
    got = list(ferry.load(result.model).run({"image": image, "bias": bias}).values())
    layer.eval()
    want = [t.numpy() for t in layer(paddle.to_tensor(image), paddle.to_tensor(bias))]
    assert len(got) == 2
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=ATOL, rtol=RTOL)
    print("layer ok")


if __name__ == "__main__":
    main()
