"""TFLite resource variables (the state of streaming models) as explicit inputs and outputs.

A stateful TFLite model keeps tensors between invocations in resource variables: ``VAR_HANDLE``
names a variable, ``READ_VARIABLE`` reads it, ``ASSIGN_VARIABLE`` writes it, and a ``CALL_ONCE``
op runs an init subgraph (once per interpreter) that assigns the initial values. ONNX has no
state, so the converted model takes each variable's value as an input and returns its new value
as an output, the way ONNX Runtime users run streaming models (a recurrent decoder's past
states, a streaming VAD's state) by feeding the outputs back on the next call.

Before -> After::

    VAR_HANDLE(v); READ_VARIABLE(v) -> x; ...; ASSIGN_VARIABLE(v, y)   (CALL_ONCE init: v = c)
        -> graph input ``state:v`` (default: c, an initializer that is also an input, so that a
           first call may leave it out) feeding x; graph output ``state_out:v`` = y

Values are the stored numbers: an int8 variable is an int8 input and output (LiteRT copies the
bytes), read with the quantization of the tensor that reads it. A variable the init subgraph
does not assign starts at zeros, as in a fresh LiteRT interpreter.

:func:`find_state` reads this off the model once; the translators (``_ops*``) and the LiteRT
reference (``ferry.converters._tflite.reference``) both follow it, so that they agree on names
and order.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ferry._state_names import STATE_INPUT_PREFIX, STATE_OUTPUT_PREFIX
from ferry.tflite._schema import TFLITE_DTYPES, TFLiteModel, TFLiteSubgraph

__all__ = [
    "STATE_INPUT_PREFIX",
    "STATE_OPS",
    "STATE_OUTPUT_PREFIX",
    "State",
    "Variable",
    "find_state",
]

#: The ops that handle resource variables; none is left in the converted graph.
STATE_OPS = frozenset({"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "CALL_ONCE"})


@dataclasses.dataclass
class Variable:
    """One resource variable of subgraph 0.

    Attributes:
        name: ``shared_name`` (``container/shared_name`` when the container is set).
        read: the tensor of the first READ_VARIABLE before any ASSIGN_VARIABLE: its value comes
            from the state input. None when the call never reads the value it starts with.
        assigned: the tensor the last ASSIGN_VARIABLE writes: the state output. None when the
            call never writes the variable.
        initial: the stored value the init subgraph assigns; None when it assigns none (zeros).
    """

    name: str
    read: int | None = None
    assigned: int | None = None
    initial: np.ndarray | None = None

    @property
    def input_name(self) -> str:
        return STATE_INPUT_PREFIX + self.name

    @property
    def output_name(self) -> str:
        return STATE_OUTPUT_PREFIX + self.name

    def default(self, sg: TFLiteSubgraph) -> np.ndarray:
        """The value a fresh interpreter starts from: the init subgraph's, else zeros."""
        if self.read is None:
            raise ValueError(f"variable {self.name!r} is not read")  # callers check first
        if self.initial is not None:
            return self.initial
        t = sg.tensors[self.read]
        return np.zeros(tuple(max(d, 1) for d in t.shape), dtype=TFLITE_DTYPES[t.type])


@dataclasses.dataclass
class State:
    """The resource variables of a model's subgraph 0 and how its ops use them.

    Attributes:
        variables: in the order subgraph 0 first names them.
        handles: subgraph-0 tensor made by a VAR_HANDLE -> its variable.
        aliases: READ_VARIABLE output -> the tensor whose value it reads (the state input's
            tensor, or the tensor last assigned), for every read but the first of each variable.
        problems: op index (subgraph 0) -> why the op cannot be converted.
        init_subgraphs: the subgraphs CALL_ONCE runs (not converted: their work is ``initial``).
    """

    variables: list[Variable] = dataclasses.field(default_factory=list)
    handles: dict[int, Variable] = dataclasses.field(default_factory=dict)
    aliases: dict[int, int] = dataclasses.field(default_factory=dict)
    problems: dict[int, str] = dataclasses.field(default_factory=dict)
    init_subgraphs: set[int] = dataclasses.field(default_factory=set)

    @property
    def inputs(self) -> list[Variable]:
        """Variables whose value at the start of a call is read: one state input each."""
        return [v for v in self.variables if v.read is not None]

    @property
    def outputs(self) -> list[Variable]:
        """Variables a call writes: one state output each."""
        return [v for v in self.variables if v.assigned is not None]


