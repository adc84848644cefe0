"""The GGUF reader: every storage type dequantized as the ``gguf`` package does, Q4_0/Q4_1/Q8_0 blocks
exactly as stored, the kit's SmolLM2, and one clear error for a broken file."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from ferry.errors import BackendUnavailableError, ModelLoadError
from ferry.formats import GGUFFile, QuantBlocks, read_gguf

gguf = pytest.importorskip("gguf")

from gguf_files import kit_gguf, random_k_blocks, write_gguf  # noqa: E402

# What gguf.quants.quantize can write from Python (the ternary and MXFP4 types only with newer gguf).
FAITHFUL = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]
QUANTIZABLE = FAITHFUL + [
    t for t in ("TQ1_0", "TQ2_0", "MXFP4") if t in gguf.GGMLQuantizationType.__members__
]
K_QUANTS = ["Q4_K", "Q5_K", "Q6_K"]
ROWS, COLS = 6, 512


def matrix(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((ROWS, COLS)).astype(np.float32)


@pytest.fixture(scope="module")
def every_type(tmp_path_factory: pytest.TempPathFactory) -> tuple[GGUFFile, dict[str, np.ndarray]]:
    """One file holding a tensor of each type, and the bytes each was written from."""
    tensors: dict[str, np.ndarray | tuple[np.ndarray, str]] = {}
    stored: dict[str, np.ndarray] = {}
    for i, name in enumerate(QUANTIZABLE):
        x = matrix(i)
        tensors[name] = (x, name)
        stored[name] = x
    for i, name in enumerate(K_QUANTS):
        raw = random_k_blocks(name, ROWS, COLS, seed=i)
        tensors[name] = (raw, name)
        stored[name] = raw
    tensors["vector"] = np.arange(7, dtype=np.float32)
    path = write_gguf(
        tmp_path_factory.mktemp("gguf") / "every.gguf", "llama", tensors, {"llama.block_count": 0}
    )
    return read_gguf(path), stored


@pytest.mark.parametrize("type_name", QUANTIZABLE + K_QUANTS)
def test_dequantize_matches_the_gguf_package(
    every_type: tuple[GGUFFile, dict[str, np.ndarray]], type_name: str
) -> None:
    gfile, stored = every_type
    tensor = gfile.tensors[type_name]
    assert tensor.ggml_type == type_name
    assert tensor.shape == (ROWS, COLS)
    qtype = gguf.GGMLQuantizationType[type_name]
    source = stored[type_name]
    packed = source if source.dtype == np.uint8 else gguf.quants.quantize(source, qtype)
    expected = gguf.quants.dequantize(packed, qtype).reshape(ROWS, COLS)
    ours = tensor.dequantize()
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours, expected)
    assert np.isfinite(ours).all()
    if type_name in FAITHFUL:  # and the quantization is faithful, so the layout is right
        assert np.abs(ours - source).max() < 0.3 * np.abs(source).max()


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
def test_blocks_reproduce_dequantize_exactly(
    every_type: tuple[GGUFFile, dict[str, np.ndarray]], type_name: str
) -> None:
    tensor = every_type[0].tensors[type_name]
    blocks = tensor.blocks()
    assert isinstance(blocks, QuantBlocks)
    assert blocks.values.shape == (ROWS, COLS) and blocks.values.dtype == np.uint8
    assert blocks.scales.shape == (ROWS, COLS // 32) and blocks.scales.dtype == np.float32
    np.testing.assert_array_equal(blocks.dequantize(), tensor.dequantize())
    if type_name == "Q4_1":
        assert blocks.bits == 4 and blocks.zero_points is None and blocks.mins is not None
        assert blocks.values.max() <= 15
    elif type_name == "Q4_0":
        assert blocks.bits == 4 and blocks.mins is None and np.all(blocks.zero_points == 8)
        assert blocks.values.max() <= 15
    else:
        assert blocks.bits == 8 and np.all(blocks.zero_points == 128)


def test_blocks_follow_ggml_nibble_order(
    every_type: tuple[GGUFFile, dict[str, np.ndarray]],
) -> None:
    # Q4_0 block: f16 d, then 16 bytes; byte j holds element j (low nibble) and j + 16 (high).
    tensor = every_type[0].tensors["Q4_0"]
    first_block = np.asarray(tensor.raw())[0, :18]
    packed = first_block[2:]
    codes = tensor.blocks().values[0, :32]  # type: ignore[union-attr]
    np.testing.assert_array_equal(codes[:16], packed & 0x0F)
    np.testing.assert_array_equal(codes[16:], packed >> 4)


def test_other_types_have_no_blocks(every_type: tuple[GGUFFile, dict[str, np.ndarray]]) -> None:
    for name in ("F32", "F16", "BF16", "Q5_0", "Q5_1", "Q4_K", "Q6_K", "vector"):
        assert every_type[0].tensors[name].blocks() is None
    np.testing.assert_array_equal(
        every_type[0].tensors["vector"].dequantize(), np.arange(7, dtype=np.float32)
    )


def test_metadata_are_plain_values(tmp_path: Path) -> None:
    path = write_gguf(
        tmp_path / "m.gguf",
        "qwen2",
        {"a": np.zeros(4, np.float32)},
        {
            "qwen2.block_count": 3,
            "qwen2.attention.layer_norm_rms_epsilon": 1e-6,
            "x.flag": True,
            "x.s": "hi",
        },
    )
    gfile = read_gguf(path)
    assert gfile.architecture == "qwen2"
    meta = gfile.metadata
    assert meta["qwen2.block_count"] == 3 and type(meta["qwen2.block_count"]) is int
    assert meta["qwen2.attention.layer_norm_rms_epsilon"] == 1e-6
    assert meta["x.flag"] is True and meta["x.s"] == "hi"
    assert not any(k.startswith("GGUF.") for k in meta)


def test_a_wrong_magic_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(ModelLoadError, match=r"model\.gguf: not a GGUF file") as info:
        read_gguf(bad)
    assert "\n" not in str(info.value)
    with pytest.raises(ModelLoadError, match="no such GGUF file"):
        read_gguf(tmp_path / "absent.gguf")


@pytest.mark.parametrize("keep", [24, 60, -40])
def test_a_truncated_file_is_one_clear_error(
    every_type: tuple[GGUFFile, dict[str, np.ndarray]], tmp_path: Path, keep: int
) -> None:
    data = every_type[0].path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:keep])
    with pytest.raises(ModelLoadError, match=r"cut\.gguf: truncated or corrupt GGUF file") as info:
        read_gguf(cut)
    assert "\n" not in str(info.value)


def test_an_unknown_tensor_type_is_one_clear_error(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", "llama", {"weird": np.zeros((2, 32), np.float32)})
    data = bytearray(path.read_bytes())
    # tensor info: u64 name length, name, u32 n_dims, n_dims x u64 ne, u32 type, u64 offset
    at = data.index(b"weird") + len(b"weird") + 4 + 2 * 8
    assert data[at : at + 4] == bytes(4)  # F32
    data[at : at + 4] = (250).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=r"m\.gguf: unknown GGUF tensor type 250;"):
        read_gguf(path)


def test_without_the_gguf_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", "llama", {"a": np.zeros(4, np.float32)})
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(BackendUnavailableError, match=r"pip install 'ferry\[generate\]'"):
        read_gguf(path)


def test_kit_smollm2() -> None:
    gfile = read_gguf(kit_gguf())
    assert gfile.architecture == "llama"
    assert len(gfile.tensors) == 272
    assert gfile.metadata["tokenizer.ggml.model"] == "gpt2"
    assert len(gfile.metadata["tokenizer.ggml.tokens"]) == 49152
    assert isinstance(gfile.metadata["tokenizer.ggml.merges"][0], str)
    embed = gfile.tensors["token_embd.weight"]
    assert (embed.ggml_type, embed.shape) == ("Q8_0", (49152, 576))
    q = gfile.tensors["blk.0.attn_q.weight"]
    assert (q.ggml_type, q.shape) == ("Q4_1", (576, 576))
    assert gfile.tensors["blk.0.ffn_down.weight"].shape == (576, 1536)
    for name in ("blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.29.attn_k.weight"):
        tensor = gfile.tensors[name]
        np.testing.assert_array_equal(tensor.blocks().dequantize(), tensor.dequantize())  # type: ignore[union-attr]
        raw = tensor.raw()
        assert isinstance(raw.base, np.memmap) or isinstance(raw, np.memmap)  # mapped, not read


def test_kit_truncated_copy_is_one_clear_error(tmp_path: Path) -> None:
    source = kit_gguf()
    cut = tmp_path / "smollm2-cut.gguf"
    with source.open("rb") as f, cut.open("wb") as out:
        out.write(f.read(8 << 20))  # past the 2 MB vocabulary, into the tensors
    with pytest.raises(ModelLoadError, match="smollm2-cut.gguf: truncated or corrupt GGUF file"):
        read_gguf(cut)
    shutil.rmtree(tmp_path, ignore_errors=True)
