from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ferry.errors import InvalidInputError
from ferry.runtime import (
    GUESSED_SIZE,
    TensorSpec,
    guessed_dims,
    load_npy,
    parse_shape,
    random_feeds,
)


def spec(name: str, shape, dtype: str, onnx_type: str = "FLOAT") -> TensorSpec:
    return TensorSpec(name, shape, np.dtype(dtype) if dtype else None, onnx_type)


def test_parse_shape() -> None:
    assert parse_shape("1x3x224x224") == (1, 3, 224, 224)
    assert parse_shape("8,16") == (8, 16)
    assert parse_shape("") == ()
    with pytest.raises(InvalidInputError, match="bad shape"):
        parse_shape("1xAx3")
    with pytest.raises(InvalidInputError, match="negative"):
        parse_shape("-1x3")


def test_random_feeds_fit_specs_and_are_seeded() -> None:
    specs = [
        spec("image", ("batch", 3, 8, 8), "float32"),
        spec("ids", ("batch", "seq"), "int64", "INT64"),
        spec("mask", (4,), "bool", "BOOL"),
        spec("half", (2,), "float16", "FLOAT16"),
    ]
    feeds = random_feeds(specs, {"ids": (2, 5)}, seed=1)
    # 'batch' is one dim shared by both inputs: the given ids fix it for the generated image.
    assert feeds["image"].shape == (2, 3, 8, 8) and feeds["image"].dtype == np.float32
    assert feeds["ids"].shape == (2, 5) and feeds["ids"].dtype == np.int64
    assert feeds["ids"].min() >= 0 and feeds["ids"].max() < 10
    assert feeds["mask"].dtype == np.bool_ and feeds["half"].dtype == np.float16
    again = random_feeds(specs, {"ids": (2, 5)}, seed=1)
    assert all(np.array_equal(feeds[k], again[k]) for k in feeds)


def test_symbolic_dims_get_sizes_that_run() -> None:
    specs = [
        spec("image", ("batch", 3, "h", None), "float32"),  # None: an unnamed dynamic dim
        spec("mask", ("batch", 1, "h", None), "float32"),
    ]
    feeds = random_feeds(specs)
    # Not 1x1 pixels: the first dim is the batch (1), the others a size models run at.
    assert feeds["image"].shape == (1, 3, GUESSED_SIZE, GUESSED_SIZE)
    assert feeds["mask"].shape == (1, 1, GUESSED_SIZE, GUESSED_SIZE)
    assert guessed_dims(specs, None) == (
        f"image dims 0, 2, 3 (set to 1, {GUESSED_SIZE}, {GUESSED_SIZE}); "
        f"mask dims 0, 2, 3 (set to 1, {GUESSED_SIZE}, {GUESSED_SIZE})"
    )
    assert guessed_dims(specs, {"image": (1, 3, 64, 64), "mask": (1, 1, 64, 64)}) == ""
    assert guessed_dims([spec("x", (1, 4), "float32")], None) == ""


def test_random_feeds_errors() -> None:
    specs = [spec("x", (1, 4), "float32"), spec("y", None, "float32")]
    with pytest.raises(InvalidInputError, match="unknown rank.*--shape y="):
        random_feeds(specs)
    with pytest.raises(InvalidInputError, match="unknown input 'z'"):
        random_feeds(specs, {"z": (1,)})
    with pytest.raises(InvalidInputError, match="dim 1 is fixed at 4"):
        random_feeds(specs[:1], {"x": (1, 5)})
    with pytest.raises(InvalidInputError, match="has 3 dims"):
        random_feeds(specs[:1], {"x": (1, 4, 1)})


def test_load_npy(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(3))
    assert load_npy(tmp_path / "a.npy", "a").tolist() == [0, 1, 2]
    with pytest.raises(InvalidInputError, match="not found"):
        load_npy(tmp_path / "missing.npy", "a")
    (tmp_path / "bad.npy").write_text("not numpy")
    with pytest.raises(InvalidInputError, match="cannot read input 'a'"):
        load_npy(tmp_path / "bad.npy", "a")
    np.save(tmp_path / "obj.npy", np.array([{"x": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(InvalidInputError, match="cannot read"):
        load_npy(tmp_path / "obj.npy", "a")
    np.savez(tmp_path / "many.npz", a=np.ones(2))
    with pytest.raises(InvalidInputError, match="several arrays"):
        load_npy(tmp_path / "many.npz", "a")
