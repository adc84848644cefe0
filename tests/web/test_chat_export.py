"""``ferry export --target web`` on a generative artifact: the chat bundle (``ferry.web._chat``).

Fast: tiny random llama decoders (tests/generate/test_artifact's ``write_tiny``: float32 in both
graph flavours, and int4 round-to-nearest MatMulNBits with zero points) exported and verified in
Node (the page's greedy tokens must equal Python's), the bundle's layout and manifest, the
MatMulNBits rewrite, clear refusals, the CLI route.

In headless Chromium (marked slow like the other browser tests): the tiny decoder's page against
``DecoderSession``, and the kit's SmolLM2 (also ``real``): built by ``ferry convert`` (int4, the
default ``ort`` flavour, its MatMulNBits rewritten by the export: see ``ferry.web._chat``),
chatted with through the chat box, a screenshot taken mid-answer (and one, when
``FERRY_SCREENSHOT_DIR`` is set, there too), the answer stopped from the page, then the page's
greedy tokens for two chat prompts (16 new tokens at most) compared with Python's
``DecoderSession.generate(messages=..., max_new_tokens=16)``:

* identical to DecoderSession on the float32 build of the same GGUF (the same dequantized weights
  in float32 arithmetic, which is what onnxruntime-web computes), asserted;
* against DecoderSession on the int4 artifact itself, native ONNX Runtime runs the quantized
  matmuls with int8 activations (the output head's accuracy level 4), so the two may part at
  a close call: how many leading tokens agree is measured, printed and saved (``chat-kit.json``
  beside the screenshots), not asserted. Measured: 16/16 on "Why is the sky blue?", 0/16 on
  "What is the capital of France?" (logits 25.36 vs 25.31 natively for "L" and "The"; 25.24 vs
  25.33 in float32, in Python and in the page alike).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import onnx
import pytest
from click.testing import CliRunner

from ferry.cli.main import cli
from ferry.errors import InvalidInputError
from ferry.web import BUNDLE_FORMAT, export_chat, is_bundle

sys.path.insert(0, str(Path(__file__).parents[1] / "generate"))
from test_artifact import tiny_config, tiny_model, write_tiny

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
#: The kit test's greedy prompts: 16 new tokens without an end of turn, and a short answer.
KIT_PROMPTS = ("Why is the sky blue?", "What is the capital of France?")


@pytest.fixture(scope="module")
def tiny_bundles(npm: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    """``{flavour: (artifact, ChatExport)}`` for a tiny float32 decoder of each flavour."""
    if shutil.which("node") is None:
        pytest.skip("node not found: run scripts/browser-env.sh")
    import functools

    import ferry.generate._graph as graph

    root = tmp_path_factory.mktemp("chat-tiny")
    made = {}
    for flavour in ("standard", "ort"):
        artifact = write_tiny(root / f"tiny-{flavour}", model=tiny_model(tiny_config(), flavour))
        made[flavour] = (artifact, export_chat(artifact, root / f"site-{flavour}"))
    # int4, round-to-nearest: MatMulNBits with zero points, which the export rewrites.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(graph, "build_decoder", functools.partial(graph.build_decoder, precision="int4"))
        model = tiny_model(tiny_config(), "ort")
    artifact = write_tiny(root / "tiny-int4", model=model)
    made["int4-ort"] = (artifact, export_chat(artifact, root / "site-int4"))
    return made


@pytest.mark.parametrize("flavour", ["standard", "ort", "int4-ort"])
def test_tiny_decoder_chats_in_node_as_in_python(
    tiny_bundles: dict[str, tuple[Path, Any]], flavour: str
) -> None:
    from ferry.generate import DecoderSession

    artifact, result = tiny_bundles[flavour]
    v = result.verification
    assert v is not None and v["prompt_ids_identical"]
    # float32 arithmetic on both sides (int4 at accuracy level 0 dequantizes natively too):
    # the same greedy tokens.
    assert v["identical"] and v["page_ids"] == v["python_ids"]
    # The text too, streamed token by token as Python streams it (the tiny vocabulary is
    # bytes: random ids make partial and invalid UTF-8, held back and replaced alike).
    assert v["page_text"] == v["python_text"]
    assert v["page_streamed"] == v["python_streamed"]
    want = DecoderSession.from_folder(artifact, backends="onnxruntime").generate(
        messages=MESSAGES, max_new_tokens=8
    )
    assert v["python_ids"] == want.ids
    assert any("identical to DecoderSession" in line for line in result.lines())


def test_the_bundle_holds_everything_the_page_needs(
    tiny_bundles: dict[str, tuple[Path, Any]],
) -> None:
    artifact, result = tiny_bundles["ort"]
    out = result.out_dir
    assert is_bundle(out)
    for name in (
        "index.html",
        "chat.js",
        "model.onnx",
        "model.onnx.data",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "lib/tokenizers.mjs",
        "lib/jinja.mjs",
        "ort/ort.min.mjs",
        "ort/ort-wasm-simd-threaded.jsep.wasm",
        "manifest.json",
    ):
        assert (out / name).is_file(), name
    m = json.loads((out / "manifest.json").read_text())
    assert m["format"] == BUNDLE_FORMAT and m["kind"] == "chat"
    d = m["decoder"]
    assert d["num_layers"] == 2 and d["num_kv_heads"] == 2 and d["head_dim"] == 8
    assert d["eos_ids"] == [2, 0] and d["context_length"] == 64
    assert d["external_data"] == ["model.onnx.data"] and d["chat_template"]
    assert set(m["files"]) == set(result.files) - {"manifest.json"}
    # Nothing in the page reaches outside the folder: no URL but relative ones.
    for name in ("index.html", "chat.js"):
        text = (out / name).read_text()
        assert "https://" not in text and "cdn" not in text.lower(), name
    # logits_to_keep: an overridable initializer in the artifact, a plain input in the bundle
    # (onnxruntime-web refuses to be fed an initializer).
    src = onnx.load(str(artifact / "model.onnx"), load_external_data=False)
    dst = onnx.load(str(out / "model.onnx"), load_external_data=False)
    assert "logits_to_keep" in {t.name for t in src.graph.initializer}
    assert "logits_to_keep" not in {t.name for t in dst.graph.initializer}
    assert "logits_to_keep" in {i.name for i in dst.graph.input}
    # The artifact is untouched.
    assert (artifact / "model.onnx").read_bytes() == src.SerializeToString()


def test_sampling_in_the_page_is_seeded(tiny_bundles: dict[str, tuple[Path, Any]]) -> None:
    from ferry.web import run_chat_in_node

    _, result = tiny_bundles["standard"]
    sampled = {"temperature": 1.5, "topP": 0.9, "topK": 50, "seed": 7}
    first = run_chat_in_node(result.out_dir, MESSAGES, 12, options=sampled)
    again = run_chat_in_node(result.out_dir, MESSAGES, 12, options=sampled)
    other = run_chat_in_node(result.out_dir, MESSAGES, 12, options={**sampled, "seed": 8})
    assert first["ids"] == again["ids"]
    assert other["ids"] != first["ids"]
    assert all(0 <= i < 259 for i in first["ids"] + other["ids"])


def test_matmul_nbits_become_dequantize_linear_over_the_same_bytes(
    tiny_bundles: dict[str, tuple[Path, Any]],
) -> None:
    artifact, result = tiny_bundles["int4-ort"]
    src = onnx.load(str(artifact / "model.onnx"), load_external_data=False)
    dst = onnx.load(str(result.out_dir / "model.onnx"), load_external_data=False)
    before = [n.op_type for n in src.graph.node]
    after = [n.op_type for n in dst.graph.node]
    assert before.count("MatMulNBits") > 0 and "MatMulNBits" not in after
    assert after.count("DequantizeLinear") == before.count("MatMulNBits")
    d = result.manifest["decoder"]
    assert d["matmul_nbits_dequantized"] == before.count("MatMulNBits")
    assert d["matmul_nbits_kept"] == 0 and not result.warnings
    # The weights file is copied as it is: the new initializers point into it.
    assert (result.out_dir / "model.onnx.data").read_bytes() == (
        artifact / "model.onnx.data"
    ).read_bytes()


def test_refusals_are_clear(tmp_path: Path, tiny_bundles: dict[str, tuple[Path, Any]]) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(InvalidInputError, match="not a generative artifact"):
        export_chat(plain, tmp_path / "site")
    artifact, _ = tiny_bundles["standard"]
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("x")
    with pytest.raises(InvalidInputError, match="--force"):
        export_chat(artifact, busy)
    with pytest.raises(InvalidInputError, match="verify_tokens"):
        export_chat(artifact, tmp_path / "site", verify_tokens=0)
    no_template = tmp_path / "no-template"
    shutil.copytree(artifact, no_template)
    config = json.loads((no_template / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (no_template / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidInputError, match="no chat template"):
        export_chat(no_template, tmp_path / "site")
    assert not (tmp_path / "site").exists()


def test_cli_routes_a_decoder_to_the_chat_page(
    tmp_path: Path, tiny_bundles: dict[str, tuple[Path, Any]]
) -> None:
    artifact, _ = tiny_bundles["standard"]
    out = tmp_path / "site"
    report = tmp_path / "report.json"
    result = CliRunner().invoke(
        cli, ["export", str(artifact), "--target", "web", "-o", str(out), "--report", str(report)]
    )
    assert result.exit_code == 0, result.output
    assert "chat bundle" in result.output and "prompt ids identical" in result.output
    assert json.loads(report.read_text())["kind"] == "chat"
    bad = CliRunner().invoke(
        cli,
        ["export", str(artifact), "--target", "web", "-o", str(tmp_path / "x"), "--shape", "a=1"],
    )
    assert bad.exit_code == 2 and "not a decoder" in bad.output
    assert "Traceback" not in bad.output


# -- in Chromium -----------------------------------------------------------------------------


def _screenshot(page: Any, name: str, places: list[Path]) -> None:
    env = os.environ.get("FERRY_SCREENSHOT_DIR")
    for folder in [*places, *([Path(env)] if env else [])]:
        page.screenshot(folder / name)


def _ask(page: Any, prompt: str, max_tokens: int) -> None:
    """Types a prompt into the chat box, as a person would, and sends it."""
    page.evaluate(f"(document.getElementById('max-tokens').value = {max_tokens}, true)")
    page.evaluate(f"(document.getElementById('prompt').value = {json.dumps(prompt)}, true)")
    page.click("send")


def _answer(page: Any) -> dict[str, Any]:
    page.wait_until(
        "window.ferryState && window.ferryState.generating === false && window.ferryState.last",
        "the answer to finish",
    )
    last: dict[str, Any] = page.evaluate("window.ferryState.last")
    return last


@pytest.mark.slow
def test_tiny_decoder_page_in_chromium(
    chromium: tuple[str, str],
    tiny_bundles: dict[str, tuple[Path, Any]],
    artifacts: Path,
    tmp_path: Path,
) -> None:
    import browser

    from ferry.generate import DecoderSession

    artifact, result = tiny_bundles["ort"]
    want = DecoderSession.from_folder(artifact, backends="onnxruntime").generate(
        messages=MESSAGES, max_new_tokens=12
    )
    with (
        browser.serve_static(result.out_dir) as url,
        browser.Page(url + "index.html", timeout=120) as page,
    ):
        info = page.ready()
        assert info["backend"] == "wasm"  # headless Chromium here offers no WebGPU adapter
        _ask(page, MESSAGES[0]["content"], 12)
        last = _answer(page)
        assert last["promptIds"] == DecoderSession.from_folder(artifact)._prompt_ids(
            None, MESSAGES, None
        )
        assert last["ids"] == want.ids
        assert page.text("error") == ""
        assert "tokens/s" in page.text("speed") and "MiB" in page.text("about")
        _screenshot(page, "chat-tiny.png", [artifacts, tmp_path])
        # WebGPU asked for where the browser has no adapter: a clear message, no fallback.
        with browser.Page(url + "index.html?backend=webgpu", timeout=120) as forced:
            with pytest.raises(browser.BrowserError, match="no WebGPU adapter; use backend wasm"):
                forced.ready()
            assert "no WebGPU adapter" in forced.text("error")


@pytest.fixture(scope="session")
def kit_builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The kit's SmolLM2 GGUF built twice by ``ferry convert``'s defaults: int4 (what the page
    runs), and float32 (the same dequantized weights: the page's arithmetic, in Python)."""
    from ferry.generate import convert_decoder
    from gguf_files import kit_gguf

    gguf = kit_gguf()
    root = tmp_path_factory.mktemp("chat-kit")
    return {
        "int4": convert_decoder(gguf, root / "smollm2-int4"),
        "fp32": convert_decoder(gguf, root / "smollm2-fp32", precision="fp32"),
    }