def find_state(model: TFLiteModel) -> State:
    """The resource variables of ``model``'s subgraph 0, walked in execution order."""
    sg = model.subgraphs[0]
    state = State()
    by_name: dict[str, Variable] = {}
    current: dict[str, int] = {}  # variable -> the tensor holding its value so far
    calls: list[tuple[int, int]] = []  # (CALL_ONCE op, init subgraph)
    for op in sg.operators:
        if op.opcode == "VAR_HANDLE":
            name = _variable_name(op.options, sg, op.outputs)
            if name not in by_name:
                by_name[name] = Variable(name)
                state.variables.append(by_name[name])
            for out in op.outputs:
                if out >= 0:
                    state.handles[out] = by_name[name]
        elif op.opcode in ("READ_VARIABLE", "ASSIGN_VARIABLE"):
            handle = op.inputs[0] if op.inputs else -1
            variable = state.handles.get(handle)
            if variable is None:
                state.problems[op.index] = (
                    "it reaches a resource that no VAR_HANDLE of the main subgraph makes (passed "
                    "in as an input); ferry converts variables named by VAR_HANDLE"
                )
                continue
            if op.opcode == "READ_VARIABLE":
                out = op.outputs[0]
                if variable.name in current:
                    state.aliases[out] = current[variable.name]
                else:
                    variable.read = out
                    current[variable.name] = out
            elif len(op.inputs) > 1 and op.inputs[1] >= 0:
                variable.assigned = op.inputs[1]
                current[variable.name] = op.inputs[1]
        elif op.opcode == "CALL_ONCE":
            calls.append((op.index, int(op.options.get("init_subgraph_index", -1))))
    # CALL_ONCE comes first in the file; its subgraphs are read after the main one so that the
    # variables keep the main subgraph's order.
    for op_index, index in calls:
        if not 0 < index < len(model.subgraphs):
            state.problems[op_index] = f"it runs subgraph {index}, which the model lacks"
            continue
        state.init_subgraphs.add(index)
        why = _initial_values(model.subgraphs[index], by_name)
        if why:
            state.problems[op_index] = why
    return state


def _initial_values(init: TFLiteSubgraph, by_name: dict[str, Variable]) -> str | None:
    """Record the constants ``init`` assigns to variables; the reason it cannot be read, if so."""
    handles: dict[int, str] = {}
    for op in init.operators:
        if op.opcode == "VAR_HANDLE":
            for out in op.outputs:
                handles[out] = _variable_name(op.options, init, op.outputs)
        elif op.opcode == "ASSIGN_VARIABLE":
            name = handles.get(op.inputs[0]) if op.inputs else None
            if name is None or len(op.inputs) < 2:
                return f"its init subgraph {init.index} assigns a resource no VAR_HANDLE names"
            t = init.tensors[op.inputs[1]]
            if t.data is None or t.sparsity is not None:
                return (
                    f"its init subgraph {init.index} computes the initial value of variable "
                    f"{name!r} with ops; ferry reads initial values that are constants"
                )
            variable = by_name.get(name)
            if variable is not None:  # else initialised but never used by the main subgraph
                variable.initial = np.array(t.data)
    # Other ops compute values; those that are assigned were checked to be constants above.
    return None


def _variable_name(options: dict[str, object], sg: TFLiteSubgraph, outputs: tuple[int, ...]) -> str:
    shared = str(options.get("shared_name") or "")
    if not shared and outputs and outputs[0] >= 0:
        shared = sg.tensors[outputs[0]].name  # an unnamed variable: its handle's tensor
    container = str(options.get("container") or "")
    return f"{container}/{shared}" if container else shared
