"""``backends="auto"`` for a decoder: the engine and precision that decode fastest while keeping
the tokens.

A decoder's time is its token loop, so one forward at made-up sizes says nothing: each candidate
(every available engine that runs the whole graph, at each precision it offers) generates for
real: a prompt of English text through the artifact's own tokenizer, then greedy tokens through
its cache, timed in alternating rounds (one engine's spinning threads would otherwise slow the
next). It is judged by greedy-token agreement: the reference (ONNX Runtime at the artifact's own
precision) generates a continuation, and each candidate, fed the prompt and that continuation in
one pass, must predict the reference's next token at :data:`AGREEMENT` of the positions (teacher
forced, so one near-tie does not change every later token). The fastest that agrees wins; within
:data:`TIE` of it, the reference, then fp32. The choice and its table are cached per artifact,
candidate list, threads and machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ferry.backends import FALLBACK, get_backend
from ferry.errors import FerryError, InvalidInputError
from ferry.generate._loop import DecoderSession

__all__ = ["AGREEMENT", "TIE", "DecoderCandidate", "DecoderChoice", "auto_decoder"]

logger = logging.getLogger(__name__)

#: A candidate must predict the reference's greedy token at this share of positions.
AGREEMENT = 0.95
#: Candidates within this fraction of the fastest decode count as equally fast.
TIE = 0.03
PROMPT_TOKENS = 64
NEW_TOKENS = 32
ROUNDS = 3

# Plain English for the timed prompt: real words through the artifact's own tokenizer, so the
# ids are the kind the model sees (random ids put a model in states it never meets).
_TEXT = (
    "The harbour master kept a ledger of every ship that came into port. Each morning he wrote "
    "down the name of the vessel, the weather, the cargo it carried and the hour it tied up at "
    "the quay. Over forty years the ledger grew into a history of the town: the years of good "
    "harvests, when grain ships crowded the river, and the hard winters, when ice closed the "
    "channel for weeks and nothing moved at all. Children who grew up on the waterfront learned "
    "to read from its pages, and old sailors came to check the dates of their own voyages."
)


@dataclasses.dataclass
class DecoderCandidate:
    """One engine and precision tried.

    Attributes:
        label: ``"openvino bf16"``.
        backend: the engine.
        precision: the precision it ran in.
        load_s: the time to load the artifact on it.
        ttft_ms: median time to the first token after the prompt.
        decode_tokens_per_s: median greedy decode rate.
        agreement: the share of the reference's greedy tokens it predicts (teacher forced).
        error: why it was not measured (it runs only part of the graph, it failed...).
    """

    label: str
    backend: str
    precision: str
    load_s: float = 0.0
    ttft_ms: float | None = None
    decode_tokens_per_s: float | None = None
    agreement: float | None = None
    error: str | None = None
    session: DecoderSession | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def passed(self) -> bool:
        """Measured, and it keeps the reference's tokens."""
        return self.error is None and self.agreement is not None and self.agreement >= AGREEMENT

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "backend": self.backend,
            "precision": self.precision,
            "load_s": round(self.load_s, 3),
            "ttft_ms": self.ttft_ms,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "agreement": self.agreement,
            "passed": self.passed,
            "error": self.error,
        }


@dataclasses.dataclass
class DecoderChoice:
    """What auto chose for a decoder, and the table it chose from.

    Attributes:
        label: the chosen candidate's label.
        backend: its engine.
        precision: its precision.
        table: one row per candidate (``DecoderCandidate.to_dict``).
        prompt_tokens: the timed prompt's length.
        new_tokens: the greedy tokens timed and judged.
        from_cache: read from the cache, not measured now.
        cache_path: where it is saved (None: not cached).
        busy: why the machine counted as busy when it measured (then nothing is cached), or "".
    """

    label: str
    backend: str
    precision: str
    table: list[dict[str, Any]]
    prompt_tokens: int
    new_tokens: int
    from_cache: bool = False
    cache_path: Path | None = None
    busy: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "chosen": self.label,
            "backend": self.backend,
            "precision": self.precision,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "from_cache": self.from_cache,
            "candidates": self.table,
        }


