"""OpenVINO on the CPU: ONNX partitions read by OpenVINO's ONNX frontend and compiled by its CPU plugin.

Precision is a choice, not an accident: OpenVINO runs f32 models in bf16 on CPUs with bf16 units
unless told otherwise, so ferry always sets ``INFERENCE_PRECISION_HINT`` (f32 unless the partition's
``precision`` option asks for ``bf16`` or ``fp16``) and ``PERFORMANCE_HINT`` LATENCY, plus
``INFERENCE_NUM_THREADS`` from the ``threads`` option.

Which nodes OpenVINO takes is asked of OpenVINO itself (``capability``, ``validate``): how is
``_openvino_query``'s job, mapping OpenVINO's ops back to ONNX nodes by name.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from ferry.backends._api import CompiledPartition, CompileSpec
from ferry.backends._base import BackendBase, exchangeable, model_source
from ferry.backends._kv import KVLayout
from ferry.backends._lifecycle import DeviceInfo, device_kind
from ferry.backends._openvino_kv import OpenVINOKVRunner, stateful_model
from ferry.backends._openvino_query import (
    DEVICE,
    candidate_model,
    engine_rejects,
    first_line,
    ov_core,
)
from ferry.backends._rules import OpRule, RuleTable, all_checks
from ferry.errors import ExecutionError, InvalidInputError, ModelLoadError
from ferry.graph import dtype_name

__all__ = ["OpenVINOBackend", "OpenVINOPartition", "compile_config", "rules_from_data"]

logger = logging.getLogger(__name__)

#: ferry's precision names -> OpenVINO's ``INFERENCE_PRECISION_HINT`` values.
PRECISION_HINTS = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}


class OpenVINOBackend(BackendBase):
    """OpenVINO's CPU plugin."""

    name = "openvino"
    device = "cpu"
    precisions = ("fp32", "bf16", "fp16")
    sdk = "openvino"
    extra = "openvino"
    #: Its Parameters need a rank: no tensor of unknown rank may come to it from another engine.
    ranked_inputs = True
    #: It computes shape subgraphs (Shape -> Gather -> Concat -> Reshape) itself, folding what is
    #: static: they go with their consumers instead of forming islands on ONNX Runtime.
    computes_shapes = True

    def rules(self) -> Sequence[OpRule]:
        return _rules()

    def devices(self) -> list[DeviceInfo]:
        """Every device OpenVINO finds (``Core().available_devices``), with its full name and
        optimization capabilities; ferry compiles for the CPU."""
        if not self.available():
            return []
        core = ov_core()
        found = []
        for device in core.available_devices:
            properties = {}
            for key in ("FULL_DEVICE_NAME", "OPTIMIZATION_CAPABILITIES"):
                try:
                    value = core.get_property(device, key)
                except Exception:  # a plugin that does not report it: leave it out
                    continue
                text = value if isinstance(value, str) else ", ".join(map(str, value))
                properties[key.lower()] = text
            found.append(DeviceInfo(str(device).lower(), device_kind(str(device)), properties))
        return found

    def runs_in(self, precision: str) -> str:
        """fp16 is a hint the CPU plugin follows only with fp16 units: without them it runs bf16
        (where the CPU has it), else fp32 (``OPTIMIZATION_CAPABILITIES``; measured here: an fp16
        hint compiles to bf16)."""
        if precision not in ("fp16", "bf16"):
            return precision
        try:
            found = set(ov_core().get_property(DEVICE, "OPTIMIZATION_CAPABILITIES"))
        except Exception:  # an SDK that cannot say: take the hint at its word
            return precision
        wanted = {"fp16": "FP16", "bf16": "BF16"}[precision]
        if wanted in found:
            return precision
        return "bf16" if "BF16" in found else "fp32"

    def capability(self, model: ir.Model, nodes: Sequence[str]) -> dict[str, bool | str]:
        """Which of ``nodes`` OpenVINO takes, asked of OpenVINO itself on the whole model.

        The generated rule table (what ONNX's node tests showed) answers only where it knows of a
        problem: an op excluded for wrong results, an attribute or input it computes wrongly,
        float64 (computed in f32), tensors of types ferry cannot exchange. Everything else is
        offered to the engine, the whole model at once, the way OpenVINO's HETERO plugin uses
        ``query_model``: the table's opset ranges and dtype sets only record what the tests
        covered, and a model with Resize at opset 11 or a dynamic ConvTranspose runs fine.
        """
        table = _known_problems()
        opsets = model.opset_imports
        by_name = {node.name: node for node in model.graph}
        verdicts: dict[str, bool | str] = {}
        asked = []
        for name in nodes:
            verdict = table.supports(by_name[name], opsets)
            verdicts[name] = verdict
            if verdict is True:
                asked.append(name)
        for name, why in engine_rejects(model, asked).items():
            verdicts[name] = f"vetoed by openvino: {why}"
        return verdicts

    def validate(self, model: ir.Model, nodes: Sequence[str]) -> dict[str, str]:
        """Which of ``nodes`` OpenVINO rejects, asked about them cut out as a model of their own
        (so that what other engines run does not spoil the answer); see
        ``_openvino_query.engine_rejects``."""
        if not nodes:
            return {}
        return engine_rejects(candidate_model(model, nodes) or model, nodes)

    def compile(self, spec: CompileSpec) -> OpenVINOPartition:
        config = compile_config(spec.options)
        core = ov_core()
        # The prepared model, not the file it came from: it is what placement asked OpenVINO
        # about, and its inferred types are what the frontend needs for some ops (a Loop whose
        # body reads outer values converts with them and fails without).
        with model_source(spec.model) as (data, file):
            try:
                ov_model = core.read_model(data if data is not None else str(file))
            except Exception as e:
                raise ModelLoadError(
                    f"OpenVINO could not read the model: {first_line(e)}; run the unsupported "
                    "nodes on another backend (ferry's partitioner asks OpenVINO which they are)"
                ) from e
            try:
                compiled = core.compile_model(ov_model, DEVICE, config)
            except Exception as e:
                raise ModelLoadError(
                    f"OpenVINO's CPU plugin could not compile the model: {first_line(e)}"
                ) from e
        return OpenVINOPartition(spec, compiled, config)

    def kv_runner(self, compiled: CompiledPartition, layout: KVLayout) -> OpenVINOKVRunner | None:
        """The stateful model: the cache kept in OpenVINO's state variables."""
        if not isinstance(compiled, OpenVINOPartition):
            return None
        return OpenVINOKVRunner(compiled.stateful(layout), layout)

    def load(self, blob: bytes, spec: CompileSpec) -> OpenVINOPartition:
        config = compile_config(spec.options)
        try:
            compiled = ov_core().import_model(io.BytesIO(blob), DEVICE, config)
        except Exception as e:
            raise ModelLoadError(
                f"OpenVINO could not import the cached compiled model: {first_line(e)}; "
                "clear the engine cache to compile it again"
            ) from e
        return OpenVINOPartition(spec, compiled, config)


