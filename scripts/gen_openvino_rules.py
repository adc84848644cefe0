"""Derive OpenVINO's ONNX op rules from ONNX's node test cases run through ferry's OpenVINO adapter.

Writes ``src/ferry/backends/_openvino_rules.py``: the ops OpenVINO's CPU plugin runs correctly, with
the opsets, input and output dtypes, constant inputs and dynamic-dim support under which it does.

Every single-node case of ``onnx.backend.test.case.node`` runs in up to four forms at its own opset:
as written (every input a graph input, static shapes), with every input but the first made an
initializer ("const"), and both of those with every graph-input dim symbolic ("dyn"). Each case is
also re-stamped to the op's earlier versions (7 and up) where ``onnx.checker`` accepts it, and run
there against ONNX Runtime (ONNX's expected outputs hold for the opset they were made at). A form
passes when ``OpenVINOBackend.validate`` keeps the node and the compiled partition's outputs equal
the reference (same dtype and shape, values within the case's tolerance, 1e-3 / 1e-5 at least).

For each op, the rule claims the op versions where some form passed, the input and output dtypes
seen passing, constant inputs when it only passed with them, dynamic dims when every dyn form of a
passing form passed; ``OVERRIDES`` add what the data cannot (attribute limits, exclusions), each
with its reason. Finally every form is checked against the generated table: a form the table
accepts that failed is an error, and nothing is written.

    python scripts/gen_openvino_rules.py [--jobs 2] [--results runs.json] [--reuse runs.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import pprint
import queue
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "src" / "ferry" / "backends" / "_openvino_rules.py"
MIN_OPSET = 7  # older opsets: ONNX Runtime does not run them either
JOB_TIMEOUT_S = 120
DOMAINS = ("", "ai.onnx.ml", "ai.onnx.preview")

# Element types ferry can hand to OpenVINO and get back as numpy arrays with their values intact.
# Left out: float64 (the CPU plugin computes it in float32: 1 + 1e-10 == 1, 1e300 -> 3.4e38),
# bfloat16 (OpenVINO's Python API returns it as float16 bits), float8/int4/... (no numpy type),
# strings. int64/uint64 are kept though the plugin computes them in 32 bits: shapes, indices and
# ids fit, but arithmetic beyond 2**31 wraps (see NOTES in the generated module).
NATIVE = frozenset(
    {
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
    }
)
NOTES = (
    "int64/uint64: the CPU plugin computes them in 32 bits; values beyond 2**31 wrap "
    "(2**40 + 1 == 1 in Add). Shapes, indices and token ids fit.",
    "Results are compared in f32 (the adapter's default); bf16/f16 hints change precision, "
    "not which ops run.",
)
FLOATS = ("float16", "float32")
INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
UINTS = ("uint8", "uint16", "uint32", "uint64")

# What the test data cannot tell: each entry answers failing cases the derived rule would accept.
#   exclude: the op is not claimed, with the reason.   since: lowest opset claimed.
#   inputs: per-index dtypes, intersected with the derived ones.   max_rank: rank limit.
#   attrs: {name: {"allow"|"deny": values}} (absent attributes take the schema's default).
#   absent: input indices that must be left out.   nonempty: refuse inputs with a zero-size dim
#       (a dynamic dim that is 0 at run time cannot be seen: a known gap, listed in NOTES).
#   variants: several rules, each the derived one narrowed by its own entries.
#   why: the failing cases behind the entry (kept in the generated table as "note").
OVERRIDES: dict[str, dict[str, Any]] = {
    "Attention": {
        "exclude": "wrong results with sliding windows, past key/values with a causal "
        "mask, grouped-query heads 4:1 and softmax_precision (test_attention_*window*, "
        "*_with_past_and_present_qk_matmul_bias_*_mask_causal, *_gqa_*)"
    },
    "BitShift": {
        "inputs": {0: UINTS, 1: UINTS},
        "why": "signed inputs, and shifts >= the bit width, differ from ONNX "
        "(test_bitshift_*_negative_*, *_shift_ge_width, *_overflow)",
    },
    "Col2Im": {
        "exclude": "3-D images fail to convert (test_col2im_5d); the rule cannot see "
        "image_shape's length"
    },
    "DFT": {
        "exclude": "one-sided and inverse-real transforms give wrong shapes, the axis input "
        "wrong values (test_dft_rfft, *_irfft, test_dft_axis)"
    },
    "DequantizeLinear": {
        "since": 13,
        "attrs": {"block_size": {"allow": (0,)}},
        "why": "per-axis before opset 13 and blocked quantization do not convert",
    },
    "Dropout": {"absent": (2,), "why": "training_mode does not convert (test_training_dropout*)"},
    "DynamicQuantizeLinear": {
        "exclude": "rounds differently from ONNX (test_dynamicquantizelinear)"
    },
    "GRU": {"attrs": {"layout": {"deny": (1,)}}, "why": "batch-first layout differs (*_batchwise)"},
    "GridSample": {
        "since": 20,
        "max_rank": 4,
        "why": "opset 16's mode names and volumetric (5-D) sampling do not convert",
    },
    "LSTM": {
        "attrs": {"layout": {"deny": (1,)}},
        "absent": (7,),
        "why": "batch-first layout and peepholes differ (test_lstm_batchwise, *_with_peepholes)",
    },
    "MaxPool": {
        "attrs": {"ceil_mode": {"deny": (1,)}},
        "why": "ceil_mode keeps a window that starts in the padding "
        "(test_maxpool_2d_ceil_output_size_reduce_by_one)",
    },
    "Mod": {
        "variants": [
            {"inputs": {0: INTS, 1: INTS}},
            {"inputs": {0: FLOATS, 1: FLOATS}, "attrs": {"fmod": {"allow": (1,)}}},
        ],
        "why": "float Mod with fmod=0 does not convert (test_mod_*_fmod_0*)",
    },
    "NonMaxSuppression": {
        "exclude": "keeps a box whose IoU equals the threshold "
        "(test_nonmaxsuppression_iou_threshold_boundary)"
    },
    "OneHot": {"since": 11, "why": "opset 9 semantics of negative indices differ"},
    "Pad": {
        "attrs": {"mode": {"deny": ("wrap",)}},
        "why": "mode wrap does not convert (test_wrap_pad)",
    },
    "QuantizeLinear": {
        "since": 13,
        "attrs": {"block_size": {"allow": (0,)}},
        "why": "per-axis before opset 13 and blocked quantization do not convert",
    },
    "RNN": {"attrs": {"layout": {"deny": (1,)}}, "why": "batch-first layout differs (*_batchwise)"},
    "ReduceMax": {"nonempty": True, "why": "an empty reduction gives 0, not -inf (*_empty_set)"},
    "ReduceMin": {"nonempty": True, "why": "an empty reduction gives 0, not inf (*_empty_set)"},
    "Resize": {
        "attrs": {
            "antialias": {"deny": (1,)},
            "coordinate_transformation_mode": {
                "deny": ("tf_crop_and_resize", "half_pixel_symmetric", "align_corners")
            },
            "exclude_outside": {"deny": (1,)},
            "keep_aspect_ratio_policy": {"allow": ("stretch",)},
        },
        "why": "antialias, exclude_outside, aspect-ratio policies, half_pixel_symmetric and "
        "downsampling with align_corners differ; tf_crop_and_resize does not convert",
    },
    "RoiAlign": {
        "attrs": {"mode": {"deny": ("max",)}},
        "why": "mode max differs (test_roialign_mode_max)",
    },
    "Softmax": {
        "since": 13,
        "why": "opset 11's flattening semantics differ (test_softmax_* at 11)",
    },
    "SpaceToDepth": {
        "attrs": {"mode": {"deny": ("CRD",)}},
        "why": "CRD mode differs (test_spacetodepth_crd_mode_example)",
    },
    "TopK": {
        "exclude": "returns a different index than ONNX among equal values "
        "(test_top_k_same_values*)"
    },
}


# ---------------------------------------------------------------------------------------------
# Forms of a case


@dataclasses.dataclass(frozen=True)
class Form:
    case: int
    opset: int | None = None  # None: the case's own
    const: bool = False
    dyn: bool = False
    f16: bool = False  # every float32 input and output made float16

    @property
    def ref(self) -> str:
        return "expected" if self.opset is None and not self.f16 else "onnxruntime"


def single_node_cases() -> list[Any]:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    return [
        c
        for c in cases
        if len(c.model.graph.node) == 1
        and c.model.graph.node[0].domain in DOMAINS
        and not c.name.endswith("_expanded")
    ]


def case_opset(case: Any) -> int:
    node = case.model.graph.node[0]
    for imp in case.model.opset_import:
        if imp.domain == node.domain or (node.domain == "" and imp.domain == "ai.onnx"):
            return int(imp.version)
    raise ValueError(f"{case.name}: no opset for domain {node.domain!r}")


def op_versions(domain: str, op_type: str) -> list[int]:
    import onnx.defs

    return sorted(
        {
            s.since_version
            for s in onnx.defs.get_all_schemas_with_history()
            if s.name == op_type and s.domain == domain
        }
    )


def effective_version(domain: str, op_type: str, opset: int) -> int:
    import onnx.defs

    return int(onnx.defs.get_schema(op_type, opset, domain).since_version)


def tensor_inputs(case: Any, data: list[Any]) -> list[Any] | None:
    """The data set's inputs as numpy arrays, or None when one is a sequence/optional."""
    import numpy as np
    from onnx import TensorProto, numpy_helper

    arrays = []
    for value in data:
        if isinstance(value, TensorProto):
            value = numpy_helper.to_array(value)
        if isinstance(value, (list, tuple, dict)) or value is None:
            return None
        arrays.append(np.asarray(value))
    return arrays


