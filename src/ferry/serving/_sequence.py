"""Stateful models served with Triton's sequence batching: the state of each sequence kept on the
server, keyed by the ``sequence_id`` its requests carry.

A model is stateful when its config declares ``sequence_batching`` (config.json, or config.pbtxt
read as Triton spells it), or when it follows ferry's naming of recurrent state: an input
``state:<v>`` that the previous call's output ``state_out:<v>`` feeds (what ``ferry convert`` gives a
TFLite model's variables, :mod:`ferry._state_names`). Config.json's form::

    "sequence_batching": {
      "max_sequence_idle_microseconds": 5000000,
      "state": [{"input_name": "h_in", "output_name": "h_out", "data_type": "TYPE_FP32",
                 "dims": [64], "initial_state": {"data_type": "TYPE_FP32", "dims": [64],
                 "zero_data": true, "name": "zeros"}}]
    }

A declared ``state`` list replaces the naming convention; without one, the ``state:*`` pairs are
the state. Clients send only the other inputs and get only the other outputs, with the request
parameters Triton's clients send (``tritonclient``'s ``sequence_id=``, ``sequence_start=``,
``sequence_end=``): ``sequence_id`` (a non-zero int or a non-empty string), ``sequence_start``
(the state starts from its initial value: the state input's default in the model when it has one,
else zeros) and ``sequence_end`` (the state is freed after this request). A sequence idle for
``max_sequence_idle_microseconds`` (Triton's default, 1 s) is freed; its next request without
``sequence_start`` is answered 400 saying so.

Requests of one sequence run one after the other, in arrival order (each needs the state the last
one left). Requests of different sequences go to the model's batcher as usual: on a model with a
batch dim, the dynamic batcher runs concurrent sequences as one batch, their state rows stacked
along dim 0 with their inputs and split back the same way, so a sequence's answers are those of
feeding it alone (up to the engine's float reduction order at another batch size).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ferry._state_names import STATE_INPUT_PREFIX, STATE_OUTPUT_PREFIX
from ferry.errors import InvalidInputError, ModelLoadError
from ferry.serving._batcher import BatchOutcome
from ferry.serving._codec import DATATYPES, datatype_of
from ferry.serving._config_checks import TRITON_TYPES as _TRITON_TYPES
from ferry.serving._config_checks import ConfigError
from ferry.serving._config_checks import check_int as _int
from ferry.serving._config_checks import check_keys as _check_keys

__all__ = [
    "DEFAULT_IDLE_US",
    "SequenceBatcher",
    "SequenceConfig",
    "SequencePlan",
    "StateConfig",
    "parse_sequence_batching",
    "sequence_plan",
]

#: Triton's default ``max_sequence_idle_microseconds``.
DEFAULT_IDLE_US = 1_000_000
#: Expired sequence ids remembered, so that their next request says why it failed.
_REMEMBERED_EXPIRED = 10_000

_KEYS = {
    "max_sequence_idle_microseconds",
    "state",
    "direct",
    "oldest",
    "control_input",
    "iterative_sequence",
}
_STATE_KEYS = {
    "input_name",
    "output_name",
    "data_type",
    "dims",
    "initial_state",
    "use_same_buffer_for_input_output",
    "use_growable_memory",
}
_INITIAL_KEYS = {"name", "data_type", "dims", "zero_data", "data_file"}
_NUMPY_OF_TRITON = {
    triton: DATATYPES[kserve] for kserve, triton in _TRITON_TYPES.items() if kserve != "BYTES"
}


@dataclasses.dataclass(frozen=True)
class StateConfig:
    """One implicit state tensor: fed to ``input_name``, read back from ``output_name``.

    Attributes:
        input_name: the model input the state is fed to.
        output_name: the model output the next state is read from.
        dtype: its numpy dtype; None: the model's.
        dims: its dims (after the batch dim on a batching model); None: the model's.
    """

    input_name: str
    output_name: str
    dtype: np.dtype[Any] | None = None
    dims: tuple[int, ...] | None = None

    @property
    def names(self) -> tuple[str, str]:
        return self.input_name, self.output_name


@dataclasses.dataclass(frozen=True)
class SequenceConfig:
    """A model config's ``sequence_batching``.

    Attributes:
        states: the declared implicit state (empty: the ``state:*`` naming convention).
        max_idle_us: how long a sequence may go without a request before it is freed.
    """

    states: tuple[StateConfig, ...] = ()
    max_idle_us: int = DEFAULT_IDLE_US


def parse_sequence_batching(data: Any, where: str) -> SequenceConfig:
    """Check a config's ``sequence_batching`` object (Triton's fields, as JSON).

    Raises:
        ConfigError: a value of the wrong type, an unknown key, control inputs (ferry feeds
            no control tensors), an initial state from a data file.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: 'sequence_batching' must be an object, e.g. {{}}")
    _check_keys(data, _KEYS, where, "sequence_batching ")
    if data.get("control_input"):
        raise ConfigError(
            f"{where}: sequence_batching.control_input is not supported: ferry keeps each "
            "sequence's state itself (declare it under 'state', or name the model's inputs "
            "state:<v> and outputs state_out:<v>) and feeds no START/END/CORRID tensors"
        )
    idle = DEFAULT_IDLE_US
    if data.get("iterative_sequence"):
        raise ConfigError(f"{where}: sequence_batching.iterative_sequence is not supported")
    if "max_sequence_idle_microseconds" in data:
        idle = _int(
            _number(data["max_sequence_idle_microseconds"]),
            "sequence_batching.max_sequence_idle_microseconds",
            where,
            minimum=1,
        )
    raw = data.get("state", [])
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: sequence_batching.state must be a list of objects")
    states = []
    for i, entry in enumerate(raw):
        what = f"sequence_batching.state[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: {what} must be an object")
        _check_keys(entry, _STATE_KEYS, where, f"{what} ")
        names = [entry.get("input_name"), entry.get("output_name")]
        if not all(isinstance(n, str) and n for n in names):
            raise ConfigError(f"{where}: {what} needs input_name and output_name")
        initial = entry.get("initial_state")
        # Triton's field is repeated (one entry in practice); config.json may give the object.
        for one in initial if isinstance(initial, list) else [] if initial is None else [initial]:
            if not isinstance(one, dict):
                raise ConfigError(f"{where}: {what}.initial_state must be an object")
            _check_keys(one, _INITIAL_KEYS, where, f"{what}.initial_state ")
            if "data_file" in one:
                raise ConfigError(
                    f"{where}: {what}.initial_state.data_file is not supported; use zero_data, "
                    "or give the model's state input a default value"
                )
        states.append(
            StateConfig(
                str(names[0]),
                str(names[1]),
                _dtype(entry.get("data_type"), where, what),
                _dims(entry.get("dims"), where, what),
            )
        )
    return SequenceConfig(tuple(states), idle)


