"""The generative artifact folder: written whole, read back, refused clearly when broken."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
import pytest
from test_tokenizer import KIT_GGUF, gguf_metadata

from ferry.errors import ModelLoadError
from ferry.generate._artifact import (
    DecoderFiles,
    decoder_files_from_gguf,
    generation_config_for,
    load_decoder_files,
    read_generative_manifest,
    tokenizer_config_for,
    write_decoder_artifact,
)
from ferry.generate._config import DecoderConfig
from ferry.generate._template import ChatTemplate
from ferry.generate._tokenizer import build_tokenizer, special_token

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _byte_alphabet() -> list[str]:
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    table.update({b: chr(256 + n) for n, b in enumerate(b for b in range(256) if b not in table)})
    return [table[b] for b in range(256)]


def tiny_metadata() -> dict[str, Any]:
    """A byte-level vocabulary: the three ChatML specials (ids 0-2, control), then the 256
    bytes; no merges, so every byte is a token."""
    tokens = SPECIALS + _byte_alphabet()
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3, 3, 3] + [1] * 256,
        "tokenizer.ggml.merges": [],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.padding_token_id": 2,
        "tokenizer.chat_template": CHATML,
    }


def tiny_config(vocab: int = 259) -> DecoderConfig:
    return DecoderConfig(
        architecture="llama",
        vocab_size=vocab,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        intermediate_size=48,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        context_length=64,
        bos_id=1,
        eos_ids=(2, 0),
        pad_id=2,
    )


class _Weight:
    def __init__(self, array: np.ndarray) -> None:
        self.array = array.astype(np.float32)
        self.shape = self.array.shape

    def float(self) -> np.ndarray:
        return self.array

    def blocks(self) -> None:
        return None


def tiny_model(config: DecoderConfig, flavour: str = "standard") -> ir.Model:
    """The decoder graph ferry builds, on random weights."""
    from ferry.generate._graph import build_decoder

    rng = np.random.default_rng(0)
    h, d, f = config.hidden_size, config.head_dim, config.intermediate_size
    q, kv = config.num_heads * d, config.num_kv_heads * d
    w: dict[str, _Weight] = {
        "embed": _Weight(rng.normal(0, 1, (config.vocab_size, h))),
        "final_norm": _Weight(np.ones(h)),
        "lm_head": _Weight(rng.normal(0, 0.2, (config.vocab_size, h))),
    }
    for i in range(config.num_layers):
        shapes = {"q": (q, h), "k": (kv, h), "v": (kv, h), "o": (h, q)}
        shapes |= {"gate": (f, h), "up": (f, h), "down": (h, f)}
        for name, shape in shapes.items():
            w[f"layers.{i}.{name}"] = _Weight(rng.normal(0, 0.2, shape))
        w[f"layers.{i}.attn_norm"] = _Weight(np.ones(h))
        w[f"layers.{i}.ffn_norm"] = _Weight(np.ones(h))
    return build_decoder(config, w, flavour=flavour)


def write_tiny(out: Path, **kwargs: Any) -> Path:
    metadata = tiny_metadata()
    config = tiny_config()
    template = ChatTemplate(CHATML, bos_token="<|im_start|>", eos_token="<|im_end|>")
    return write_decoder_artifact(
        out,
        model=kwargs.pop("model", None) or tiny_model(config),
        config=config,
        tokenizer=build_tokenizer(metadata),
        template=template,
        generation_config=generation_config_for(config),
        report={"requantized": {"layers.0.q": 0.01}},
        source="tiny.gguf",
        precision="fp32",
        **kwargs,
    )


def test_folder_holds_every_file(tmp_path: Path) -> None:
    out = write_tiny(tmp_path / "tiny")
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "ferry.json",
        "generation_config.json",
        "model.onnx",
        "model.onnx.data",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation == {
        "bos_token_id": 1,
        "eos_token_id": [2, 0],
        "pad_token_id": 2,
        "max_length": 64,
        "do_sample": False,
    }
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tokenizer_config["chat_template"] == CHATML
    assert tokenizer_config["bos_token"] == "<|im_start|>"
    assert tokenizer_config["eos_token"] == "<|im_end|>"
    assert tokenizer_config["pad_token"] == "<|im_end|>"
    assert tokenizer_config["add_bos_token"] is False
    manifest = read_generative_manifest(out)
    assert manifest is not None
    assert DecoderConfig.from_dict(manifest) == tiny_config()
    assert manifest["source"] == "tiny.gguf"
    assert manifest["precision"] == "fp32"
    assert manifest["requantized"] == {"layers.0.q": 0.01}


def test_files_read_back(tmp_path: Path) -> None:
    out = write_tiny(tmp_path / "tiny")
    files = load_decoder_files(out)
    assert isinstance(files, DecoderFiles)
    tokenizer, template, generation = files
    chat = [{"role": "user", "content": "héllo 12"}]
    assert template is not None
    assert template.render(chat) == ChatTemplate(
        CHATML, bos_token="<|im_start|>", eos_token="<|im_end|>"
    ).render(chat)
    text = template.render(chat)
    ids = tokenizer.encode(text).ids
    assert ids == build_tokenizer(tiny_metadata()).encode(text).ids
    assert ids[0] == 1
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    assert generation["eos_token_id"] == [2, 0]


def test_decoder_session_runs_the_folder(tmp_path: Path) -> None:
    from ferry.generate._loop import DecoderSession, is_generative_artifact

    out = write_tiny(tmp_path / "tiny")
    assert is_generative_artifact(out)
    session = DecoderSession.from_folder(out)
    result = session.generate(messages=[{"role": "user", "content": "hi"}], max_new_tokens=4)
    again = session.generate(messages=[{"role": "user", "content": "hi"}], max_new_tokens=4)
    assert result.ids == again.ids
    assert 1 <= len(result.ids) <= 4
    assert session.context_length == 64


def test_rewrite_replaces_and_failure_keeps_the_old_folder(tmp_path: Path) -> None:
    out = write_tiny(tmp_path / "tiny")
    (out / "stale.txt").write_text("from before")
    write_tiny(out)
    assert not (out / "stale.txt").exists()

    class Broken(RuntimeError):
        pass

    class BrokenTokenizer:
        def save(self, path: str) -> None:
            raise Broken("disk full")

    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(Broken):
        write_decoder_artifact(
            out,
            model=tiny_model(tiny_config()),
            config=tiny_config(),
            tokenizer=BrokenTokenizer(),
            template=None,
            generation_config={},
        )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]


def test_missing_and_corrupt_files_are_named(tmp_path: Path) -> None:
    out = write_tiny(tmp_path / "tiny")
    with pytest.raises(ModelLoadError, match="not an artifact folder"):
        load_decoder_files(tmp_path / "nowhere")
    for name, damage, message in [
        ("tokenizer.json", None, "has no tokenizer.json"),
        ("tokenizer.json", "{not json", "tokenizer.json is not a tokenizer"),
        ("generation_config.json", None, "has no generation_config.json"),
        ("generation_config.json", "[1, 2", "generation_config.json is not valid JSON"),
        ("tokenizer_config.json", "[]", "tokenizer_config.json is not a JSON object"),
        ("tokenizer_config.json", '{"chat_template": "{% if %}"}', "does not parse"),
        ("ferry.json", '{"generative": 3}', "'generative' is not an object"),
    ]:
        path = out / name
        kept = path.read_bytes()
        if damage is None:
            path.unlink()
        else:
            path.write_text(damage)
        with pytest.raises(ModelLoadError, match=message):
            load_decoder_files(out)
        path.write_bytes(kept)
    assert load_decoder_files(out).template is not None


def test_foreign_folder_needs_only_the_tokenizer(tmp_path: Path) -> None:
    """An optimum export: tokenizer.json, maybe tokenizer_config.json with a named template list
    and AddedToken dicts; no ferry.json, no generation_config.json."""
    build_tokenizer(tiny_metadata()).save(str(tmp_path / "tokenizer.json"))
    files = load_decoder_files(tmp_path)
    assert files.template is None
    assert files.generation_config == {}
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": [{"name": "default", "template": "{{ bos_token }}x"}],
                "bos_token": {"content": "<|im_start|>", "special": True},
            }
        )
    )
    template = load_decoder_files(tmp_path).template
    assert template is not None
    assert template.render([{"role": "user", "content": "y"}]) == "<|im_start|>x"
    # A template in chat_template.jinja (newer Hugging Face folders) when the config has none.
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "<|im_end|>"}')
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0].content }}{{ eos_token }}")
    template = load_decoder_files(tmp_path).template
    assert template is not None
    assert template.render([{"role": "user", "content": "y"}]) == "y<|im_end|>"


def test_kit_tokenizer_and_template_survive_the_folder(tmp_path: Path) -> None:
    if not KIT_GGUF.is_file():
        pytest.skip(f"the kit's SmolLM2 GGUF is not at {KIT_GGUF} (scripts/fetch-kit.sh)")
    metadata = gguf_metadata(KIT_GGUF)
    tokenizer = build_tokenizer(metadata)
    template = ChatTemplate(
        metadata["tokenizer.chat_template"],
        bos_token=special_token(metadata, "bos"),
        eos_token=special_token(metadata, "eos"),
    )
    config = tiny_config(vocab=len(metadata["tokenizer.ggml.tokens"]))
    generation = generation_config_for(config)
    assert tokenizer_config_for(tokenizer, template, generation)["add_bos_token"] is False
    bundled = decoder_files_from_gguf(metadata, config)
    assert bundled.template is not None
    assert bundled.template.special_tokens == {
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
    }  # what transformers' GGUF tokenizer gives its template
    assert bundled.generation_config == generation
    assert bundled.tokenizer.to_str() == tokenizer.to_str()
    out = write_decoder_artifact(
        tmp_path / "smollm",
        model=tiny_model(config),
        config=config,
        tokenizer=tokenizer,
        template=template,
        generation_config=generation,
    )
    files = load_decoder_files(out)
    assert files.template is not None
    chat = [{"role": "user", "content": "Sort 42, 7 and 19 — then say «done» 🚀"}]
    text = template.render(chat)
    assert files.template.render(chat) == text
    assert files.tokenizer.encode(text).ids == tokenizer.encode(text).ids
