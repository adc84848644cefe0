"""The Paddle side of the Paddle converter: runs in the Python that has paddle and paddle2onnx.

It is copied into a temporary folder and run there as a script (``python worker.py request.json``),
never imported: that Python may be another version, and paddle2onnx's C++ core aborts the whole
process on ops it cannot convert. Standard library, numpy, paddle and paddle2onnx only, and no
syntax newer than the oldest Python Paddle supports. It writes report.json as it goes, so an
abort still leaves what it learned before.
"""

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
    """Load program and weights (a corrupt .pdiparams fails here); return the PIR program."""
    prefix = os.path.splitext(model)[0]
    paddle.enable_static()
    try:
        exe = paddle.static.Executor(paddle.CPUPlace())
        if model.endswith(".pdmodel"):
            with paddle.pir_utils.OldIrGuard():
                program, _, _ = paddle.static.load_inference_model(prefix, exe)
            return lambda: paddle.pir.translate_to_pir(program.desc)
        with paddle.pir_utils.IrGuard():
            program, _, _ = paddle.static.load_inference_model(prefix, exe)
        return lambda: program
    finally:
        paddle.disable_static()


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
        get_program = load_program(paddle, model)
    except Exception as e:
        report.update(error="load", message=reason(e))
        return 4
    try:
        report["unsupported"] = unsupported_ops(get_program())
    except Exception as e:
        report["unsupported_error"] = reason(e)
    save(report)
    sys.stdout.flush()
    out = REQUEST["out"]
    try:
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
    except Exception as e:
        report.update(error="export", message=reason(e))
        return 5
    if not os.path.isfile(out) or os.path.getsize(out) == 0:
        report.update(error="export")
        return 5
    report["ok"] = True
    return 0


def run(paddle, report):
    import numpy as np
    from paddle import inference

    model, params = REQUEST["model"], REQUEST["params"]
    try:
        config = inference.Config(model, params) if params else inference.Config(model)
        config.disable_gpu()
        config.disable_glog_info()
        # The program as written: Paddle's graph optimizations may fuse and reorder float math.
        config.switch_ir_optim(False)
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
                value = np.ascontiguousarray(feeds[name])
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