def form_inputs(case: Any, data: list[Any], form: Form) -> list[Any] | None:
    """A data set's inputs as the form feeds them (float32 made float16 in f16 forms)."""
    import numpy as np

    arrays = tensor_inputs(case, data)
    if arrays is None or not form.f16:
        return arrays
    return [a.astype(np.float16) if a.dtype == np.float32 else a for a in arrays]


def _has_float32(case: Any) -> bool:
    from onnx import TensorProto

    return any(
        vi.type.tensor_type.elem_type == TensorProto.FLOAT
        for vi in (*case.model.graph.input, *case.model.graph.output)
    )


def build_form(cases: list[Any], form: Form) -> Any | None:
    """The form's ModelProto, or None when it does not exist (no inputs to make constant, an
    opset the op's schema at that version rejects)."""
    import onnx
    from onnx import numpy_helper

    case = cases[form.case]
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    node = model.graph.node[0]
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
        inputs = form_inputs(case, case.data_sets[0][0], form)
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
    del node  # the node is unchanged; only its surroundings are
    return model


def forms_of(cases: list[Any]) -> list[Form]:
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


def _compare(got: Any, want: Any, rtol: float, atol: float) -> str | None:
    import numpy as np

    if got.dtype != want.dtype or got.shape != want.shape:
        return f"got {got.dtype}{list(got.shape)}, want {want.dtype}{list(want.shape)}"
    if want.dtype.kind in "fc":
        if want.dtype == np.float16:
            rtol, atol = max(rtol, 1e-2), max(atol, 1e-3)
        else:
            rtol, atol = max(rtol, 1e-3), max(atol, 1e-5)
        g, w = got.astype(np.float64), want.astype(np.float64)
        if not np.array_equal(np.isnan(g), np.isnan(w)):
            return "NaN positions differ"
        close = np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        if not close.all():
            return f"{int((~close).sum())}/{close.size} values differ, max |diff| {np.nanmax(np.abs(g - w)):.3g}"
        return None
    if want.dtype.kind in "biuO" or want.dtype.kind == "U":
        if not np.array_equal(got, want):
            return f"{int((got != want).sum())}/{want.size} values differ"
        return None
    # ml_dtypes (bfloat16, float8, int4): compare as float32
    if not np.allclose(
        got.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=1e-3, equal_nan=True
    ):
        return "values differ"
    return None