@pytest.mark.slow
@pytest.mark.real
def test_kit_smollm2_chats_in_chromium(
    chromium: tuple[str, str],
    npm: str,
    kit_builds: dict[str, Path],
    artifacts: Path,
    tmp_path: Path,
) -> None:
    import browser

    from ferry.generate import DecoderSession

    site = tmp_path / "site"
    exported = export_chat(kit_builds["int4"], site)
    exact = DecoderSession.from_folder(kit_builds["fp32"], backends="onnxruntime")
    native = DecoderSession.from_folder(kit_builds["int4"], backends="onnxruntime")
    answers = []
    with (
        browser.serve_static(site) as url,
        browser.Page(url + "index.html", timeout=300) as page,
    ):
        info = page.ready()
        # A long answer, photographed while it streams, then stopped from the page.
        _ask(page, "Write a short story about a lighthouse keeper and a storm.", 200)
        page.wait_until("window.ferryState.generating && window.ferryState.tokens >= 12", "tokens")
        _screenshot(page, "chat-smollm2-mid-answer.png", [artifacts, tmp_path])
        streamed = page.evaluate(
            "document.querySelector('.msg.assistant.generating .text').textContent"
        )
        assert len(streamed) > 20, streamed
        page.click("stop")
        stopped = _answer(page)
        assert stopped["finishReason"] == "abort" and len(stopped["ids"]) < 200
        # The greedy check, through the chat box, each prompt in a new chat.
        for prompt in KIT_PROMPTS:
            page.click("clear")
            _ask(page, prompt, 16)
            answers.append((prompt, _answer(page), page.text("speed")))
        _screenshot(page, "chat-smollm2-answer.png", [artifacts, tmp_path])
    record: dict[str, Any] = {
        "backend": info["backend"],
        "threads": info["threads"],
        "bundle_mib": round(sum((site / f).stat().st_size for f in exported.files) / 2**20, 1),
        "story_tokens_per_second": stopped["tokensPerSecond"],
        "prompts": [],
    }
    for prompt, last, speed in answers:
        messages = [{"role": "user", "content": prompt}]
        want = exact.generate(messages=messages, max_new_tokens=16)
        shipped = native.generate(messages=messages, max_new_tokens=16)
        agree = 0
        for a, b in zip(last["ids"], shipped.ids):
            if a != b:
                break
            agree += 1
        record["prompts"].append(
            {
                "prompt": prompt,
                "page_ids": last["ids"],
                "page_text": last["text"],
                "python_fp32_ids": want.ids,
                "python_int4_native_ids": shipped.ids,
                "agree_with_int4_native": f"{agree}/{len(shipped.ids)}",
                "page_tokens_per_second": last["tokensPerSecond"],
                "page_prefill_ms": last["prefillMs"],
                "speed_line": speed,
            }
        )
        assert last["promptIds"] == exact._prompt_ids(None, messages, None)
        assert last["ids"] == want.ids, record
        assert last["text"] == want.text
    (artifacts / "chat-kit.json").write_text(json.dumps(record, indent=2))
    print(json.dumps(record, indent=2))
