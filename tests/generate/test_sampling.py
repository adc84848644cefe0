"""The sampler against transformers' logits processors on random logits (issue 29)."""

from __future__ import annotations

import numpy as np
import pytest

from ferry.errors import InvalidInputError
from ferry.generate._sampling import (
    Sampler,
    SamplingOptions,
    apply_repetition_penalty,
    apply_temperature,
    apply_top_k,
    apply_top_p,
    sampling_options,
)

torch = pytest.importorskip("torch")
generation = pytest.importorskip("transformers.generation.logits_process")

VOCAB = 257


def _logits(seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(VOCAB) * 3).astype(np.float32)


def _theirs(processor: object, logits: np.ndarray, ids: list[int] | None = None) -> np.ndarray:
    input_ids = torch.tensor([ids or [0]], dtype=torch.long)
    out = processor(input_ids, torch.from_numpy(logits.copy())[None])  # type: ignore[operator]
    return out[0].numpy()


def _same(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert np.array_equal(np.isinf(ours), np.isinf(theirs))
    finite = np.isfinite(theirs)
    np.testing.assert_allclose(ours[finite], theirs[finite], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("temperature", [0.3, 1.0, 1.7])
def test_temperature_matches_transformers(seed: int, temperature: float) -> None:
    logits = _logits(seed)
    theirs = _theirs(generation.TemperatureLogitsWarper(temperature), logits)
    _same(apply_temperature(logits, temperature), theirs)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("top_k", [1, 5, 50, VOCAB - 1])
def test_top_k_matches_transformers(seed: int, top_k: int) -> None:
    logits = _logits(seed)
    _same(apply_top_k(logits, top_k), _theirs(generation.TopKLogitsWarper(top_k), logits))


def test_top_k_keeps_ties_as_transformers_does() -> None:
    logits = np.array([1.0, 2.0, 2.0, 2.0, 0.5], dtype=np.float32)
    _same(apply_top_k(logits, 2), _theirs(generation.TopKLogitsWarper(2), logits))
    assert np.isfinite(apply_top_k(logits, 2)).sum() == 3


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.99])
def test_top_p_matches_transformers(seed: int, top_p: float) -> None:
    logits = _logits(seed)
    _same(apply_top_p(logits, top_p), _theirs(generation.TopPLogitsWarper(top_p), logits))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("penalty", [0.7, 1.3, 2.0])
def test_repetition_penalty_matches_transformers(seed: int, penalty: float) -> None:
    logits = _logits(seed)
    ids = [int(i) for i in np.random.default_rng(seed + 100).integers(0, VOCAB, 20)]
    ids += ids[:3]  # an id seen twice is penalised once
    processor = generation.RepetitionPenaltyLogitsProcessor(penalty)
    _same(apply_repetition_penalty(logits, ids, penalty), _theirs(processor, logits, ids))


def test_greedy_is_argmax_after_the_penalty() -> None:
    logits = _logits(0)
    best = int(np.argmax(logits))
    assert Sampler(SamplingOptions())(logits, []) == best
    # A strong penalty on the best id moves greedy off it, as in transformers.
    assert Sampler(SamplingOptions(repetition_penalty=1e6))(logits, [best]) != best


def test_same_seed_same_draws_and_draws_stay_in_the_kept_set() -> None:
    options = SamplingOptions(temperature=1.0, top_k=10, top_p=0.9, seed=7)
    logits = [_logits(i) for i in range(30)]
    first = [Sampler(options)(row, []) for row in logits]
    a, b = Sampler(options), Sampler(options)
    assert [a(row, []) for row in logits] == [b(row, []) for row in logits]
    for row, picked in zip(logits, first):
        kept = np.isfinite(apply_top_p(apply_top_k(row, 10), 0.9))
        assert kept[picked]
    other = Sampler(SamplingOptions(temperature=1.0, seed=8))
    assert [other(row, []) for row in logits] != [Sampler(options)(row, []) for row in logits]


def test_sampling_follows_the_distribution() -> None:
    logits = np.log(np.array([0.7, 0.2, 0.1], dtype=np.float32))
    sampler = Sampler(SamplingOptions(temperature=1.0, seed=0))
    counts = np.bincount([sampler(logits, []) for _ in range(4000)], minlength=3) / 4000
    np.testing.assert_allclose(counts, [0.7, 0.2, 0.1], atol=0.03)


def test_options_validated() -> None:
    assert sampling_options() == SamplingOptions()
    assert sampling_options(temperature=0.8, top_k=3, seed=1).top_k == 3
    for name, value in [
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("top_k", -1),
        ("top_k", 2.5),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("repetition_penalty", 0.0),
        ("seed", -3),
        ("temperature", True),
    ]:
        with pytest.raises(InvalidInputError, match=name) as info:
            sampling_options(**{name: value})
        assert "takes" in str(info.value)
    with pytest.raises(InvalidInputError, match="top_q.*temperature, top_k, top_p"):
        sampling_options(top_q=0.5)