def run_form(cases: list[Any], form: Form) -> dict[str, Any]:
    import numpy as np
    import onnx_ir as ir
    from onnx import TensorProto, numpy_helper
    from onnx_ir.passes.common import NameFixPass

    from ferry.backends import CompileSpec
    from ferry.backends._openvino import OpenVINOBackend
    from ferry.plan import Partition

    case = cases[form.case]
    proto = build_form(cases, form)
    if proto is None:
        return {"verdict": "absent"}
    model = ir.from_proto(proto)
    NameFixPass()(model)
    node = next(iter(model.graph))
    backend = OpenVINOBackend()
    rejected = backend.validate(model, [node.name])
    if rejected:
        return {"verdict": "rejected", "why": rejected[node.name]}
    inputs = [v.name for v in model.graph.inputs]
    outputs = [v.name for v in model.graph.outputs]
    spec = CompileSpec(Partition("openvino", (node.name,), tuple(inputs), tuple(outputs)), model)
    try:
        compiled = backend.compile(spec)
    except Exception as e:
        return {"verdict": "compile", "why": str(e)[:300]}
    data_sets = case.data_sets[:1] if form.const else case.data_sets
    for data_in, data_out in data_sets:
        arrays = form_inputs(case, data_in, form)
        if arrays is None:
            return {"verdict": "sequence", "why": "sequence or optional inputs"}
        feeds = dict(zip(inputs, arrays[: len(inputs)]))
        if form.ref == "expected":
            want = []
            for value in data_out:
                if isinstance(value, TensorProto):
                    value = numpy_helper.to_array(value)
                if isinstance(value, (list, tuple, dict)) or value is None:
                    return {"verdict": "sequence", "why": "sequence or optional outputs"}
                want.append(np.asarray(value))
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
            problem = _compare(np.asarray(got[name]), w, case.rtol, case.atol)
            if problem:
                return {"verdict": "mismatch", "why": f"{name}: {problem}"}
    return {"verdict": "pass", "precision": compiled.inference_precision}


