"""perplexity(): a text teacher-forced through a tiny converted decoder in chunks through the
key/value cache equals the log-softmax of one full-sequence pass, computed here in numpy
(issue 29)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_convert import prompt_logits, tiny_gguf

from ferry.errors import InvalidInputError
from ferry.generate._convert import convert_decoder
from ferry.generate._loop import DecoderSession
from ferry.generate._perplexity import log_softmax_nll, perplexity, teacher_forced_logits

TEXT = "Some words, then more words: perplexity counts every next token!"


@pytest.fixture(scope="module", params=["fp32", "int4"])
def artifact(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama converted from float (fp32) and from Q4_0 blocks (int4, the ort graph)."""
    tmp = tmp_path_factory.mktemp(request.param)
    matrix_type = None if request.param == "fp32" else "Q4_0"
    path, _, _ = tiny_gguf(tmp / "tiny.gguf", matrix_type=matrix_type)
    return convert_decoder(path, tmp / "artifact", verify=False)


def reference(folder: Path, ids: list[int]) -> np.ndarray:
    """Each next token's negative log-likelihood from one pass over ``ids`` (no cache)."""
    logits = prompt_logits(folder, ids).astype(np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return -logp[np.arange(len(ids) - 1), ids[1:]]


@pytest.mark.parametrize("chunk", [1, 5, 256])
def test_whole_text_matches_one_full_pass(artifact: Path, chunk: int) -> None:
    decoder = DecoderSession.from_folder(artifact, backends=["onnxruntime"], cache_dir=False)
    ids = list(decoder.tokenizer.encode(TEXT, add_special_tokens=True).ids)
    result = perplexity(decoder, TEXT, chunk=chunk)
    expected = reference(artifact, ids)
    assert result.ids == tuple(ids) and result.window == len(ids)
    assert result.tokens == len(ids) - 1 == len(result.token_nll)
    np.testing.assert_allclose(result.token_nll, expected, rtol=1e-4, atol=1e-5)
    assert result.nll == pytest.approx(float(expected.mean()), rel=1e-5)
    assert result.ppl == pytest.approx(math.exp(result.nll))
    assert result.ppl > 1.0


def test_windows_are_scored_each_from_an_empty_cache(artifact: Path) -> None:
    decoder = DecoderSession.from_folder(artifact, backends=["onnxruntime"], cache_dir=False)
    ids = list(decoder.tokenizer.encode(TEXT, add_special_tokens=False).ids)
    ids = ids[:21]  # windows of 8, 8 and 5 tokens
    result = perplexity(decoder, ids, window=8, chunk=3)
    expected = np.concatenate([reference(artifact, ids[s : s + 8]) for s in (0, 8, 16)])
    assert result.tokens == 7 + 7 + 4 and result.window == 8
    np.testing.assert_allclose(result.token_nll, expected, rtol=1e-4, atol=1e-5)
    # A lone last token has nothing in its window to predict it.
    assert perplexity(decoder, ids[:17], window=8).tokens == 7 + 7


def test_teacher_forced_logits_match_one_full_pass(artifact: Path) -> None:
    decoder = DecoderSession.from_folder(artifact, backends=["onnxruntime"], cache_dir=False)
    ids = list(decoder.tokenizer.encode(TEXT, add_special_tokens=True).ids)
    got = teacher_forced_logits(decoder, ids, chunk=4)
    assert got.shape == (len(ids), 80)
    np.testing.assert_allclose(got, prompt_logits(artifact, ids), rtol=1e-4, atol=1e-4)
    with pytest.raises(InvalidInputError, match="chunk >= 1"):
        teacher_forced_logits(decoder, ids, chunk=0)


def test_refusals(artifact: Path) -> None:
    decoder = DecoderSession.from_folder(artifact, backends=["onnxruntime"], cache_dir=False)
    cases: list[tuple[Any, dict[str, Any], str]] = [
        ([5], {}, "at least 2 tokens"),
        ([5, 6, 7], {"window": 1}, "window=1"),
        ([5, 6, 7], {"chunk": 0}, "chunk=0"),
        ([5, 6, 7], {"window": 10_000}, "exceeds the model's context of 512"),
        ([5, 6, 10_000], {}, "outside the vocabulary"),
    ]
    for text, options, message in cases:
        with pytest.raises(InvalidInputError, match=message):
            perplexity(decoder, text, **options)


def test_log_softmax_nll_is_float64_and_stable() -> None:
    logits = np.array([[1000.0, 0.0], [0.0, 0.0]], dtype=np.float32)
    out = log_softmax_nll(logits, [0, 1])
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, [0.0, math.log(2.0)], atol=1e-12)
