"""Admission to a model version's queue: the queue limit, request timeouts, and Retry-After.

Triton's ``dynamic_batching { default_queue_policy { ... } }`` says how a model's queue is guarded
(config.json takes the same object under ``dynamic_batching``):

- ``max_queue_size``: requests that may wait for an instance (not counting those running). One
  more is refused at once, before it touches the model: :class:`QueueFullError` (HTTP 429 with
  ``Retry-After``; gRPC RESOURCE_EXHAUSTED). 0 or absent: the server's ``--max-queue-size``
  (:data:`DEFAULT_MAX_QUEUE_SIZE`; 0 there: no limit). Models without dynamic batching take the
  server's limit too: their requests wait for a free instance in the same way.
- ``default_timeout_microseconds``: how long a request may wait in the queue (0: no limit). A
  request still queued when it passes is answered :class:`QueueTimeoutError` ("Request timeout
  expired", 429) and never runs; a request already running finishes.
- ``timeout_action``: ``REJECT`` (answer as above) or ``DELAY`` (keep the request: it runs after
  the requests that have not timed out, in the dynamic batcher; a model without dynamic batching
  keeps it in its place).
- ``allow_timeout_override``: whether a request's own ``timeout`` parameter (microseconds, as
  Triton's clients send it) may shorten the default; never lengthen it. A model whose config
  writes no queue policy honours every request's ``timeout`` (there is no default to shorten).

``Retry-After`` is the time the queue ahead would take to drain at the rate the model has been
taking requests off it lately (its recent service rate), in whole seconds, at least 1.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ferry.errors import EngineBusyError, InvalidInputError

if TYPE_CHECKING:
    from ferry.serving._metrics import VersionRecorder

__all__ = [
    "DEFAULT_MAX_QUEUE_SIZE",
    "TIMEOUT_ACTIONS",
    "Admission",
    "QueueFullError",
    "QueuePolicy",
    "QueueTimeoutError",
    "Ticket",
    "check_max_queue_size",
    "parse_queue_policy",
    "request_timeout",
    "retry_after_header",
]

#: ``ferry serve --max-queue-size``'s default: requests one model version may hold waiting.
#: Enough that a burst of a few hundred clients queues without a refusal (many batches' worth
#: for any model), few enough that the tensors held waiting stay bounded (256 requests at the
#: 64 MiB body limit at worst) and that the last one waits seconds, not minutes: past that a
#: client has usually given up, and the work done for it is wasted. The same as the OpenAI
#: API's ``--max-queue``.
DEFAULT_MAX_QUEUE_SIZE = 256
#: Triton's ``ModelQueuePolicy.TimeoutAction`` names.
TIMEOUT_ACTIONS = ("REJECT", "DELAY")
_POLICY_KEYS = {
    "max_queue_size",
    "timeout_action",
    "default_timeout_microseconds",
    "allow_timeout_override",
}
#: The starts the service rate is measured over, and how old the oldest may be.
_RATE_SAMPLES = 64
_RATE_WINDOW_NS = 10 * 1_000_000_000
#: The request parameter a client's timeout comes in (microseconds; Triton's schedule policy).
TIMEOUT_PARAMETER = "timeout"


class QueueFullError(EngineBusyError):
    """A model version's queue is full: the request was not admitted (HTTP 429)."""


class QueueTimeoutError(EngineBusyError):
    """A request waited in the queue past its timeout and was not run (HTTP 429)."""


@dataclasses.dataclass(frozen=True)
class QueuePolicy:
    """Triton's ``ModelQueuePolicy`` (see the module doc).

    Attributes:
        max_queue_size: requests that may wait; 0: the server's limit.
        timeout_action: ``"REJECT"`` or ``"DELAY"``.
        default_timeout_us: how long a request may wait; 0: no limit.
        allow_timeout_override: whether a request's ``timeout`` may shorten the default.
        written: whether a config wrote it (a model without one honours every request timeout).
    """

    max_queue_size: int = 0
    timeout_action: str = "REJECT"
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    written: bool = False

    def timeout_us(self, requested: int | None) -> int:
        """The timeout a request gets (0: none), given the one it asked for (None: none)."""
        default = self.default_timeout_us
        if requested is None or requested <= 0:
            return default
        if not self.written:
            return requested
        if self.allow_timeout_override and (default == 0 or requested < default):
            return requested
        return default