def _ort_run(proto: Any, feeds: dict[str, Any]) -> list[Any]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(
        proto.SerializeToString(), so, providers=["CPUExecutionProvider"]
    )
    return list(session.run(None, feeds))


def _worker(jobs: Any, results: Any) -> None:
    import logging

    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    cases = single_node_cases()
    while True:
        job = jobs.get()
        if job is None:
            return
        key, form = job
        try:
            result = run_form(cases, form)
        except Exception as e:  # a bug in the harness or an escape from the engine: a failure
            result = {"verdict": "error", "why": f"{type(e).__name__}: {str(e)[:300]}"}
        results.put((key, result))


def run_all(forms: list[Form], workers: int) -> dict[int, dict[str, Any]]:
    """Run every form in worker processes; a worker that dies or hangs costs only its form."""
    ctx = mp.get_context("spawn")
    results: Any = ctx.Queue()
    pending = list(enumerate(forms))[::-1]
    done: dict[int, dict[str, Any]] = {}
    pool: list[dict[str, Any]] = []

    def start() -> dict[str, Any]:
        jobs = ctx.Queue()
        proc = ctx.Process(target=_worker, args=(jobs, results), daemon=True)
        proc.start()
        return {"proc": proc, "jobs": jobs, "job": None, "since": 0.0}

    def feed(w: dict[str, Any]) -> None:
        if pending:
            key, form = pending.pop()
            w["job"], w["since"] = key, time.monotonic()
            w["jobs"].put((key, form))
        else:
            w["job"] = None

    pool = [start() for _ in range(workers)]
    for w in pool:
        feed(w)
    last_report = time.monotonic()
    while any(w["job"] is not None for w in pool):
        try:
            key, result = results.get(timeout=1.0)
            done[key] = result
            for w in pool:
                if w["job"] == key:
                    feed(w)
        except queue.Empty:
            pass
        for i, w in enumerate(pool):
            if w["job"] is None:
                continue
            dead = not w["proc"].is_alive()
            hung = time.monotonic() - w["since"] > JOB_TIMEOUT_S
            if dead or hung:
                w["proc"].kill()
                done[w["job"]] = {"verdict": "crash" if dead else "timeout"}
                pool[i] = start()
                feed(pool[i])
        if time.monotonic() - last_report > 30:
            last_report = time.monotonic()
            print(f"  {len(done)}/{len(forms)} forms run", file=sys.stderr)
    for w in pool:
        w["jobs"].put(None)
    return done