def auto_decoder(
    folder: str | os.PathLike[str],
    *,
    names: Sequence[str] | None = None,
    threads: int | None = None,
    precision: str | None = None,
    cache_dir: str | os.PathLike[str] | Literal[False] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> DecoderSession:
    """The artifact at ``folder`` on the engine and precision that decode it fastest with its
    tokens kept; ``.auto`` on the returned session says what was measured.

    Args:
        folder: a generative artifact folder.
        names: the engines to consider; None: every available one (simulated adapters left out).
        threads: intra-op threads per engine.
        precision: only candidates in this precision.
        cache_dir: passed to each load (the engine cache); False also skips auto's own cache.
        options: per-backend compile options.

    Raises:
        FerryError: no candidate ran and kept the tokens (each one's reason is named).
    """
    from ferry.generate._artifact import load_decoder_files
    from ferry.runtime import default_cache_dir, machine_fingerprint

    folder = Path(folder)
    files = load_decoder_files(folder)
    engines = _engines(names)
    pairs = [
        (name, offered)
        for name in engines
        for offered in get_backend(name).precisions
        if precision is None or offered == precision
    ]
    if not pairs:
        raise InvalidInputError(
            f"auto: no engine among {', '.join(engines)} offers precision {precision!r}"
        )
    key = _cache_key(folder, pairs, threads, machine_fingerprint())
    # Beside auto's choices for one-forward models (ferry.runtime's verdicts folder).
    path = None if cache_dir is False else default_cache_dir() / "auto" / f"decoder-{key}.json"
    cached = _read_cache(path) if path is not None else None

    def load_one(name: str, offered: str) -> DecoderSession:
        from ferry.runtime import load

        session = load(
            folder / "model.onnx",
            backends=[name],
            precision=offered,
            threads=threads,
            cache_dir=cache_dir,
            options=options,
            check_pays=False,
        )
        if len(session.plan.partitions) != 1 or session.plan.backends != [name]:
            raise _PartOnly(
                f"{name} does not run the whole decoder (placed on {', '.join(session.plan.backends)})"
            )
        return DecoderSession(session, files.tokenizer, files.template, files.generation_config)

    busy = _busy()
    if busy:
        logger.warning(
            "auto: the machine is busy (%s); the decoder's timings will say little and the "
            "choice is not cached",
            busy,
        )
    if cached is not None:
        reloaded = load_one(cached.backend, cached.precision)
        reloaded.auto = cached
        return reloaded
    candidates = [DecoderCandidate(f"{n} {p}", n, p) for n, p in pairs]
    for candidate in candidates:
        start = time.perf_counter()
        try:
            candidate.session = load_one(candidate.backend, candidate.precision)
        except (FerryError, _PartOnly) as e:
            candidate.error = str(e)
            logger.info("auto: %s not measured: %s", candidate.label, e)
        candidate.load_s = time.perf_counter() - start
    measured = [c for c in candidates if c.session is not None]
    if not measured:
        raise FerryError(
            "auto: no engine could load this decoder: "
            + "; ".join(f"{c.label}: {c.error}" for c in candidates)
        )
    prompt, new = _sizes(measured[0].session)
    _time(measured, prompt, new)
    _judge(measured, prompt, new)
    chosen = _choose(candidates)
    choice = DecoderChoice(
        chosen.label,
        chosen.backend,
        chosen.precision,
        [c.to_dict() for c in candidates],
        len(prompt),
        new,
        cache_path=None if busy else path,
        busy=busy,
    )
    if choice.cache_path is not None:
        _write_cache(choice.cache_path, choice)
    decoder = chosen.session
    assert decoder is not None
    decoder.auto = choice
    for candidate in candidates:  # let the others' engines go
        candidate.session = None
    return decoder


def _busy() -> str:
    """Why timings taken now would say little: other work keeping the cores busy (the 1-minute
    load average over three quarters of the cores), or "" when the machine is quiet."""
    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:  # not measurable here (Windows)
        return ""
    return f"load average {load:.1f} on {cores} cores" if load > 0.75 * cores else ""


class _PartOnly(Exception):
    """The engine took only part of the graph: a decoder split across engines pays a boundary
    every token."""


def _engines(names: Sequence[str] | None) -> list[str]:
    """The reference engine first, then the others auto considers (runtime's rule)."""
    from ferry.runtime import auto_engines

    return [FALLBACK, *(n for n in auto_engines(names) if n != FALLBACK)]


def _sizes(decoder: DecoderSession | None) -> tuple[list[int], int]:
    """The timed prompt (PROMPT_TOKENS of the text, fewer in a short context) and how many new
    tokens fit after it (NEW_TOKENS at most)."""
    assert decoder is not None
    context = decoder.context_length or PROMPT_TOKENS + NEW_TOKENS
    length = min(PROMPT_TOKENS, context // 2)
    ids = list(decoder.tokenizer.encode(_TEXT, add_special_tokens=True).ids)
    while len(ids) < length:
        ids += list(decoder.tokenizer.encode(" " + _TEXT, add_special_tokens=False).ids)
    return ids[:length], max(2, min(NEW_TOKENS, context - length))


def _greedy(decoder: DecoderSession, prompt: list[int], new: int) -> tuple[float, float, list[int]]:
    """Seconds to the first token, seconds for the rest, and the greedy tokens (eos ignored:
    exactly ``new`` are timed)."""
    runner = decoder.kv_runner(len(prompt) + new)
    start = time.perf_counter()
    token = int(np.argmax(decoder.step(runner, prompt, 0, last_only=True)[-1]))
    first = time.perf_counter()
    tokens = [token]
    for i in range(new - 1):
        token = int(np.argmax(decoder.step(runner, [token], len(prompt) + i, last_only=True)[-1]))
        tokens.append(token)
    return first - start, time.perf_counter() - first, tokens


def _time(candidates: list[DecoderCandidate], prompt: list[int], new: int) -> None:
    """Each candidate's median ttft and decode rate over ROUNDS, the order reversed each round."""
    ttft: dict[str, list[float]] = {c.label: [] for c in candidates}
    rate: dict[str, list[float]] = {c.label: [] for c in candidates}
    for candidate in candidates:  # a warm-up run each
        assert candidate.session is not None
        try:
            _greedy(candidate.session, prompt, new)
        except FerryError as e:
            candidate.error = f"failed to generate: {e}"
    running = [c for c in candidates if c.error is None]
    for round_ in range(ROUNDS):
        for candidate in running if round_ % 2 == 0 else running[::-1]:
            assert candidate.session is not None
            first, rest, _ = _greedy(candidate.session, prompt, new)
            ttft[candidate.label].append(first * 1000)
            rate[candidate.label].append((new - 1) / rest)
    for candidate in running:
        candidate.ttft_ms = round(statistics.median(ttft[candidate.label]), 2)
        candidate.decode_tokens_per_s = round(statistics.median(rate[candidate.label]), 2)


def _judge(candidates: list[DecoderCandidate], prompt: list[int], new: int) -> None:
    """Teacher-forced greedy agreement with the reference (the first candidate)."""
    reference = candidates[0]
    if reference.error is not None or reference.session is None:
        for candidate in candidates:
            candidate.error = candidate.error or f"no reference: {reference.error}"
        return
    _, _, tokens = _greedy(reference.session, prompt, new)
    sequence = prompt + tokens[:-1]
    for candidate in candidates:
        if candidate.error is not None or candidate.session is None:
            continue
        runner = candidate.session.kv_runner(len(sequence))
        logits = candidate.session.step(runner, sequence, 0)[len(prompt) - 1 :]
        predicted = np.argmax(logits, axis=-1)
        candidate.agreement = round(float(np.mean(predicted == np.asarray(tokens))), 4)


def _choose(candidates: list[DecoderCandidate]) -> DecoderCandidate:
    passing = [c for c in candidates if c.passed and c.decode_tokens_per_s]
    if not passing:
        raise FerryError(
            "auto: no engine ran this decoder and kept its greedy tokens: "
            + "; ".join(
                f"{c.label}: {c.error or f'agreement {c.agreement:.1%} < {AGREEMENT:.0%}'}"
                for c in candidates
            )
        )
    fastest = max(c.decode_tokens_per_s or 0.0 for c in passing)
    close = [c for c in passing if (c.decode_tokens_per_s or 0.0) >= fastest * (1 - TIE)]
    order = {id(c): i for i, c in enumerate(candidates)}
    return min(close, key=lambda c: (c is not candidates[0], c.precision != "fp32", order[id(c)]))


def _cache_key(
    folder: Path, pairs: list[tuple[str, str]], threads: int | None, machine: str
) -> str:
    """The graph file's bytes (small: the weights live beside it), its data files' sizes and
    times, the candidates, threads and the machine."""
    digest = hashlib.sha256()
    graph = folder / "model.onnx"
    digest.update(graph.read_bytes())
    for data in sorted(folder.glob("model.onnx*")):
        stat = data.stat()
        digest.update(f"{data.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    digest.update(json.dumps([pairs, threads, machine]).encode())
    return digest.hexdigest()[:32]


def _read_cache(path: Path) -> DecoderChoice | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        choice = DecoderChoice(
            str(data["chosen"]),
            str(data["backend"]),
            str(data["precision"]),
            list(data["candidates"]),
            int(data["prompt_tokens"]),
            int(data["new_tokens"]),
            from_cache=True,
            cache_path=path,
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    logger.info("auto: using the cached choice %s (%s)", choice.label, path)
    return choice


def _write_cache(path: Path, choice: DecoderChoice) -> None:
    from ferry.runtime import save_verdict

    if not save_verdict(path, choice.to_dict(), "auto's choice for the decoder"):
        choice.cache_path = None