def parse_queue_policy(data: Any, where: str, error: type[Exception]) -> QueuePolicy:
    """``dynamic_batching.default_queue_policy`` of a config object, checked.

    Raises:
        error: an unknown key, or a value of the wrong type or range (naming it).
    """
    what = "dynamic_batching.default_queue_policy"
    if not isinstance(data, dict):
        raise error(f'{where}: {what} must be an object, e.g. {{"max_queue_size": 64}}')
    unknown = sorted(set(data) - _POLICY_KEYS)
    if unknown:
        raise error(
            f"{where}: unknown key {unknown[0]!r} in {what}; known: {', '.join(sorted(_POLICY_KEYS))}"
        )
    numbers = {}
    for key in ("max_queue_size", "default_timeout_microseconds"):
        value = data.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise error(f"{where}: {what}.{key} must be an integer >= 0, got {value!r}")
        numbers[key] = value
    action = data.get("timeout_action", "REJECT")
    if action not in TIMEOUT_ACTIONS:
        raise error(f"{where}: {what}.timeout_action must be REJECT or DELAY, got {action!r}")
    override = data.get("allow_timeout_override", False)
    if not isinstance(override, bool):
        raise error(f"{where}: {what}.allow_timeout_override must be true or false")
    return QueuePolicy(
        max_queue_size=numbers["max_queue_size"],
        timeout_action=action,
        default_timeout_us=numbers["default_timeout_microseconds"],
        allow_timeout_override=override,
        written=True,
    )


