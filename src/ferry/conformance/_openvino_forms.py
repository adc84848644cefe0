"""The OpenVINO rule generator's experiments: forms of ONNX's single-node cases, each run once.

Every single-node case (from :mod:`ferry.conformance._cases`) runs in up to four forms at its own
opset: as written (every input a graph input, static shapes), with every input but the first made
an initializer ("const"), and both of those with every graph-input dim symbolic ("dyn"); cases
with float32 tensors run those forms again with them made float16 ("f16"). Each case is also
re-stamped to the op's earlier versions (7 and up) where ``onnx.checker`` accepts it, and run
there against ONNX Runtime (ONNX's expected outputs hold for the opset they were made at).

A form passes when ``OpenVINOBackend.validate`` keeps the node and the compiled partition's
outputs equal the reference (``ferry.parity``, strict: same dtype and shape, values within the
case's tolerance raised to 1e-3 / 1e-5 at least, 1e-2 / 1e-3 for float16 and ml_dtypes).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from ferry.conformance._cases import ConformanceCase, collect_cases
from ferry.conformance._compare import compare_output, mismatch_text

__all__ = [
    "DOMAINS",
    "MIN_OPSET",
    "Form",
    "build_form",
    "case_opset",
    "effective_version",
    "forms_of",
    "has_empty_input",
    "op_versions",
    "prepared",
    "run_form",
    "single_node_cases",
]

#: Older opsets are not tried: ONNX Runtime does not run them either.
MIN_OPSET = 7
#: The domains whose single-node cases are run.
DOMAINS = ("", "ai.onnx.ml", "ai.onnx.preview")


@dataclasses.dataclass(frozen=True)
class Form:
    """One way of running a case.

    Attributes:
        case: the case's index in :func:`single_node_cases`.
        opset: the opset it is re-stamped to; None: the case's own.
        const: every input but the first is an initializer.
        dyn: every graph-input dim is symbolic.
        f16: every float32 input and output is made float16.
    """

    case: int
    opset: int | None = None
    const: bool = False
    dyn: bool = False
    f16: bool = False

    @property
    def ref(self) -> str:
        """Where the expected outputs come from: ONNX's (``expected``) or ``onnxruntime``'s."""
        return "expected" if self.opset is None and not self.f16 else "onnxruntime"


def single_node_cases() -> list[ConformanceCase]:
    """ONNX's cases of one node in :data:`DOMAINS` (function bodies left out), in ONNX's order."""
    return [
        c
        for c in collect_cases()
        if len(c.model.graph.node) == 1
        and c.model.graph.node[0].domain in DOMAINS
        and not c.name.endswith("_expanded")
    ]


def case_opset(case: ConformanceCase) -> int:
    """The opset the case's model imports for its node's domain."""
    node = case.model.graph.node[0]
    for imp in case.model.opset_import:
        if imp.domain == node.domain or (node.domain == "" and imp.domain == "ai.onnx"):
            return int(imp.version)
    raise ValueError(f"{case.name}: no opset for domain {node.domain!r}")


def op_versions(domain: str, op_type: str) -> list[int]:
    """Every version ONNX defines of the op (its schemas' ``since_version``)."""
    return sorted(
        {
            s.since_version
            for s in onnx.defs.get_all_schemas_with_history()
            if s.name == op_type and s.domain == domain
        }
    )


def effective_version(domain: str, op_type: str, opset: int) -> int:
    """The op's version a model of ``opset`` gets."""
    return int(onnx.defs.get_schema(op_type, opset, domain).since_version)


def tensor_inputs(data: tuple[Any, ...]) -> list[np.ndarray] | None:
    """A data set's inputs as numpy arrays, or None when one is a sequence/optional."""
    if any(isinstance(value, (list, tuple, dict)) or value is None for value in data):
        return None
    return [np.asarray(value) for value in data]


def form_inputs(data: tuple[Any, ...], form: Form) -> list[np.ndarray] | None:
    """A data set's inputs as the form feeds them (float32 made float16 in f16 forms)."""
    arrays = tensor_inputs(data)
    if arrays is None or not form.f16:
        return arrays
    return [a.astype(np.float16) if a.dtype == np.float32 else a for a in arrays]


def has_empty_input(case: ConformanceCase) -> bool:
    """Whether an input of the case's first data set has a zero-size dim."""
    arrays = tensor_inputs(case.data_sets[0][0])
    return arrays is not None and any(a.size == 0 and a.ndim > 0 for a in arrays)


def _has_float32(case: ConformanceCase) -> bool:
    return any(
        vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
        for vi in (*case.model.graph.input, *case.model.graph.output)
    )


def build_form(case: ConformanceCase, form: Form) -> onnx.ModelProto | None:
    """The form's model, or None when it does not exist (no inputs to make constant, an opset the
    op's schema at that version rejects)."""
    from onnx import numpy_helper

    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    if form.opset is not None:
        for imp in model.opset_import:
            if imp.domain in ("", "ai.onnx"):
                imp.version = form.opset
    if form.f16:
        for vi in (*model.graph.input, *model.graph.output):
            if vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
                vi.type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    if form.opset is not None or form.f16:
        try:  # the op's schema at that version must take the node with those types
            onnx.checker.check_model(model, full_check=True)
        except Exception:
            return None
    if form.const:
        inputs = form_inputs(case.data_sets[0][0], form)
        graph_inputs = list(model.graph.input)
        if inputs is None or len(graph_inputs) < 2:
            return None
        keep = [graph_inputs[0]]
        for vi, array in zip(graph_inputs[1:], inputs[1:]):
            tensor = numpy_helper.from_array(array, vi.name)
            tensor.data_type = vi.type.tensor_type.elem_type  # keep bfloat16 & co. as declared
            model.graph.initializer.append(tensor)
        del model.graph.input[:]
        model.graph.input.extend(keep)
    if form.dyn:
        if not len(model.graph.input):
            return None
        for i, vi in enumerate(model.graph.input):
            if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
                continue
            for j, dim in enumerate(vi.type.tensor_type.shape.dim):
                dim.Clear()
                dim.dim_param = f"d{i}_{j}"
        for vo in model.graph.output:
            if vo.type.HasField("tensor_type"):
                vo.type.tensor_type.ClearField("shape")
    return model


def prepared(proto: onnx.ModelProto) -> ir.Model:
    """A form's model as the partitioner sees it (``ferry.graph.prepare``: every node named)."""
    from ferry.graph import prepare

    return prepare(ir.from_proto(proto))


def forms_of(cases: list[ConformanceCase]) -> list[Form]:
    """Every form of every case, in order (``Form.case`` indexes ``cases``)."""
    forms = []
    for i, case in enumerate(cases):
        node = case.model.graph.node[0]
        many = len(case.model.graph.input) >= 2
        for f16 in (False, True) if _has_float32(case) else (False,):
            for const in (False, True) if many else (False,):
                for dyn in (False, True):
                    forms.append(Form(i, None, const, dyn, f16))
        if node.domain != "":
            continue
        native = effective_version(node.domain, node.op_type, case_opset(case))
        versions = op_versions(node.domain, node.op_type)
        for v, later in zip(versions, [*versions[1:], native + 1]):
            # the opset that stands for version v: v itself, or the oldest opset we run
            target = max(v, MIN_OPSET)
            if target < min(later, native):
                for const in (False, True) if many else (False,):
                    forms.append(Form(i, target, const, False))
    return forms


# ---------------------------------------------------------------------------------------------
# Running a form (in a worker process)


def _tolerance(want: np.ndarray, rtol: float, atol: float) -> tuple[float, float]:
    """``(atol, rtol)`` for an expected output: the case's, raised to floors for floats; exact for
    ints, bools and strings; 1e-3 / 1e-2 for ml_dtypes (bfloat16, float8, int4)."""
    if want.dtype.kind in "fc":
        if want.dtype == np.float16:
            return max(atol, 1e-3), max(rtol, 1e-2)
        return max(atol, 1e-5), max(rtol, 1e-3)
    if want.dtype.kind in "biuOUS":
        return 0.0, 0.0
    return 1e-3, 1e-2


def _compare(name: str, got: np.ndarray, want: np.ndarray, case: ConformanceCase) -> str | None:
    """Why ``got`` is not the expected output, or None."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"got {got.dtype}{list(got.shape)}, want {want.dtype}{list(want.shape)}"
    atol, rtol = _tolerance(want, case.rtol, case.atol)
    parity = compare_output(name, got, want, atol=atol, rtol=rtol)
    return None if parity.passed else mismatch_text(parity)


def run_form(case: ConformanceCase, form: Form) -> dict[str, Any]:
    """Run one form on OpenVINO: ``{"verdict": ..., "why": ...}``.

    Verdicts: ``pass`` (with the precision OpenVINO ran in), ``absent`` (no such form),
    ``rejected`` (``validate`` refused the node), ``compile``, ``run``, ``mismatch``,
    ``sequence`` (not tensors), ``no-reference`` (ONNX Runtime could not run the reference).
    """
    from ferry.backends import CompileSpec
    from ferry.backends._openvino import OpenVINOBackend
    from ferry.plan import Partition

    proto = build_form(case, form)
    if proto is None:
        return {"verdict": "absent"}
    model = prepared(proto)
    # prepare() names every node and value.
    node = str(next(iter(model.graph)).name)
    backend = OpenVINOBackend()
    rejected = backend.validate(model, [node])
    if rejected:
        return {"verdict": "rejected", "why": rejected[node]}
    inputs = [str(v.name) for v in model.graph.inputs]
    outputs = [str(v.name) for v in model.graph.outputs]
    spec = CompileSpec(Partition("openvino", (node,), tuple(inputs), tuple(outputs)), model)
    try:
        compiled = backend.compile(spec)
    except Exception as e:
        return {"verdict": "compile", "why": str(e)[:300]}
    data_sets = case.data_sets[:1] if form.const else case.data_sets
    for data_in, data_out in data_sets:
        arrays = form_inputs(data_in, form)
        if arrays is None:
            return {"verdict": "sequence", "why": "sequence or optional inputs"}
        feeds = dict(zip(inputs, arrays[: len(inputs)]))
        if form.ref == "expected":
            want = tensor_inputs(data_out)
            if want is None:
                return {"verdict": "sequence", "why": "sequence or optional outputs"}
        else:
            try:
                want = _ort_run(proto, feeds)
            except Exception as e:
                return {"verdict": "no-reference", "why": f"onnxruntime: {str(e)[:200]}"}
        try:
            got = compiled.run(feeds)
        except Exception as e:
            return {"verdict": "run", "why": str(e)[:300]}
        for name, w in zip(outputs, want):
            problem = _compare(name, np.asarray(got[name]), w, case)
            if problem:
                return {"verdict": "mismatch", "why": f"{name}: {problem}"}
    return {"verdict": "pass", "precision": compiled.inference_precision}


def _ort_run(proto: onnx.ModelProto, feeds: dict[str, Any]) -> list[Any]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(
        proto.SerializeToString(), so, providers=["CPUExecutionProvider"]
    )
    return list(session.run(None, feeds))