# ---------------------------------------------------------------------------------------------
# Deriving rules


@dataclasses.dataclass
class Observation:
    form: Form
    key: tuple[str, str]
    version: int
    passed: bool
    inputs: dict[int, str]
    outputs: dict[int, str]
    empty: bool = False  # some input of the case's data has a zero-size dim
    model: Any = None  # the form as an onnx_ir model (nodes named), for checks against rules


def dtype_of(vi: Any) -> str | None:
    import onnx_ir as ir

    from ferry.graph import dtype_name

    elem = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
    return dtype_name(ir.DataType(elem)) if elem else None


def observe(cases: list[Any], form: Form, result: dict[str, Any]) -> Observation | None:
    proto = build_form(cases, form)
    if proto is None or result["verdict"] in ("absent", "no-reference"):
        return None
    node = proto.graph.node[0]
    import onnx_ir as ir
    from onnx_ir.passes.common import NameFixPass

    from ferry.graph import dtype_name

    types = {vi.name: dtype_of(vi) for vi in (*proto.graph.input, *proto.graph.output)}
    for init in proto.graph.initializer:
        types[init.name] = dtype_name(ir.DataType(init.data_type))
    opset = form.opset or case_opset(cases[form.case])
    model = ir.from_proto(proto)
    NameFixPass()(model)
    return Observation(
        form=form,
        key=(node.domain, node.op_type),
        version=effective_version(node.domain, node.op_type, opset),
        passed=result["verdict"] == "pass",
        inputs={i: types[n] for i, n in enumerate(node.input) if n and types.get(n)},
        outputs={i: types[n] for i, n in enumerate(node.output) if n and types.get(n)},
        empty=_has_empty_input(cases[form.case]),
        model=model,
    )


def _has_empty_input(case: Any) -> bool:
    arrays = tensor_inputs(case, case.data_sets[0][0])
    return arrays is not None and any(a.size == 0 and a.ndim > 0 for a in arrays)