def _dtype(value: Any, where: str, what: str) -> np.dtype[Any] | None:
    if value is None:
        return None
    dtype = _NUMPY_OF_TRITON.get(value) if isinstance(value, str) else None
    if dtype is None:
        known = ", ".join(sorted(_NUMPY_OF_TRITON))
        raise ConfigError(f"{where}: {what}.data_type must be one of {known}, got {value!r}")
    return np.dtype(dtype)


def _dims(value: Any, where: str, what: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise ConfigError(f"{where}: {what}.dims must be a list of sizes, e.g. [64]")
    return tuple(_int(_number(d), f"{what}.dims", where, minimum=1) for d in value)


def _number(value: Any) -> Any:
    """protobuf's JSON writes 64-bit ints as strings ("64"): config.pbtxt's come that way."""
    return int(value) if isinstance(value, str) and value.isdigit() else value


# -- the plan: which tensors are state, and their initial values -----------------------------------


@dataclasses.dataclass(frozen=True)
class SequencePlan:
    """A stateful model version's state: what :class:`SequenceBatcher` feeds and reads back.

    Attributes:
        model: the model's name (for messages).
        inputs: state input name -> its initial value (one row on a batching model).
        outputs: state input name -> the output that gives its next value.
        batched: whether dim 0 of every tensor is the batch dim.
        max_idle_us: the idle time after which a sequence is freed.
    """

    model: str
    inputs: dict[str, np.ndarray]
    outputs: dict[str, str]
    batched: bool
    max_idle_us: int

    @property
    def state_outputs(self) -> frozenset[str]:
        return frozenset(self.outputs.values())

    def triton_config(self) -> dict[str, Any]:
        """``sequence_batching`` as Triton's config JSON shows it (``/config``, gRPC's
        ``ModelConfig``); dims after the batch dim on a batching model."""
        states = []
        for name, value in self.inputs.items():
            dtype = _TRITON_TYPES[datatype_of(value.dtype)]
            state: dict[str, Any] = {
                "input_name": name,
                "output_name": self.outputs[name],
                "data_type": dtype,
                "dims": list(value.shape),
            }
            if not value.any():
                zeros = {"data_type": dtype, "dims": list(value.shape), "zero_data": True}
                state["initial_state"] = [{**zeros, "name": "zeros"}]
            states.append(state)
        return {"max_sequence_idle_microseconds": self.max_idle_us, "state": states}

    def initial(self, rows: int) -> dict[str, np.ndarray]:
        """Fresh state for a sequence whose requests have ``rows`` rows."""
        if not self.batched:
            return {name: value.copy() for name, value in self.inputs.items()}
        return {
            name: np.repeat(value[np.newaxis], rows, axis=0) for name, value in self.inputs.items()
        }


def sequence_plan(session: Any, name: str, config: Any, batched: bool) -> SequencePlan | None:
    """The state of a model version (its config's ``sequence_batching``, else the ``state:*``
    naming convention); None when it has none and the config asks for no sequence batching.

    Args:
        session: one of its sessions (its ``model``: the graph, optional inputs included); in
            a worker process for an isolated model (a module-level function, so it gets there).
        name: the model's name.
        config: its :class:`~ferry.serving._config.ModelConfig`.
        batched: whether it runs with a batch dim (max_batch_size > 0).

    Raises:
        ModelLoadError: a declared state names no input or output of the model, or its shape
            has a variable dim that no ``dims`` fixes.
    """
    declared: SequenceConfig | None = config.sequence_batching
    if declared is None and not any(
        s.name.startswith(STATE_OUTPUT_PREFIX) for s in session.outputs
    ):
        return None
    graph = session.model.graph
    inputs = {v.name: v for v in graph.inputs}
    outputs = {v.name for v in graph.outputs}
    if declared is not None and declared.states:
        states = list(declared.states)
    else:
        states = [
            StateConfig(STATE_INPUT_PREFIX + o[len(STATE_OUTPUT_PREFIX) :], o)
            for o in sorted(outputs)
            if o.startswith(STATE_OUTPUT_PREFIX)
            and STATE_INPUT_PREFIX + o[len(STATE_OUTPUT_PREFIX) :] in inputs
        ]
    if declared is None and not states:
        return None
    initial: dict[str, np.ndarray] = {}
    for state in states:
        value = inputs.get(state.input_name)
        if value is None or state.output_name not in outputs:
            missing = state.input_name if value is None else state.output_name
            raise ModelLoadError(
                f"model {name!r}: sequence_batching's state names {missing!r}, which the model "
                f"does not have; its inputs are {', '.join(map(repr, inputs))} and its outputs "
                f"{', '.join(map(repr, sorted(outputs)))}"
            )
        initial[state.input_name] = _initial_value(name, state, value, graph, batched)
    return SequencePlan(
        name,
        initial,
        {s.input_name: s.output_name for s in states},
        batched,
        DEFAULT_IDLE_US if declared is None else declared.max_idle_us,
    )


def _initial_value(
    name: str, state: StateConfig, value: Any, graph: Any, batched: bool
) -> np.ndarray:
    """The model's default for the state input (an initializer that is also an input), else
    zeros of the declared or the model's dims; one row (no batch dim) on a batching model."""
    default = graph.initializers.get(state.input_name)
    if default is not None and default.const_value is not None:
        array = np.asarray(default.const_value.numpy())
        if state.dtype is not None:
            array = array.astype(state.dtype)
        return array[0] if batched and array.ndim and array.shape[0] == 1 else array
    dtype = state.dtype or (value.dtype.numpy() if value.dtype is not None else None)
    dims: Sequence[Any] | None = state.dims
    if dims is None and value.shape is not None:
        dims = list(value.shape)[1 if batched else 0 :]
    fixed = dims is not None and all(isinstance(d, int) and d >= 0 for d in dims)
    if dtype is None or not fixed:
        raise ModelLoadError(
            f"model {name!r}: state input {state.input_name!r} has no fixed shape and type "
            f"({list(dims) if dims is not None else 'unknown rank'}); declare its data_type and "
            "dims in the config's sequence_batching.state"
        )
    return np.zeros(tuple(int(d) for d in dims or ()), dtype=dtype)


def visible(
    plan: SequencePlan, specs: Sequence[Any], types: Mapping[str, str]
) -> tuple[list[Any], dict[str, str]]:
    """``specs`` and ``types`` without the state tensors: what clients send and receive."""
    hidden = set(plan.inputs) | plan.state_outputs
    return [s for s in specs if s.name not in hidden], {
        n: t for n, t in types.items() if n not in hidden
    }


# -- serving sequences -------------------------------------------------------------------------------


class _Sequence:
    """One sequence: its state, its rows, when it was last used, and the lock that runs its
    requests in arrival order (asyncio's lock wakes its waiters first come, first served)."""

    __slots__ = ("last_ns", "lock", "rows", "state", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.state: dict[str, np.ndarray] | None = None
        self.rows = 0
        self.users = 0  # requests holding or waiting for the lock: never expired meanwhile
        self.last_ns = time.monotonic_ns()


Run = Callable[
    [dict[str, np.ndarray], Sequence[str] | None, int, Mapping[str, Any]], Awaitable[BatchOutcome]
]


class SequenceBatcher:
    """Keeps each sequence's state and runs its requests in order through ``run``.

    Args:
        plan: the model version's state.
        run: runs one request (the dynamic batcher's ``submit``, or one call on a free
            instance): concurrent sequences batch there.
        on_count: called with the number of live sequences whenever it changes.
    """

    def __init__(
        self, plan: SequencePlan, run: Run, on_count: Callable[[int], None] | None = None
    ) -> None:
        self.plan = plan
        self._run = run
        self._on_count = on_count
        self._sequences: dict[int | str, _Sequence] = {}
        self._expired: collections.OrderedDict[int | str, None] = collections.OrderedDict()
        self._idle_ns = plan.max_idle_us * 1000
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def active(self) -> int:
        """Sequences holding state."""
        return len(self._sequences)

    def start(self) -> None:
        """Start freeing idle sequences (on the running event loop)."""
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_loop())

    async def close(self) -> None:
        """Stop freeing idle sequences and drop every state."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        self._sequences.clear()
        self._counted()

    async def _sweep_loop(self) -> None:
        # Half the idle time apart: a sequence is freed at most 1.5x its idle time after its
        # last request, and a request checks its own sequence's age anyway.
        while True:
            await asyncio.sleep(max(self._idle_ns / 2e9, 0.001))
            self._sweep(time.monotonic_ns())

    def _sweep(self, now: int) -> None:
        stale = [
            key
            for key, seq in self._sequences.items()
            if not seq.users and now - seq.last_ns > self._idle_ns
        ]
        for key in stale:
            del self._sequences[key]
            self._expired[key] = None
            if len(self._expired) > _REMEMBERED_EXPIRED:
                self._expired.popitem(last=False)
        if stale:
            self._counted()

    def _counted(self) -> None:
        if self._on_count is not None:
            self._on_count(len(self._sequences))

    async def submit(
        self,
        feeds: dict[str, np.ndarray],
        outputs: Sequence[str] | None,
        size: int,
        parameters: Mapping[str, Any],
    ) -> BatchOutcome:
        """Run one request of a sequence, with the state the sequence's last request left.

        Raises:
            InvalidInputError: no or a bad ``sequence_id``, an unknown or expired sequence
                without ``sequence_start``, a batch size the sequence did not start with.
        """
        key, start, end = self._control(parameters)
        now = time.monotonic_ns()
        seq = self._sequences.get(key)
        if seq is not None and not seq.users and now - seq.last_ns > self._idle_ns:
            self._sweep(now)
            seq = None
        if seq is None:
            if not start:
                raise InvalidInputError(self._unknown(key))
            seq = self._sequences[key] = _Sequence()
            self._expired.pop(key, None)
            self._counted()
        seq.users += 1
        try:
            async with seq.lock:
                return await self._step(key, seq, feeds, outputs, size, (start, end), parameters)
        finally:
            seq.users -= 1
            seq.last_ns = time.monotonic_ns()

    async def _step(
        self,
        key: int | str,
        seq: _Sequence,
        feeds: dict[str, np.ndarray],
        outputs: Sequence[str] | None,
        size: int,
        flags: tuple[bool, bool],
        parameters: Mapping[str, Any],
    ) -> BatchOutcome:
        plan = self.plan
        start, end = flags
        if self._sequences.get(key) is not seq:  # ended (or expired) before this request ran
            if not start:
                raise InvalidInputError(self._unknown(key))
            self._sequences[key] = seq
            self._counted()
        if start or seq.state is None:
            if not start:
                raise InvalidInputError(self._unknown(key))
            state, rows = plan.initial(size), size
        elif plan.batched and size != seq.rows:
            raise InvalidInputError(
                f"sequence {key!r} of model {plan.model!r} started with a batch of {seq.rows}; "
                f"this request has {size}: every request of a sequence has the same batch size"
            )
        else:
            state, rows = seq.state, seq.rows
        wanted = None if outputs is None else [*outputs, *plan.outputs.values()]
        try:
            outcome = await self._run({**feeds, **state}, wanted, size, parameters)
        except BaseException:
            # Refused or failed: the state stays as it was; a start that never ran starts nothing.
            if seq.state is None and self._sequences.get(key) is seq:
                del self._sequences[key]
                self._counted()
            raise
        seq.rows = rows
        # The outputs are views of the whole batch's: copy the rows kept past this request.
        seq.state = {
            name: np.array(outcome.outputs[out], copy=True) for name, out in plan.outputs.items()
        }
        if end:
            del self._sequences[key]
            self._counted()
        hidden = plan.state_outputs
        outcome.outputs = {n: a for n, a in outcome.outputs.items() if n not in hidden}
        return outcome

    def _unknown(self, key: int | str) -> str:
        model = self.plan.model
        if key in self._expired:
            return (
                f"sequence {key!r} of model {model!r} expired: no request came for "
                f"{self.plan.max_idle_us} us (max_sequence_idle_microseconds), so its state was "
                "freed; start it again with sequence_start=true"
            )
        return (
            f"sequence {key!r} of model {model!r} is not active (never started, or ended); send "
            "its first request with sequence_start=true"
        )

    def _control(self, parameters: Mapping[str, Any]) -> tuple[int | str, bool, bool]:
        """``(sequence_id, start, end)`` from a request's parameters."""
        model = self.plan.model
        key = parameters.get("sequence_id")
        if key is None or key == 0 or key == "":
            raise InvalidInputError(
                f"model {model!r} is stateful (sequence batching): send the request parameter "
                "sequence_id (a non-zero integer or a string), with sequence_start=true on a "
                "sequence's first request and sequence_end=true on its last"
            )
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise InvalidInputError(
                f"parameter sequence_id must be a non-zero integer or a string, got {key!r}"
            )
        flags = []
        for flag in ("sequence_start", "sequence_end"):
            value = parameters.get(flag, False)
            if not isinstance(value, bool):
                raise InvalidInputError(f"parameter {flag} must be true or false, got {value!r}")
            flags.append(value)
        return key, flags[0], flags[1]
