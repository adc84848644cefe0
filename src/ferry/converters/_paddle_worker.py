"""The Paddle side of the Paddle converter: runs in the Python that has paddle and paddle2onnx.

It is copied into a temporary folder and run there as a script (``python worker.py request.json``),
never imported: that Python may be another version, and paddle2onnx's C++ core aborts the whole
process on ops it cannot convert. Standard library, numpy, paddle and paddle2onnx only, and no
syntax newer than the oldest Python Paddle supports. It writes report.json as it goes, so an
abort still leaves what it learned before.

Before paddle2onnx sees a program, the worker hands it the program in the form paddle2onnx 2.1
reads (see ``program_for_p2o``): a legacy ``.pdmodel`` is translated to PIR here, and attributes
whose type Paddle changed since paddle2onnx was built are written back in the old type.
"""

import contextlib
import io
import json
import os
import re
import sys
import traceback
import warnings

warnings.filterwarnings("ignore")

# paddle2onnx's convert_pir_op_name (paddle2onnx/mapper/exporter.h): PIR op names -> its registry.
RENAMES = {
    "matmul": "matmul_v2",
    "batch_norm_": "batch_norm",
    "topk": "top_k_v2",
    "repeat_interleave_with_tensor_index": "repeat_interleave",
    "expand": "expand_v2",
    "assign_value_": "assign_value",
    "flatten": "flatten_contiguous_range",
    "unsqueeze": "unsqueeze2",
    "arange": "range",
    "argmax": "arg_max",
    "floor_divide": "elementwise_floordiv",
    "subtract": "elementwise_sub",
    "multiply": "elementwise_mul",
    "divide": "elementwise_div",
    "remainder": "elementwise_mod",
    "minimum": "elementwise_min",
    "maximum": "elementwise_max",
    "min": "reduce_min",
    "max": "reduce_max",
    "mean": "reduce_mean",
    "sum": "reduce_sum",
    "prod": "reduce_prod",
    "any": "reduce_any",
    "all": "reduce_all",
    "numel": "size",
    "hardswish": "hard_swish",
    "hardsigmoid": "hard_sigmoid",
    "add": "elementwise_add",
    "add_n": "sum",
    "grid_sample": "grid_sampler",
    "nonzero": "where_index",
}
# Ops paddle2onnx handles itself rather than through its registry (ModelExporter::IsOpsRegistered).
SKIPPED = {
    "pd_op.data",
    "pd_op.feed",
    "pd_op.fetch",
    "pd_op.if",
    "pd_op.while",
    "cf.yield",
    "pd_op.print",
    "builtin.parameter",
}
# Attributes paddle2onnx 2.1 reads as lists of float32 (PaddlePirParser::GetOpAttr with a
# std::vector<float>, which demands ir::FloatAttribute elements) but Paddle >= 3.3 writes as
# lists of float64: every interpolation op's ``scale`` (nearest/bilinear/bicubic/linear/
# trilinear_interp), in programs Paddle 3.3 saves and in legacy programs it translates alike.
# paddle2onnx fails on them with "the 0th elementwise MUST be ir::FloatAttribute" (Paddle issue
# 77757). Other float lists (prior_box's sizes, ...) are still written as float32; the lists
# paddle2onnx reads as doubles (assign_value's and set_value's ``values``) are left alone.
F32_LISTS = {"scale": re.compile(r"^\d+\.\w+_interp_?$")}


def save(report):
    path = REQUEST["report"]
    with open(path + ".tmp", "w") as f:
        json.dump(report, f)
    os.replace(path + ".tmp", path)


def reason(exc):
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in lines:
        if line.startswith("(") or re.match(r"^\w+Error: ", line):
            return line[:800]
    return lines[-1][:800] if lines else type(exc).__name__


def p2o_name(name):
    if name.startswith("pd_op."):
        name = name[len("pd_op.") :]
    elif name.startswith("builtin."):
        name = "builtin_" + name[len("builtin.") :]
    return RENAMES.get(name, name)


def walk(block, found):
    for op in block.ops:
        found.append(op.name())
        try:
            blocks = op.blocks()
        except Exception:
            blocks = []
        for sub in blocks:
            walk(sub, found)