def derive(
    observations: list[Observation], max_opset: int
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Rules from observations: per op, per override variant (the observations it admits)."""
    by_op: dict[tuple[str, str], list[Observation]] = defaultdict(list)
    for ob in observations:
        by_op[ob.key].append(ob)
    rules: list[dict[str, Any]] = []
    excluded: dict[str, str] = {}
    for (domain, op_type), obs in sorted(by_op.items()):
        label = op_type if domain == "" else f"{domain}.{op_type}"
        override = OVERRIDES.get(label, {})
        if "exclude" in override:
            excluded[label] = override["exclude"]
            continue
        schema = _schema(domain, op_type, max_opset)
        made = []
        for variant in override.get("variants", [{}]):
            limits = {k: v for k, v in override.items() if k != "variants"} | variant
            narrowed = _narrow({"op": op_type, "inputs": {}}, limits, schema)
            admitted = [ob for ob in obs if _admits(narrowed, ob)]
            made += _derive_variant(domain, op_type, admitted, narrowed, max_opset)
        if made:
            rules += made
        elif not any(ob.passed for ob in obs):
            excluded[label] = "no test case passes"
        else:
            excluded[label] = "passes only with element types ferry cannot exchange (bfloat16, ...)"
    return rules, excluded


def _admits(limits: dict[str, Any], ob: Observation) -> bool:
    """Whether an observation's node meets a variant's limits (types, attributes, rank, absent
    inputs), whatever its constness and dims."""
    from ferry.backends._openvino import rules_from_data

    probe = {k: v for k, v in limits.items() if k not in ("const", "dynamic", "nonempty")}
    (rule,) = rules_from_data([{**probe, "since": 1, "until": 10**6}])
    node = next(iter(ob.model.graph))
    return rule.accepts(node, 1) is True


def _derive_variant(
    domain: str, op_type: str, obs: list[Observation], limits: dict[str, Any], max_opset: int
) -> list[dict[str, Any]]:
    # Only forms whose every input and output has a type ferry can exchange count.
    usable = [
        ob for ob in obs if all(t in NATIVE for t in (*ob.inputs.values(), *ob.outputs.values()))
    ]
    passing = [ob for ob in usable if ob.passed]
    if not passing:
        return []

    def key(ob: Observation, const: bool | None = None, dyn: bool | None = None) -> tuple[Any, ...]:
        f = ob.form
        return (
            f.case,
            f.opset,
            f.f16,
            f.const if const is None else const,
            f.dyn if dyn is None else dyn,
        )

    verdict = {key(ob): ob.passed for ob in obs}
    # Constant inputs are required when no form passed without them, or when some case passed
    # with them and failed without (Unsqueeze's axes, Tile's repeats).
    needs_const = not any(not ob.form.const for ob in passing) or any(
        not verdict.get(key(ob, const=False), True) for ob in passing if ob.form.const
    )
    with_const = {ob.form.case for ob in obs if ob.form.const}
    static_pass = {
        key(ob, dyn=True)
        for ob in passing
        if not ob.form.dyn and (ob.form.const or not needs_const or ob.form.case not in with_const)
    }
    twins = [ob for ob in usable if ob.form.dyn and key(ob) in static_pass]
    twins = [ob for ob in twins if not (limits.get("nonempty") and ob.empty)]  # the known gap
    # Dynamic dims fail for some element types only (int8 Div): split those off as static.
    bad = {ob.inputs.get(0) for ob in twins if not ob.passed}
    good = {ob.inputs.get(0) for ob in twins if ob.passed}
    types: dict[int, set[str]] = defaultdict(set)
    out_types: dict[int, set[str]] = defaultdict(set)
    for ob in passing:
        for i, t in ob.inputs.items():
            types[i].add(t)
        for i, t in ob.outputs.items():
            out_types[i].add(t)
    first = types.get(0, set())
    if not bad:
        groups = [(first, True)]
    elif None not in bad and not bad & good and first - bad:
        groups = [(first - bad, True), (first & bad, False)]
    else:
        groups = [(first, False)]
    versions = op_versions(domain, op_type)
    good_versions = sorted({ob.version for ob in passing})
    made = []
    for group_types, dynamic in groups:
        if not group_types and 0 in types:
            continue
        rule: dict[str, Any] = {"op": op_type}
        if domain:
            rule["domain"] = domain
        inputs = {i: tuple(sorted(t)) for i, t in sorted(types.items())}
        if 0 in inputs:
            inputs[0] = tuple(sorted(group_types))
        rule["inputs"] = inputs
        rule["outputs"] = {i: tuple(sorted(t)) for i, t in sorted(out_types.items())}
        if needs_const:
            n_inputs = max(len(ob.inputs) for ob in passing)
            rule["const"] = tuple(range(1, max(n_inputs, 2)))
        if not dynamic or limits.get("dynamic") is False:
            rule["dynamic"] = False
        for k in ("max_rank", "absent", "nonempty", "attrs", "note"):
            if k in limits:
                rule[k] = limits[k]
        for since, until in _ranges(good_versions, versions, max_opset):
            since = max(since, limits.get("since", since))
            if since <= until:
                head = {k: rule[k] for k in ("op", "domain") if k in rule}
                rest = {k: v for k, v in rule.items() if k not in ("op", "domain")}
                made.append({**head, "since": since, "until": until, **rest})
    return made


def _narrow(base: dict[str, Any], override: dict[str, Any], schema: Any) -> dict[str, Any]:
    """A rule's limits from an override's entries (attribute defaults from the op's schema)."""
    from onnx import helper

    rule = dict(base)
    if "inputs" in override:
        rule["inputs"] = {i: tuple(t) for i, t in override["inputs"].items()}
    for k in ("since", "max_rank", "nonempty"):
        if k in override:
            rule[k] = override[k]
    if override.get("dynamic") is False:
        rule["dynamic"] = False
    if "absent" in override:
        rule["absent"] = tuple(override["absent"])
    if "attrs" in override:
        attrs = {}
        for name, limit in override["attrs"].items():
            proto = schema.attributes[name].default_value if schema is not None else None
            default = (
                helper.get_attribute_value(proto) if proto is not None and proto.type else None
            )
            if isinstance(default, bytes):
                default = default.decode()
            attrs[name] = {**limit, "default": default}
        rule["attrs"] = attrs
    if "why" in override:
        rule["note"] = override["why"]
    return rule


def _schema(domain: str, op_type: str, opset: int) -> Any:
    import onnx.defs

    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except Exception:
        return None


def _ranges(good: list[int], versions: list[int], max_opset: int) -> list[tuple[int, int]]:
    """Opset ranges where the op's version is one that passed, merged where they touch."""
    spans = []
    for v in good:
        later = [w for w in versions if w > v]
        spans.append((max(v, MIN_OPSET), (later[0] - 1) if later else max_opset))
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return merged


def verify(
    cases: list[Any], forms: list[Form], done: dict[int, dict[str, Any]]
) -> tuple[list[str], list[str]]:
    """Forms the generated table accepts that failed: each one a bug in the table; and the known
    gaps (dyn forms of empty-input cases for ops whose rules refuse visible empty inputs)."""
    import importlib

    import onnx_ir as ir
    from onnx_ir.passes.common import NameFixPass

    import ferry.backends._openvino_rules as data
    from ferry.backends._openvino import rules_from_data
    from ferry.backends import RuleTable

    importlib.reload(data)
    table = RuleTable(rules_from_data(data.RULES))
    problems, gaps = [], []
    for key, form in enumerate(forms):
        result = done[key]
        if result["verdict"] in ("pass", "absent", "no-reference"):
            continue
        proto = build_form(cases, form)
        if proto is None:
            continue
        model = ir.from_proto(proto)
        NameFixPass()(model)
        node = next(iter(model.graph))
        if table.supports(node, model.opset_imports) is True:
            line = f"{cases[form.case].name} {form}: accepted but {result}"
            nonempty = OVERRIDES.get(node.op_type, {}).get("nonempty")
            if nonempty and form.dyn and _has_empty_input(cases[form.case]):
                gaps.append(cases[form.case].name)
            else:
                problems.append(line)
    return problems, sorted(set(gaps))


def emit(
    rules: list[dict[str, Any]], excluded: dict[str, str], summary: str, gaps: list[str]
) -> str:
    lines = [
        '"""OpenVINO\'s ONNX op support on the CPU, as data: generated by scripts/gen_openvino_rules.py.',
        "",
        "Do not edit: re-run the script (it checks every claim against ONNX's node test cases).",
        summary,
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import Any",
        "",
        "# Keys: op, domain (default ''), since/until (model opset), inputs/outputs ({index: dtypes}),",
        "# const (input indices that must be constants), dynamic (False: static shapes only),",
        "# attrs ({name: (allowed values, default when absent)}).",
        "RULES: tuple[dict[str, Any], ...] = (",
    ]
    for rule in rules:
        lines.append(
            "    " + pprint.pformat(rule, width=96, sort_dicts=False).replace("\n", "\n    ") + ","
        )
    lines.append(")")
    lines.append("")
    lines.append("#: What the rules claim that is not exact, for the reader.")
    lines.append("NOTES: tuple[str, ...] = (")
    for note in NOTES:
        lines.append(f"    {note!r},")
    if gaps:
        lines.append(
            f"    {'Zero-size inputs behind dynamic dims are not seen by the rules; failing cases: ' + ', '.join(gaps)!r},"
        )
    lines.append(")")
    lines.append("")
    lines.append("#: Ops with test cases that are not claimed, and why.")
    lines.append("EXCLUDED: dict[str, str] = {")
    for op, why in sorted(excluded.items()):
        lines.append(f"    {op!r}: {why!r},")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--results", type=Path, help="save every form's verdict here (JSON)")
    parser.add_argument("--reuse", type=Path, help="derive from saved verdicts instead of running")
    parser.add_argument(
        "--rerun", default="", help="with --reuse: run these ops' forms again (A,B)"
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))

    import onnx
    import openvino

    cases = single_node_cases()
    forms = forms_of(cases)
    if args.reuse:
        saved = json.loads(args.reuse.read_text())
        done = {int(k): v for k, v in saved["verdicts"].items()}
        again = {op.strip() for op in args.rerun.split(",") if op.strip()}
        if again:
            keys = [
                k for k, f in enumerate(forms) if cases[f.case].model.graph.node[0].op_type in again
            ]
            print(f"running {len(keys)} forms of {sorted(again)} again", file=sys.stderr)
            fresh = run_all([forms[k] for k in keys], args.jobs)
            done.update({keys[i]: r for i, r in fresh.items()})
    else:
        print(
            f"{len(cases)} single-node cases, {len(forms)} forms, {args.jobs} workers",
            file=sys.stderr,
        )
        start = time.monotonic()
        done = run_all(forms, args.jobs)
        print(f"ran in {time.monotonic() - start:.0f} s", file=sys.stderr)
    if args.results:
        args.results.write_text(
            json.dumps(
                {
                    "verdicts": done,
                    "forms": [dataclasses.asdict(f) | {"name": cases[f.case].name} for f in forms],
                },
                indent=0,
            )
        )
    observations = [ob for key, form in enumerate(forms) if (ob := observe(cases, form, done[key]))]
    max_opset = onnx.defs.onnx_opset_version()
    rules, excluded = derive(observations, max_opset)
    ran = sum(1 for r in done.values() if r["verdict"] not in ("absent",))
    passed = sum(1 for r in done.values() if r["verdict"] == "pass")
    ops = len({(r.get("domain", ""), r["op"]) for r in rules})
    summary = (
        f"\nopenvino {openvino.__version__}, onnx {onnx.__version__} (opset {max_opset}): "
        f"{len(cases)} single-node test cases,\n{ran} forms run, {passed} passed; "
        f"{ops} ops claimed in {len(rules)} rules, {len(excluded)} ops with cases left out."
    )
    previous = OUT.read_text() if OUT.exists() else None
    OUT.write_text(emit(rules, excluded, summary, []))
    problems, gaps = verify(cases, forms, done)
    OUT.write_text(emit(rules, excluded, summary, gaps))
    if problems:
        if previous is not None:
            OUT.write_text(previous)
        else:
            OUT.unlink()
        print(f"{len(problems)} failing forms are accepted by the derived rules:", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        return 1
    print(summary.strip(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
