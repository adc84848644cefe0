"""The safetensors reader: our own header parser against files the safetensors package writes."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from ferry.errors import ModelLoadError
from ferry.formats import read_safetensors

st = pytest.importorskip("safetensors.numpy")


def bf16_bytes(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (truncation: exact for values with 8 significant bits)."""
    return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def write_raw(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> Path:
    """A safetensors file written by hand (for BF16, which numpy cannot name)."""
    header: dict[str, object] = {"__metadata__": {"format": "np"}}
    blobs, offset = [], 0
    for name, (dtype, data) in tensors.items():
        raw = np.ascontiguousarray(data).tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(data.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return path


def test_f32_f16_single_file(tmp_path: Path) -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.linspace(-1, 1, 5).astype(np.float16)
    st.save_file({"a": a, "b": b}, str(tmp_path / "model.safetensors"))
    tensors = read_safetensors(tmp_path)
    assert set(tensors) == {"a", "b"}
    assert tensors["a"].shape == (3, 4) and tensors["a"].dtype == "F32"
    assert tensors["b"].dtype == "F16"
    np.testing.assert_array_equal(tensors["a"].numpy(), a)
    np.testing.assert_array_equal(tensors["b"].numpy(), b.astype(np.float32))
    assert tensors["b"].numpy().dtype == np.float32
    # a file path works as well as its folder
    assert set(read_safetensors(tmp_path / "model.safetensors")) == {"a", "b"}


def test_bf16_widens_exactly(tmp_path: Path) -> None:
    x = np.array([[1.0, -2.5, 0.15625, 3.0e38], [0.0, -0.0, 1e-30, 65504.0]], dtype=np.float32)
    patterns = bf16_bytes(x)
    write_raw(tmp_path / "model.safetensors", {"w": ("BF16", patterns)})
    got = read_safetensors(tmp_path)["w"].numpy()
    np.testing.assert_array_equal(got.view(np.uint32), patterns.astype(np.uint32) << 16)
    np.testing.assert_array_equal(got[0, :3], x[0, :3])


def test_sharded_by_index(tmp_path: Path) -> None:
    st.save_file(
        {"x": np.ones((2, 2), np.float32)}, str(tmp_path / "model-00001-of-00002.safetensors")
    )
    st.save_file(
        {"y": np.full(3, 2.0, np.float32)}, str(tmp_path / "model-00002-of-00002.safetensors")
    )
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "weight_map": {
                    "x": "model-00001-of-00002.safetensors",
                    "y": "model-00002-of-00002.safetensors",
                }
            }
        )
    )
    tensors = read_safetensors(tmp_path)
    assert list(tensors) == ["x", "y"]
    np.testing.assert_array_equal(tensors["y"].numpy(), np.full(3, 2.0, np.float32))
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="missing: model-00002-of-00002.safetensors"):
        read_safetensors(tmp_path)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (struct.pack("<Q", 10**12) + b"{}", "claims"),
        (struct.pack("<Q", 5) + b"{nope", "not JSON"),
        (b"\x01\x02", "not a safetensors file"),
    ],
)
def test_a_bad_header_is_one_clear_error(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError, match=problem) as info:
        read_safetensors(tmp_path)
    assert "model.safetensors" in str(info.value) and "\n" not in str(info.value)


def test_a_truncated_file_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    st.save_file({"w": np.ones((64, 64), np.float32)}, str(path))
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ModelLoadError, match="truncated"):
        read_safetensors(path)


def test_nothing_to_read(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors files"):
        read_safetensors(tmp_path)
    with pytest.raises(ModelLoadError, match="no such"):
        read_safetensors(tmp_path / "nowhere")