def compile_config(options: Mapping[str, Any]) -> dict[str, str]:
    """OpenVINO compile properties for ferry's options (``precision``, ``threads``).

    Raises:
        InvalidInputError: ``precision`` is not one of the backend's precisions, or ``threads`` is
            not a positive integer.
    """
    precision = options.get("precision") or "fp32"
    hint = PRECISION_HINTS.get(str(precision))
    if hint is None:
        raise InvalidInputError(
            f"openvino: precision {precision!r} is not supported; "
            f"choose one of {', '.join(PRECISION_HINTS)}"
        )
    config = {"INFERENCE_PRECISION_HINT": hint, "PERFORMANCE_HINT": "LATENCY"}
    threads = options.get("threads")
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise InvalidInputError(
                f"openvino: threads must be a positive integer, got {threads!r}"
            )
        config["INFERENCE_NUM_THREADS"] = str(threads)
    return config


class OpenVINOPartition:
    """A partition compiled by OpenVINO's CPU plugin.

    ``run`` may be called from several threads at once: each call borrows an infer request from a
    free list (OpenVINO's requests are not thread-safe) and creates one when none is free, so there
    are as many requests as calls ever ran at the same time.
    """

    def __init__(self, spec: CompileSpec, compiled: Any, config: Mapping[str, str]) -> None:
        self.spec = spec
        self.compiled = compiled
        self.config = dict(config)
        graph = spec.model.graph
        inputs = [v for v in graph.inputs if v.name not in graph.initializers]
        input_names = [v.name or "" for v in inputs]
        self.output_names = [v.name or "" for v in graph.outputs]
        in_ports = _match_ports(inputs, compiled.inputs, "input")
        # Inputs OpenVINO dropped (unused once converted) are accepted and ignored.
        self._in_index = {name: index for index, name in in_ports.items()}
        dropped = [n for n in input_names if n not in self._in_index]
        if dropped:
            logger.debug("openvino: inputs %s are unused by the compiled model", dropped)
        out_ports = _match_ports(list(graph.outputs), compiled.outputs, "output")
        self._out_index = {name: index for index, name in out_ports.items()}
        missing = [n for n in self.output_names if n not in self._out_index]
        if missing:
            raise ModelLoadError(
                f"OpenVINO's compiled model has no output for {missing}; its outputs are "
                f"{[sorted(o.get_names()) for o in compiled.outputs]}"
            )
        self._free: list[Any] = [compiled.create_infer_request()]
        self._stateful: dict[tuple[tuple[str, ...], tuple[str, ...]], Any] = {}
        import openvino as ov

        self._tensor = ov.Tensor
        #: The precision OpenVINO actually runs in (``f32``, ``bf16``, ``f16``): the hint is a wish.
        self.inference_precision = _type_name(compiled.get_property("INFERENCE_PRECISION_HINT"))
        wished = self.config["INFERENCE_PRECISION_HINT"]
        if self.inference_precision != wished:
            logger.info(
                "openvino: asked for %s, the CPU plugin runs in %s",
                wished,
                self.inference_precision,
            )

    def stateful(self, layout: KVLayout) -> Any:
        """This partition compiled again as a stateful decoder (once per cache layout)."""
        key = (layout.past, layout.present)
        if key not in self._stateful:
            with model_source(self.spec.model) as (data, file):
                source = data if data is not None else str(file)
                self._stateful[key] = stateful_model(ov_core(), source, layout, self.config)
        return self._stateful[key]

    def run(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        names = self.output_names if outputs is None else outputs
        index = self._in_index
        if any(v.dtype.char in _DTYPE_ALIASES for v in inputs.values()):
            inputs = {n: _canonical(v) for n, v in inputs.items()}
        try:
            request = self._free.pop()
        except IndexError:  # every request is busy in another thread
            request = self.compiled.create_infer_request()
        try:
            try:
                if all(
                    type(v) is np.ndarray
                    and v.dtype.kind in "biuf"
                    and v.flags.c_contiguous
                    and v.flags.writeable  # OpenVINO wraps only writeable buffers
                    for v in inputs.values()
                ):
                    # Plain numeric arrays: wrap them as OpenVINO tensors without a copy (the call
                    # is synchronous) and run; 25-30% less per call than infer(dict) on small
                    # models (benchmarks/backends.py).
                    for name, value in inputs.items():
                        port = index.get(name)
                        if port is not None:
                            request.set_input_tensor(port, self._tensor(value, shared_memory=True))
                    request.infer()
                else:  # strings, bfloat16 (ml_dtypes), strided views: OpenVINO's own conversion
                    feeds = {index[n]: v for n, v in inputs.items() if n in index}
                    request.infer(feeds, share_inputs=True, share_outputs=True)
            except Exception as e:
                raise ExecutionError(f"OpenVINO failed to run the model: {first_line(e)}") from e
            try:
                return {
                    name: _array(request.get_output_tensor(self._out_index[name])) for name in names
                }
            except KeyError as e:
                raise ExecutionError(
                    f"openvino: no output named {e.args[0]!r}; outputs are {self.output_names}"
                ) from None
        finally:
            self._free.append(request)

    def serialize(self) -> bytes:
        blob = self.compiled.export_model()
        # export_model gives bytes in older releases and a BytesIO in newer ones.
        return bytes(blob.getvalue() if hasattr(blob, "getvalue") else blob)


# ---------------------------------------------------------------------------------------------
# Rules


@functools.cache
def _rules() -> tuple[OpRule, ...]:
    from ferry.backends._openvino_rules import RULES

    return rules_from_data(RULES)


#: Element types ferry exchanges with OpenVINO with their values intact (not float64: the CPU
#: plugin computes it in f32; not float8, int4: no numpy type its API returns). bfloat16: the
#: CPU plugin computes a bf16 graph in bf16 (a choice the model made: ``ferry quantize
#: --precision bf16``), and its outputs are read back bit for bit (:func:`_array`).
_EXCHANGEABLE = frozenset(
    {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}
    | {"float16", "float32", "bfloat16"}
)
# Reasons the generated table gives for leaving an op out that record a lack of test coverage,
# not a problem: such ops are offered to the engine.
_UNTESTED = ("passes only with element types ferry cannot exchange",)


@functools.cache
def _known_problems() -> RuleTable:
    """What is known to be wrong on OpenVINO, as rules (see ``capability``).

    Every op the measured table or the problem list names gets rules that carry only the problem
    list's limits (``_openvino_problems``: an attribute value or input computed wrongly, a form
    that does not convert) plus the check every node passes here (tensors of exchangeable
    types); an op excluded for a problem is refused; any other op is left to the engine.
    """
    from ferry.backends._openvino_problems import OVERRIDES, narrow, op_schema
    from ferry.backends._openvino_rules import EXCLUDED, RULES

    ops = {(e.get("domain", ""), e["op"]) for e in RULES} | {
        ("", label) if "." not in label else tuple(label.rsplit(".", 1)) for label in OVERRIDES
    }
    rules: list[OpRule] = []
    for domain, op in sorted(ops):
        label = op if domain == "" else f"{domain}.{op}"
        override = dict(OVERRIDES.get(label, {}))
        if "exclude" in override:
            continue
        check: Callable[[ir.Node], bool | str] = _exchangeable
        if op == "MaxPool":
            # The problem is only a last window that starts in the padding: see the check.
            override.pop("attrs", None)
            check = all_checks(_exchangeable, _ceil_windows_inside)
        schema = op_schema(domain, op, 10**3)
        for variant in override.pop("variants", [{}]):
            limits = narrow({"op": op, "domain": domain, "inputs": {}}, override | variant, schema)
            (rule,) = rules_from_data([{**limits, "since": limits.get("since", 1), "until": None}])
            rules.append(dataclasses.replace(rule, check=all_checks(rule.check, check)))
    problems = {
        label: why for label, why in EXCLUDED.items() if not any(u in why for u in _UNTESTED)
    }
    return RuleTable(rules, fallback=_engine_decides(problems))


_exchangeable = exchangeable(_EXCHANGEABLE, "OpenVINO does not compute exactly")


def _ceil_windows_inside(node: ir.Node) -> bool | str:
    """MaxPool with ``ceil_mode``: OpenVINO keeps a last window that starts in the end padding
    (ONNX drops it), so it is refused unless the input's shape shows no such window."""
    from ferry.backends._rules import attr

    if not attr(node, "ceil_mode", 0):
        return True
    x = node.inputs[0]
    shape = x.shape if x is not None else None
    kernel = attr(node, "kernel_shape", ())
    if shape is None or len(shape) != len(kernel) + 2:
        return "ceil_mode with an input of unknown shape: a last window could start in the padding"
    strides = attr(node, "strides", None) or (1,) * len(kernel)
    dilations = attr(node, "dilations", None) or (1,) * len(kernel)
    pads = attr(node, "pads", None) or (0,) * (2 * len(kernel))
    if attr(node, "auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        return "ceil_mode with auto_pad: a last window could start in the padding"
    for axis, size in enumerate(shape[2:]):
        if not isinstance(size, int):
            return "ceil_mode with a dynamic spatial dim: a last window could start in the padding"
        begin = pads[axis]
        span = size + begin + pads[axis + len(kernel)] - ((kernel[axis] - 1) * dilations[axis] + 1)
        out = -(-span // strides[axis]) + 1  # ceil
        if (out - 1) * strides[axis] >= size + begin:
            return "ceil_mode: the last window starts in the padding, which OpenVINO keeps"
    return True


def _engine_decides(problems: Mapping[str, str]) -> Callable[[ir.Node], bool | str]:
    """For an op no rule names: refused when excluded for a problem, else left to the engine
    (after the check every node passes: tensors of exchangeable types)."""

    def verdict(node: ir.Node) -> bool | str:
        full = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        if full in problems:
            return f"{full} is not taken: {problems[full]}"
        return _exchangeable(node)

    return verdict


def rules_from_data(data: Iterable[Mapping[str, Any]]) -> tuple[OpRule, ...]:
    """OpRules from the generated table in ``_openvino_rules`` (see its key legend)."""
    rules = []
    for entry in data:
        inputs = {int(i): frozenset(types) for i, types in entry.get("inputs", {}).items()}
        outputs = {int(i): frozenset(types) for i, types in entry.get("outputs", {}).items()}
        rules.append(
            OpRule(
                op_type=entry["op"],
                domain=entry.get("domain", ""),
                since=entry["since"],
                until=entry["until"],
                dtypes=inputs,
                const_inputs=tuple(entry.get("const", ())),
                max_rank=entry.get("max_rank"),
                dynamic_dims=entry.get("dynamic", True),
                check=_NodeCheck(
                    outputs,
                    entry.get("attrs", {}),
                    tuple(entry.get("absent", ())),
                    bool(entry.get("nonempty", False)),
                ),
            )
        )
    return tuple(rules)


class _NodeCheck:
    """What OpRule's own fields do not cover: tensor-only inputs and outputs, output dtypes,
    attribute values, inputs that must be left out, and zero-size inputs."""

    def __init__(
        self,
        outputs: Mapping[int, frozenset[str]],
        attrs: Mapping[str, Mapping[str, Any]],
        absent: tuple[int, ...],
        nonempty: bool,
    ) -> None:
        self.outputs = outputs
        self.attrs = attrs
        self.absent = absent
        self.nonempty = nonempty

    def __call__(self, node: ir.Node) -> bool | str:
        for kind, values in (("input", node.inputs), ("output", node.outputs)):
            for i, value in enumerate(values):
                # OpenVINO's Python API exchanges tensors only: no sequences or optionals.
                if value is not None and not isinstance(value.type, (ir.TensorType, type(None))):
                    return f"{kind} {i} is a {value.type}, not a tensor"
        for i, value in enumerate(node.outputs):
            allowed = self.outputs.get(i)
            if allowed is not None and value.dtype is not None:
                name = dtype_name(value.dtype)
                if name not in allowed:
                    return f"output {i} has dtype {name}; supported: {', '.join(sorted(allowed))}"
        for i in self.absent:
            present = node.inputs[i] if i < len(node.inputs) else None
            if present is not None:
                return f"input {i} ({present.name}) is not supported; it must be left out"
        if self.nonempty:
            for i, value in enumerate(node.inputs):
                if value is not None and value.shape is not None and 0 in value.shape:
                    return f"input {i} is empty (a zero-size dim): OpenVINO's result differs"
        for name, limit in self.attrs.items():
            attr = node.attributes.get(name)
            raw: Any = limit.get("default") if attr is None else attr.value
            setting = tuple(raw) if isinstance(raw, Sequence) and not isinstance(raw, str) else raw
            if "allow" in limit and setting not in limit["allow"]:
                return f"attribute {name}={setting!r} is not supported (supported: {list(limit['allow'])})"
            if setting in limit.get("deny", ()):
                return f"attribute {name}={setting!r} is not supported"
        return True


def _match_ports(values: Sequence[ir.Value], ports: Sequence[Any], kind: str) -> dict[int, str]:
    """Which ONNX value each OpenVINO port carries: by tensor name, else by type, in order.

    OpenVINO keeps ONNX names on ports, with one exception: when a graph input is passed straight
    to an output (Identity, Dropout in inference), the input's port takes the output's name, and
    inputs left unused are dropped. Ports no name matches are paired, in order, with the values no
    port matched whose element type and rank fit; when that is ambiguous, nothing is guessed.
    """
    index: dict[int, str] = {}
    taken: set[str] = set()
    for i, port in enumerate(ports):
        port_names = port.get_names()
        for value in values:
            name = value.name or ""
            if name in port_names and name not in taken:
                index[i] = name
                taken.add(name)
                break
    spare = [v for v in values if (v.name or "") not in taken]
    for i, port in enumerate(ports):
        if i in index:
            continue
        fitting = [v for v in spare if _port_fits(port, v)]
        if len(spare) != 1 and len(fitting) != 1:
            raise ModelLoadError(
                f"cannot tell which ONNX {kind} OpenVINO's {kind} {sorted(port.get_names())} "
                f"stands for; unmatched ONNX {kind}s: {[v.name for v in spare]}"
            )
        chosen = spare[0] if len(spare) == 1 else fitting[0]
        index[i] = chosen.name or ""
        # Values before the chosen one can no longer pair with a later port: order is kept.
        spare = spare[spare.index(chosen) + 1 :]
    return index


def _port_fits(port: Any, value: ir.Value) -> bool:
    """Whether an OpenVINO port could carry ``value``: same element type and rank, when known."""
    if value.dtype is not None:
        try:
            if port.get_element_type().to_dtype() != np.dtype(value.dtype.numpy()):
                return False
        except (TypeError, ValueError, RuntimeError):
            pass  # a type one side cannot express in numpy: do not rule it out on that
    rank = port.get_partial_shape().rank
    return value.shape is None or rank.is_dynamic or rank.get_length() == len(value.shape)


#: numpy spells 64-bit integers two ways (``longlong`` 'q', which ONNX Runtime's results have,
#: and ``int64`` 'l' on Linux); they compare equal, but OpenVINO's Python API knows only the
#: latter: "Unsupported data type: int64".
_DTYPE_ALIASES = {
    np.dtype(alias).char: np.dtype(canonical)
    for alias, canonical in ((np.longlong, np.int64), (np.ulonglong, np.uint64))
    if np.dtype(alias).char != np.dtype(canonical).char
}


def _array(tensor: Any) -> np.ndarray:
    """An output tensor as a numpy array of its own: bf16 as ml_dtypes' bfloat16 (OpenVINO's
    ``.data`` shows bf16 bits as float16, which reads them as other numbers)."""
    data = np.array(tensor.data)
    if tensor.element_type.get_type_name() == "bf16":
        import ml_dtypes

        return data.view(np.uint16).view(ml_dtypes.bfloat16)
    return data


def _canonical(value: np.ndarray) -> np.ndarray:
    """``value`` viewed with the dtype spelling OpenVINO knows (no copy)."""
    canonical = _DTYPE_ALIASES.get(value.dtype.char)
    return value if canonical is None else value.view(canonical)


def _type_name(value: Any) -> str:
    """OpenVINO's short name for an element type (``f32``), from a Type or its string."""
    name = getattr(value, "get_type_name", None)
    if callable(name):
        return str(name())
    return str(value)