def check_max_queue_size(value: Any) -> int:
    """``value`` if it is a queue limit (an integer >= 0; 0: none), else InvalidInputError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(
            f"max_queue_size must be an integer >= 0 (0: no limit), got {value!r}"
        )
    return value


def request_timeout(parameters: Mapping[str, Any]) -> int | None:
    """The ``timeout`` request parameter (microseconds), None when absent.

    Raises:
        InvalidInputError: it is not an integer >= 0.
    """
    value = parameters.get(TIMEOUT_PARAMETER)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(
            f"the request parameter 'timeout' is microseconds, an integer >= 0; got {value!r}"
        )
    return value


class Ticket:
    """One admitted request: waiting until it starts, expires or leaves (event loop only)."""

    __slots__ = ("_admission", "_waiting", "arrival_ns", "deadline_ns", "delay", "timeout_us")

    def __init__(self, admission: Admission, timeout_us: int) -> None:
        self._admission = admission
        self._waiting = True
        self.arrival_ns = time.perf_counter_ns()
        self.timeout_us = timeout_us
        #: When it expires (perf_counter ns); None: never.
        self.deadline_ns = self.arrival_ns + timeout_us * 1000 if timeout_us else None
        #: Whether an expired request is kept (DELAY) rather than answered.
        self.delay = admission.policy.timeout_action == "DELAY"

    def start(self) -> None:
        """It leaves the queue to run."""
        if self._waiting:
            self._waiting = False
            self._admission._started()

    def expire(self) -> QueueTimeoutError:
        """It leaves the queue unrun, its timeout passed: the error to answer it with."""
        waited = time.perf_counter_ns() - self.arrival_ns
        if self._waiting:
            self._waiting = False
            self._admission._expired(waited)
        a = self._admission
        return QueueTimeoutError(
            f"Request timeout expired: model {a.model!r} version {a.version} held the request "
            f"{waited / 1e6:.0f} ms in its queue, past its timeout of {self.timeout_us} us; it "
            "was not run. Retry later, or give it a longer 'timeout' parameter",
            retry_after=a.retry_after(),
        )

    async def acquire(self, pool: Any) -> Any:
        """An instance from ``pool`` (``acquire``), waited for until the deadline at most
        (REJECT; DELAY waits on), then it starts.

        Raises:
            QueueTimeoutError: the deadline passed first; the request did not run.
        """
        if self.deadline_ns is None or self.delay:
            instance = await pool.acquire()
        else:
            remaining = (self.deadline_ns - time.perf_counter_ns()) / 1e9
            try:
                instance = await asyncio.wait_for(pool.acquire(), max(0.0, remaining))
            except asyncio.TimeoutError:
                raise self.expire() from None
        self.start()
        return instance

    def leave(self) -> None:
        """It leaves the queue otherwise (its client went away, the batcher failed)."""
        if self._waiting:
            self._waiting = False
            self._admission.waiting -= 1


class Admission:
    """A model version's queue limit, timeouts and service rate (event loop only).

    Args:
        model: the model's name (for messages).
        version: its version.
        policy: the config's queue policy.
        server_limit: the server's ``--max-queue-size`` (for a policy without one; 0: none).
        recorder: where rejections, timeouts and queue time go.
    """

    def __init__(
        self,
        model: str,
        version: str,
        policy: QueuePolicy,
        server_limit: int,
        recorder: VersionRecorder | None = None,
    ) -> None:
        self.model = model
        self.version = version
        self.policy = policy
        self.limit = policy.max_queue_size or server_limit
        self.knob = (
            "dynamic_batching.default_queue_policy.max_queue_size in the model's config"
            if policy.max_queue_size
            else "ferry serve --max-queue-size"
        )
        #: Requests admitted that have not started running (nor left).
        self.waiting = 0
        self.rejected = 0
        self.timed_out = 0
        self._recorder = recorder
        if recorder is not None:  # Triton's nv_inference_pending_request_count
            recorder.pending = lambda: self.waiting
        self._starts: collections.deque[int] = collections.deque(maxlen=_RATE_SAMPLES)

    def admit(self, requested_timeout_us: int | None = None) -> Ticket:
        """Admit one request to the queue, with the timeout it asked for (microseconds).

        Raises:
            QueueFullError: the queue holds its limit already.
        """
        self.check()
        self.waiting += 1
        return Ticket(self, self.policy.timeout_us(requested_timeout_us))

    def check(self) -> None:
        """Refuse a request now if the queue is full (before its body is decoded: a refusal
        should cost the server nothing the admitted requests need).

        Raises:
            QueueFullError: the queue holds its limit already.
        """
        if self.limit and self.waiting >= self.limit:
            self.rejected += 1
            if self._recorder is not None:
                self._recorder.rejected()
            after = self.retry_after()
            raise QueueFullError(
                f"model {self.model!r} version {self.version} is overloaded: its queue holds "
                f"{self.waiting} requests, its limit (max_queue_size {self.limit}); retry after "
                f"about {after:.2g} s, or raise the limit ({self.knob})",
                retry_after=after,
            )

    def triton_policy(self) -> dict[str, Any]:
        """The policy in force as Triton's ``/config`` shows ``default_queue_policy``."""
        return {
            "max_queue_size": self.limit,
            "timeout_action": self.policy.timeout_action,
            "default_timeout_microseconds": self.policy.default_timeout_us,
            "allow_timeout_override": self.policy.allow_timeout_override or not self.policy.written,
        }

    def service_rate(self) -> float | None:
        """Requests started per second lately (None: too few started in the window)."""
        now = time.perf_counter_ns()
        starts = self._starts
        while starts and now - starts[0] > _RATE_WINDOW_NS:
            starts.popleft()
        if len(starts) < 2:
            return None
        # Up to now, not the last start: a model that stopped taking requests drains slowly.
        return (len(starts) - 1) / max(now - starts[0], 1) * 1e9

    def retry_after(self) -> float:
        """Seconds the queue ahead would take to drain at the recent service rate (1 when it
        has no rate yet)."""
        rate = self.service_rate()
        if rate is None or rate <= 0:
            return 1.0
        return max(self.waiting, 1) / rate

    def _started(self) -> None:
        self.waiting -= 1
        self._starts.append(time.perf_counter_ns())

    def _expired(self, waited_ns: int) -> None:
        self.waiting -= 1
        self.timed_out += 1
        if self._recorder is not None:
            self._recorder.timed_out(queue_ns=waited_ns)


def retry_after_header(error: EngineBusyError) -> dict[str, str]:
    """``Retry-After`` for a refusal: whole seconds, at least 1 (HTTP takes no fractions)."""
    return {"Retry-After": str(max(1, math.ceil(error.retry_after)))}