def load_program(paddle, model):
    """Load program and weights (a corrupt .pdiparams fails here).

    Returns the program, whether it is a legacy ProgramDesc (to translate with ``to_pir``) and
    the names ``paddle.inference`` gives its outputs where the translation renames them (a
    legacy program's fetch variables; PIR programs' ``fetch_name_N`` are kept by paddle2onnx).
    Paddle is left in static mode, where the program's parameters live.
    """
    prefix = os.path.splitext(model)[0]
    paddle.enable_static()
    exe = paddle.static.Executor(paddle.CPUPlace())
    if model.endswith(".pdmodel"):
        with paddle.pir_utils.OldIrGuard():
            program, _, fetches = paddle.static.load_inference_model(prefix, exe)
        return program, True, [str(v.name) for v in fetches]
    with paddle.pir_utils.IrGuard():
        program, _, _ = paddle.static.load_inference_model(prefix, exe)
    return program, False, None


def to_pir(paddle, program, legacy):
    return paddle.pir.translate_to_pir(program.desc) if legacy else program


def program_for_p2o(paddle, model, params, program, report):
    """The program file (and its weights) to give paddle2onnx: the PIR form it reads.

    Before -> After::

        NAME.pdmodel + NAME.pdiparams (legacy ProgramDesc)
            -> program.json + program.pdiparams in the work folder: translated to PIR and saved
               here (what paddle2onnx.export does itself before it converts, so that the
               attributes below can be written back first)
        any PIR program whose *_interp ops carry ``scale`` as float64 (Paddle >= 3.3)
            -> a copy in the work folder with those lists as float32 (exact for the scales
               paddle2onnx then writes as a float32 Resize input anyway)
        any other PIR program -> itself, untouched
    """
    work = os.path.join(os.path.dirname(os.path.abspath(REQUEST["out"])), "program")
    os.makedirs(work, exist_ok=True)
    if program is not None:
        from paddle2onnx.convert import load_parameter, save_program

        # The translated program's parameters are bound to the weights loaded with it.
        load_parameter(program)
        save_program(program, os.path.join(work, "program"))
        model = os.path.join(work, "program.json")
        saved = os.path.join(work, "program.pdiparams")
        params = saved if os.path.isfile(saved) else ""
    with open(model, encoding="utf-8") as f:
        data = json.load(f)
    changed = f32_lists(data)
    if changed:
        report["rewritten"] = changed
        if program is None:
            model = os.path.join(work, os.path.basename(model))
        with open(model + ".tmp", "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(model + ".tmp", model)
    return model, params


def f32_lists(data):
    """Rewrite the float64 lists of ``F32_LISTS`` attributes as float32 in a PIR program's
    JSON, in place (nested blocks too); return ``["op.attr", ...]`` for each list rewritten."""
    changed = []
    for op in json_ops((data.get("program") or {}).get("regions")):
        name = str(op.get("#", ""))
        for attr in op.get("A") or []:
            pattern = F32_LISTS.get(attr.get("N")) if isinstance(attr, dict) else None
            if pattern is None or not pattern.match(name):
                continue
            value = attr.get("AT") or {}
            items = value.get("D") if value.get("#") == "0.a_array" else None
            doubles = [i for i in items or [] if isinstance(i, dict) and i.get("#") == "0.a_f64"]
            for item in doubles:
                item["#"] = "0.a_f32"
            if doubles:
                changed.append("%s.%s" % (name.split(".", 1)[-1], attr["N"]))
    return changed


def json_ops(regions):
    """Every op of a PIR program's JSON, those in nested blocks (if, while) included."""
    for region in regions or []:
        for block in region.get("blocks") or []:
            for op in block.get("ops") or []:
                yield op
                for inner in json_ops(op.get("regions")):
                    yield inner


def unsupported_ops(program):
    try:
        from paddle2onnx import paddle2onnx_cpp2py_export as c_p2o

        supported = set(c_p2o.get_all_supported_operators_pir())
    except Exception:
        return None
    names = []
    walk(program.global_block(), names)
    found, seen = [], {}
    for name in names:
        if name in SKIPPED:
            continue
        index = seen.get(name, 0)
        seen[name] = index + 1
        if p2o_name(name) not in supported:
            found.append([name, "%s#%d" % (name, index)])
    return found


def export(paddle, report):
    try:
        import paddle2onnx
    except ImportError as e:
        report.update(error="missing", module="paddle2onnx", message=str(e))
        return 3
    report["paddle2onnx_version"] = str(getattr(paddle2onnx, "__version__", ""))
    model, params = REQUEST["model"], REQUEST["params"]
    try:
        program, legacy, report["fetch_names"] = load_program(paddle, model)
    except Exception as e:
        paddle.disable_static()
        report.update(error="load", message=reason(e))
        return 4
    try:
        pir_program = to_pir(paddle, program, legacy)
    except Exception as e:
        pir_program = None
        report["translate_error"] = reason(e)
    try:
        if pir_program is not None:
            report["unsupported"] = unsupported_ops(pir_program)
    except Exception as e:
        report["unsupported_error"] = reason(e)
    save(report)
    try:
        if legacy and pir_program is None:
            raise RuntimeError(report["translate_error"])
        model, params = program_for_p2o(
            paddle, model, params, pir_program if legacy else None, report
        )
    except Exception as e:
        # paddle2onnx's own way remains: it translates and converts by itself.
        report["prepare_error"] = reason(e)
    finally:
        paddle.disable_static()
    save(report)
    sys.stdout.flush()
    out = REQUEST["out"]
    said = io.StringIO()
    try:
        # paddle2onnx catches its core's exception, prints it and calls sys.exit(-1): its
        # printed reason is the message, and the exit must not end this worker.
        with contextlib.redirect_stdout(said):
            paddle2onnx.export(
                model,
                params,
                save_file=out,
                opset_version=int(REQUEST["opset"]),
                auto_upgrade_opset=True,
                enable_onnx_checker=True,
                enable_optimize=True,
                optimize_tool="None",
            )
    except SystemExit:
        report.update(error="export", message=p2o_error(said.getvalue()))
        return 5
    except Exception as e:
        report.update(error="export", message=reason(e))
        return 5
    finally:
        sys.stdout.write(said.getvalue())
        sys.stdout.flush()
    if not os.path.isfile(out) or os.path.getsize(out) == 0:
        report.update(error="export")
        return 5
    report["ok"] = True
    return 0


def p2o_error(text):
    """The reason in paddle2onnx's ``[ERROR] Failed to convert PaddlePaddle model: ...`` line."""
    for line in text.splitlines():
        if "[ERROR]" in line:
            found = line.split("[ERROR]", 1)[1].strip()
            found = re.sub(r"\x1b\[[0-9;]*m", "", found)
            found = re.sub(r"^Failed to convert PaddlePaddle model:\s*", "", found)
            return found.rstrip(".")[:800] or None
    return None


def run(paddle, report):
    import numpy as np
    from paddle import inference

    model, params = REQUEST["model"], REQUEST["params"]
    try:
        config = inference.Config(model, params) if params else inference.Config(model)
        config.disable_gpu()
        config.disable_glog_info()
        # The program as written: Paddle's graph optimizations may fuse and reorder float math,
        # and its oneDNN kernels are another implementation (which Paddle 3.3 cannot even run on
        # a program it saved with an interpolation: "ConvertPirAttribute2RuntimeAttribute not
        # support [pir::ArrayAttribute<pir::DoubleAttribute>]"); Paddle's own CPU kernels are it.
        config.switch_ir_optim(False)
        config.disable_mkldnn()
        predictor = inference.create_predictor(config)
    except Exception as e:
        report.update(error="load", message=reason(e))
        return 4
    try:
        with np.load(REQUEST["inputs"]) as feeds:
            for name in predictor.get_input_names():
                if name not in feeds.files:
                    report.update(error="run", message="no value for input %r" % name)
                    return 6
                value = np.asarray(feeds[name], order="C")
                handle = predictor.get_input_handle(name)
                handle.reshape(list(value.shape))
                handle.copy_from_cpu(value)
        predictor.run()
        names = predictor.get_output_names()
        outputs = [predictor.get_output_handle(n).copy_to_cpu() for n in names]
    except Exception as e:
        report.update(error="run", message=reason(e))
        return 6
    np.savez(REQUEST["out"], **{"out%d" % i: v for i, v in enumerate(outputs)})
    report.update(ok=True, count=len(outputs), names=list(names))
    return 0


def main():
    report = {}
    try:
        import paddle
    except ImportError as e:
        report.update(error="missing", module="paddle", message=str(e))
        save(report)
        return 3
    report["paddle_version"] = str(paddle.__version__)
    try:
        code = export(paddle, report) if REQUEST["action"] == "export" else run(paddle, report)
    except Exception as e:
        traceback.print_exc()
        report.update(error="internal", message=reason(e))
        code = 7
    save(report)
    return code


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        REQUEST = json.load(f)
    sys.exit(main())
