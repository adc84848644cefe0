"""One sequence's new text as its tokens come: decoded incrementally, cut at stop strings, a
partial character or a possible stop string held back until the next token settles it.

The token loop and the continuous-batching engine both feed it one token at a time.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

__all__ = ["SequenceText"]

# U+FFFD: what decoding gives for the first bytes of a character whose last ones are still to come.
_PARTIAL = "\ufffd"


class SequenceText:
    """The text of one sequence's new tokens.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` (``decode(ids, skip_special_tokens=True)``).
        eos_ids: ids that end the sequence ("stop").
        stops: strings that end it ("stop"); the text is cut before the first.
        budget: at most this many new tokens ("length" after the last).

    Attributes:
        ids: the new ids so far (an eos id or the token completing a stop string included).
        text: the text so far (cut before a stop string once one is found).
        finish_reason: None while running; then "stop" or "length".
    """

    def __init__(
        self, tokenizer: Any, eos_ids: Collection[int], stops: Sequence[str], budget: int
    ) -> None:
        self._tokenizer = tokenizer
        self._eos = eos_ids
        self._stops = list(stops)
        self._budget = budget
        self.ids: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None
        self._emitted = 0  # characters already given out

    def add(self, token: int) -> str:
        """Take the next token: the text it lets out (may be empty). Sets ``finish_reason``
        when the sequence ends with it; what was held back comes out then."""
        self.ids.append(token)
        if token in self._eos:
            self.finish_reason = "stop"
            return self._rest()
        self.text = self._tokenizer.decode(self.ids, skip_special_tokens=True)
        cut = first_stop(self.text, self._stops)
        if cut is not None:
            self.text, self.finish_reason = self.text[:cut], "stop"
            return self._rest()
        if len(self.ids) >= self._budget:
            self.finish_reason = "length"
            return self._rest()
        safe = safe_end(self.text, self._emitted, self._stops)
        out = self.text[self._emitted : safe]
        self._emitted = safe
        return out

    def _rest(self) -> str:
        out = self.text[self._emitted :]
        self._emitted = len(self.text)
        return out


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the first stop string begins in ``text``, or None."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def safe_end(text: str, start: int, stops: Sequence[str]) -> int:
    """How far the text may be given out: not a trailing partial character (U+FFFD, completed
    by the next token), nor a tail that may begin a stop string."""
    end = len(text)
    while end > start and text[end - 1] == _PARTIAL:
        end -= 1
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, end - start), hold, -1):
            if text[end - k : end] == s[:k]:
                hold = k
                break
    return end - hold
