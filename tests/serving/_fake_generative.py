"""A fake generative model for the HTTP layer's tests (imported by name: keep it unique).

:class:`FakeEngine` follows ``ferry.generate.BatchEngine``'s interface exactly (``submit``,
``context_length``; streams of :class:`TokenEvent` then one :class:`Generation`) and answers a
fixed script, so the OpenAI and Triton routes are tested without a decoder; :func:`serve_fake`
puts a :class:`FakeVersion` named ``tiny`` into an app's repository beside its tensor models.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from ferry.errors import EngineBusyError, EngineClosedError, ExecutionError, InvalidInputError
from ferry.generate import Generation, GenerationRequest, TokenEvent
from ferry.serving._generative import GenerativeVersion

#: What the fake answers, one piece per token ("" while a token is held back, as the engine
#: does with a partial character); the last is the end token (no text).
SCRIPT = ("Hel", "lo", "", " wor", "ld", "!", "")
ANSWER = "Hello world!"
EOS = 0
CONTEXT = 64
VOCAB = 300


class FakeStream:
    """A ``GenerationStream``: the script's tokens, then the :class:`Generation`."""

    def __init__(self, engine: FakeEngine, request: GenerationRequest) -> None:
        self.prompt_tokens = len(request.prompt_ids)
        self.request = request
        self.cancelled = False
        self._engine = engine

    def cancel(self) -> None:
        self.cancelled = True

    async def __aiter__(self) -> AsyncIterator[TokenEvent | Generation]:
        engine = self._engine
        budget = min(self.request.max_new_tokens, engine.context_length - self.prompt_tokens)
        text, ids = "", list[int]()
        for i, piece in enumerate(engine.script):
            if i == budget:
                yield Generation(text, ids, "length", self.prompt_tokens)
                return
            if engine.delay:
                await asyncio.sleep(engine.delay)
            if self.cancelled:
                return  # the engine drops a cancelled sequence
            if engine.fail_after is not None and i >= engine.fail_after:
                raise ExecutionError("the fake engine failed")
            last = i == len(engine.script) - 1
            ids.append(EOS if last else 100 + i)
            cut = _cut(text + piece, self.request.stop)
            if cut is not None:
                yield TokenEvent(ids[-1], cut[len(text) :])
                yield Generation(cut, ids, "stop", self.prompt_tokens)
                return
            text += piece
            yield TokenEvent(ids[-1], piece)
        yield Generation(text, ids, engine.finish_reason, self.prompt_tokens)


def _cut(text: str, stops: Sequence[str]) -> str | None:
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return text[: min(found)] if found else None


class FakeEngine:
    """A ``BatchEngine``: ``submit`` checks as the real one does and records each request."""

    def __init__(self, context_length: int = CONTEXT) -> None:
        self.context_length = context_length
        self.script: tuple[str, ...] = SCRIPT
        self.requests: list[GenerationRequest] = []
        self.streams: list[FakeStream] = []
        #: Seconds between tokens.
        self.delay = 0.0
        #: The finish reason of a script that runs to its end ("stop"; "abort" as a drain's).
        self.finish_reason = "stop"
        #: Fail (the stream raises) at this token.
        self.fail_after: int | None = None
        #: Refuse: "busy" (429) or "closed" (503).
        self.refuse: str | None = None

    def submit(self, request: GenerationRequest) -> FakeStream:
        asyncio.get_running_loop()  # called on the event loop, as the real one must be
        if not request.prompt_ids:
            raise InvalidInputError("the prompt is empty: give at least one token")
        if len(request.prompt_ids) >= self.context_length:
            raise InvalidInputError("the prompt fills the context")
        if self.refuse == "busy":
            raise EngineBusyError("256 requests are waiting already: retry later", 2.5)
        if self.refuse == "closed":
            raise EngineClosedError("the server is shutting down: it admits no new request")
        self.requests.append(request)
        stream = FakeStream(self, request)
        self.streams.append(stream)
        return stream

    def stats(self) -> dict[str, float]:
        return {"running": 0.0, "waiting": 0.0, "kv_cache_usage": 0.0}


class FakeTokenizer:
    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        return VOCAB


class FakeDecoder:
    tokenizer = FakeTokenizer()
    template = None
    eos_ids = frozenset([EOS])


class FakeVersion(GenerativeVersion):
    """A ``GenerativeVersion`` on a :class:`FakeEngine`: one token per character of the prompt
    (chat: of its rendered messages)."""

    def __init__(self, name: str = "tiny", version: int = 1) -> None:
        self.name = name
        self.version = version
        self.version_str = str(version)
        self.created = 1_700_000_000
        self.decoder: Any = FakeDecoder()
        self.engine: Any = FakeEngine()
        #: The messages the last chat request rendered.
        self.rendered: list[dict[str, Any]] = []
        #: Requests in flight (``enter`` .. ``exit``), and how many entered in all.
        self.active = 0
        self.entered = 0

    def enter(self) -> None:
        self.active += 1
        self.entered += 1

    def exit(self) -> None:
        self.active -= 1
        assert self.active >= 0

    def chat_prompt_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        if messages[0]["role"] == "assistant":
            raise InvalidInputError(
                "the template refuses a conversation that starts with 'assistant'"
            )
        self.rendered = [dict(m) for m in messages]
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
        return [ord(c) % VOCAB for c in text]

    def text_prompt_ids(self, prompt: str) -> list[int]:
        return [ord(c) % VOCAB for c in prompt]


class FakeRepository:
    """An app's repository with :class:`FakeVersion` models added to it."""

    def __init__(self, inner: Any, versions: Sequence[FakeVersion]) -> None:
        self._inner = inner
        self.fakes = {v.name: v for v in versions}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def get(self, name: str, version: str | None = None) -> Any:
        fake = self.fakes.get(name)
        if fake is None:
            return self._inner.get(name, version)
        if version not in (None, "", fake.version_str):
            from ferry.serving._repository import ModelNotFoundError

            raise ModelNotFoundError(f"model {name!r} has no version {version}")
        return fake

    def all_serving(self) -> list[Any]:
        return sorted([*self._inner.all_serving(), *self.fakes.values()], key=lambda v: v.name)


def serve_fake(app: Any, *versions: FakeVersion) -> FakeVersion:
    """Serve ``versions`` (default one :class:`FakeVersion` named ``tiny``) in ``app``; the first."""
    versions = versions or (FakeVersion(),)
    state = app.state.ferry
    state.repository = FakeRepository(state.repository, versions)
    return versions[0]
