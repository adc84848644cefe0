"""Saving with external data is atomic as a pair: the writer is killed at every file operation
of a save, and the model at the destination is then exactly the old one or the new one.

The save runs in a forked child that counts its file operations (files created, tensors
written, fsyncs, renames, removals) and SIGKILLs itself just before the N-th, for N = 1, 2, ...
until a save completes. The parent then loads the destination with ``onnx.load`` and with
``ferry.graph.load_model`` and compares every weight with the old and with the new model's.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import models
from ferry.graph import load_model, save_model

#: Weights 64x64 float32 (16 KiB each, over the 8 KiB of a file object's buffer, so a writer
#: killed between two tensors leaves the first on disk); the bias is small enough to stay inline.
SIZE = 64
WEIGHTS = ("w0", "w1", "w2")

Weights = dict[str, np.ndarray]


def _proto(seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.standard_normal((SIZE, SIZE)).astype(np.float32), name)
        for name in WEIGHTS
    ]
    inits.append(numpy_helper.from_array(rng.standard_normal(SIZE).astype(np.float32), "b"))
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["h0"]),
        helper.make_node("MatMul", ["h0", "w1"], ["h1"]),
        helper.make_node("MatMul", ["h1", "w2"], ["h2"]),
        helper.make_node("Add", ["h2", "b"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, SIZE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, SIZE])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _model(seed: int) -> ir.Model:
    return ir.from_proto(_proto(seed))


def _weights_of(model: ir.Model) -> Weights:
    return {
        name: np.array(value.const_value.numpy(), copy=True)
        for name, value in model.graph.initializers.items()
        if value.const_value is not None
    }


def _read_back(dest: Path) -> tuple[Weights, Weights]:
    """The weights at ``dest`` as onnx reads them (external data included) and as ferry does."""
    by_onnx = {t.name: numpy_helper.to_array(t) for t in onnx.load(dest).graph.initializer}
    return by_onnx, _weights_of(load_model(dest))


def _equal(a: Weights, b: Weights) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _visible(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def _data_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name.endswith(".data")}


def _data_locations(dest: Path) -> set[str]:
    proto = onnx.load(dest, load_external_data=False)
    return {
        entry.value
        for tensor in proto.graph.initializer
        for entry in tensor.external_data
        if entry.key == "location"
    }


# ---------------------------------------------------------------------------------------------
# Killing the writer


@dataclass
class Case:
    """One save to crash: the folder as it was, the model to save, and both models' weights."""

    dest: Path
    save: Callable[[], object]
    old: Weights | None  # None: no model at dest before
    new: Weights


def _fresh(folder: Path) -> Case:
    new = _model(1)
    dest = folder / "m.onnx"
    return Case(dest, lambda: save_model(new, dest, external_data=True), None, _weights_of(new))


def _over_a_pair(folder: Path) -> Case:
    dest = folder / "m.onnx"
    save_model(_model(0), dest, external_data=True)
    assert _visible(folder) == ["m.onnx", "m.onnx.data"]
    new = _model(1)
    return Case(
        dest,
        lambda: save_model(new, dest, external_data=True),
        _weights_of(_model(0)),
        _weights_of(new),
    )


def _over_a_versioned_pair(folder: Path) -> Case:
    dest = folder / "m.onnx"
    save_model(_model(0), dest, external_data=True)
    save_model(_model(2), dest, external_data=True)
    (data,) = _data_locations(dest)
    assert re.fullmatch(r"m\.onnx\.[0-9a-f]{8}\.data", data), data
    new = _model(1)
    return Case(
        dest,
        lambda: save_model(new, dest, external_data=True),
        _weights_of(_model(2)),
        _weights_of(new),
    )


def _over_itself_read_lazily(folder: Path) -> Case:
    # Written by onnx, as others' models are; loaded lazily, one weight changed, saved back:
    # the other weights are read from the very data file the save replaces.
    dest = models.save_external(_proto(0), folder / "m.onnx")
    model = load_model(dest)
    assert all(
        isinstance(model.graph.initializers[name].const_value, ir.ExternalTensor)
        for name in WEIGHTS
    )
    old = _read_back(dest)[0]
    model.graph.initializers["w1"].const_value = ir.Tensor(
        np.full((SIZE, SIZE), 7.0, np.float32), name="w1"
    )
    new = {**old, "w1": np.full((SIZE, SIZE), 7.0, np.float32)}
    return Case(dest, lambda: save_model(model, dest), old, new)


def _over_an_inline_model(folder: Path) -> Case:
    dest = folder / "m.onnx"
    onnx.save(_proto(0), dest)
    new = _model(1)
    return Case(
        dest,
        lambda: save_model(new, dest, external_data=True),
        _weights_of(_model(0)),
        _weights_of(new),
    )


SCENARIOS: dict[str, Callable[[Path], Case]] = {
    "to a new file": _fresh,
    "over a pair": _over_a_pair,
    "over a versioned pair": _over_a_versioned_pair,
    "over itself, read lazily": _over_itself_read_lazily,
    "over an inline model": _over_an_inline_model,
}


def _arm(step: int, log: Path) -> None:
    """In the child: count file operations, log each, and SIGKILL the process before the
    ``step``-th."""
    count = 0

    def name_of(arg: Any) -> str:
        if isinstance(arg, int):  # an fd: name its file
            try:
                arg = Path(f"/proc/self/fd/{arg}").readlink()
            except OSError:
                return f"fd {arg}"
            if Path(arg).is_dir():
                return "the folder"
        name = Path(arg).name
        return re.sub(r"\b[0-9a-f]{8,16}\b", "*", name)  # temporary and hashed names

    def counted(
        what: str, original: Callable[..., Any], when: Callable[..., bool] = lambda *a: True
    ) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            nonlocal count
            if when(*args):
                count += 1
                if what == "write tensor":
                    shown = args[0].name
                elif what in ("replace", "rename", "link"):
                    shown = " -> ".join(name_of(a) for a in args[:2])
                else:
                    shown = name_of(args[0])
                with log.open("a") as f:
                    f.write(f"{what} {shown}\n")
                if count == step:
                    os.kill(os.getpid(), signal.SIGKILL)
            return original(*args, **kwargs)

        return wrapper

    os.open = counted("create", os.open, lambda path, flags, *a: bool(flags & os.O_CREAT))
    for op in ("fsync", "replace", "rename", "link", "unlink", "remove", "rmdir"):
        setattr(os, op, counted(op, getattr(os, op)))
    # Each tensor is turned into bytes just before it is written.
    for cls in (ir.Tensor, ir.ExternalTensor, ir.TensorProtoTensor):
        cls.tobytes = counted("write tensor", cls.tobytes)  # type: ignore[method-assign]


def _save_killed_at(step: int, save: Callable[[], object], log: Path) -> bool:
    """Run ``save`` in a child killed before its ``step``-th file operation; True if it finished
    first."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            _arm(step, log)
            save()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return False
    assert os.WEXITSTATUS(status) == 0, "the save failed in the child (its traceback is above)"
    return True


def _check_after_crash(case: Case, folder: Path) -> str:
    """The destination is exactly the old model or the new one; say which."""
    if not case.dest.exists():
        assert case.old is None, "the old model is gone"
        state = "none"
    else:
        by_onnx, by_ferry = _read_back(case.dest)
        assert _equal(by_onnx, by_ferry)
        if case.old is not None and _equal(by_onnx, case.old):
            state = "old"
        else:
            assert _equal(by_onnx, case.new), "the model is neither the old one nor the new one"
            state = "new"
    # Anything else visible is a data file named for the model: the one it points at, or one
    # nobody points at (the claimed name still empty, a complete new one, or the replaced one).
    for name in _visible(folder):
        assert name == case.dest.name or re.fullmatch(r"m\.onnx(\.[0-9a-f]{8})?\.data", name), name
    return state


@pytest.mark.skipif(not hasattr(os, "fork"), reason="kills a forked writer (POSIX only)")
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_writer_killed_at_any_step_leaves_the_old_model_or_the_new_one(
    scenario: str, tmp_path: Path
) -> None:
    outcomes: list[tuple[str, str]] = []
    step = 0
    while True:
        step += 1
        assert step < 100, "the save never finished"
        folder = tmp_path / f"step{step}"
        folder.mkdir()
        case = SCENARIOS[scenario](folder)
        log = tmp_path / f"step{step}.log"
        data_before = _data_files(folder)
        finished = _save_killed_at(step, case.save, log)
        state = _check_after_crash(case, folder)
        for name, content in _data_files(folder).items():
            if name in data_before:  # a data file is never written in place
                assert content == data_before[name], name
            else:  # and one that appears is empty (its name claimed) or complete
                assert len(content) in (0, len(WEIGHTS) * SIZE * SIZE * 4), name
        if finished:
            assert state == "new"
            # Saved to completion, the folder holds the model and the one data file it reads.
            assert _visible(folder) == sorted(["m.onnx", *_data_locations(case.dest)])
            assert not [p for p in folder.iterdir() if p.name.startswith(".")]
            break
        killed_before = log.read_text().splitlines()[-1]
        outcomes.append((killed_before, state))
        # A crash never stands in the way of the next save.
        save_model(_model(3), case.dest, external_data=True)
        assert _equal(_read_back(case.dest)[0], _weights_of(_model(3)))
    states = [state for _, state in outcomes]
    # The kill points cover the whole save: before anything, the old model is there, and once
    # the model is renamed, the new one is.
    assert states[0] == ("none" if case.old is None else "old")
    assert states == sorted(states, key=["none", "old", "new"].index)
    assert "new" in states  # the old data file is removed after the model is in place
    print(f"\n{scenario}: killed before ...")
    for i, (op, state) in enumerate(outcomes, 1):
        print(f"  {i:2}. {op:45} -> {state}")


# ---------------------------------------------------------------------------------------------
# Saving without a crash


def test_saving_over_the_files_the_model_is_read_from(tmp_path: Path) -> None:
    dest = models.save_external(_proto(0), tmp_path / "m.onnx")
    model = load_model(dest)
    before = _weights_of(ir.from_proto(_proto(0)))
    w0 = model.graph.initializers["w0"].const_value
    assert isinstance(w0, ir.ExternalTensor) and w0.raw is None  # not read yet
    save_model(model, dest)
    (data,) = _data_locations(dest)
    assert _visible(tmp_path) == sorted(["m.onnx", data])
    assert data != "m.onnx.data"  # the name the model was read from was taken while saving
    assert all(_equal(w, before) for w in _read_back(dest))
    # The model given still reads its weights, now from the new file (the old one is gone).
    assert _equal(_weights_of(model), before)
    # Once more: the name is free again, so the data goes back to <file>.data.
    save_model(model, dest)
    assert _data_locations(dest) == {"m.onnx.data"}
    assert _visible(tmp_path) == ["m.onnx", "m.onnx.data"]
    assert all(_equal(w, before) for w in _read_back(dest))
    assert _equal(_weights_of(model), before)


def test_saving_again_and_again_leaves_no_orphaned_files(tmp_path: Path) -> None:
    dest = tmp_path / "out" / "m.onnx"
    for seed in range(4):
        save_model(_model(seed), dest, external_data=True)
        (data,) = _data_locations(dest)
        assert sorted(p.name for p in dest.parent.iterdir()) == sorted(["m.onnx", data])
        assert _equal(_read_back(dest)[1], _weights_of(_model(seed)))


def test_data_file_names(tmp_path: Path) -> None:
    dest = tmp_path / "m.onnx"
    save_model(_model(0), dest, external_data=True)
    assert _data_locations(dest) == {"m.onnx.data"}
    save_model(_model(1), dest, external_data=True)
    (data,) = _data_locations(dest)
    digest = hashlib.sha256((tmp_path / data).read_bytes()).hexdigest()
    assert data == f"m.onnx.{digest[:8]}.data"
    # Both names taken (one by a file no model points at): a random one.
    (tmp_path / "m.onnx.data").write_bytes(b"left by someone")
    save_model(_model(1), dest, external_data=True)
    (third,) = _data_locations(dest)
    assert re.fullmatch(r"m\.onnx\.[0-9a-f]{16}\.data", third)
    assert (tmp_path / "m.onnx.data").read_bytes() == b"left by someone"  # not the model's
    assert _visible(tmp_path) == sorted(["m.onnx", "m.onnx.data", third])


def test_a_data_file_named_otherwise_is_left_in_place(tmp_path: Path) -> None:
    # Named by another tool, it may be another model's too: only ferry's names are removed.
    dest = tmp_path / "m.onnx"
    onnx.save(_proto(0), dest, save_as_external_data=True, location="weights.bin")
    (tmp_path / "other.onnx").write_bytes(dest.read_bytes())  # shares weights.bin
    save_model(_model(1), dest, external_data=True)
    assert _visible(tmp_path) == ["m.onnx", "m.onnx.data", "other.onnx", "weights.bin"]
    assert _equal(_read_back(tmp_path / "other.onnx")[0], _weights_of(_model(0)))


def test_a_failed_save_leaves_the_old_pair_and_no_files(tmp_path: Path) -> None:
    dest = tmp_path / "m.onnx"
    save_model(_model(0), dest, external_data=True)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    broken = _model(1)
    w2 = broken.graph.initializers["w2"]
    w2.const_value = _Exploding(w2.const_value)
    with pytest.raises(RuntimeError, match="disk full"):
        save_model(broken, dest, external_data=True)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert isinstance(broken.graph.initializers["w2"].const_value, _Exploding)  # put back


class _Exploding(ir.Tensor):
    def __init__(self, inner: ir.TensorProtocol | None) -> None:
        assert inner is not None
        super().__init__(inner.numpy(), name=inner.name)

    def tobytes(self) -> bytes:
        raise RuntimeError("disk full")


def test_the_caller_s_model_is_given_back_its_tensors(tmp_path: Path) -> None:
    model = _model(0)
    tensors = {name: v.const_value for name, v in model.graph.initializers.items()}
    save_model(model, tmp_path / "m.onnx", external_data=True)
    assert {name: v.const_value for name, v in model.graph.initializers.items()} == tensors
    # Read from another file that stays: still read from there.
    src = models.save_external(_proto(0), tmp_path / "src.onnx")
    lazy = load_model(src)
    save_model(lazy, tmp_path / "copy.onnx")
    w0 = lazy.graph.initializers["w0"].const_value
    assert isinstance(w0, ir.ExternalTensor) and Path(w0.path).name == "src.onnx.data"


def test_constant_values_stored_externally_are_kept_in_the_model(tmp_path: Path) -> None:
    # onnx stores Constant values externally when asked to; saving over such a model removes
    # the data file they are read from, so they must not point at it any more.
    value = np.arange(SIZE * SIZE, dtype=np.float32).reshape(SIZE, SIZE)
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(value, "c")),
            helper.make_node("MatMul", ["x", "c"], ["y"]),
        ],
        "const",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, SIZE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, SIZE])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    dest = tmp_path / "m.onnx"
    onnx.save(
        proto,
        dest,
        save_as_external_data=True,
        location="m.onnx.data",
        size_threshold=0,
        convert_attribute=True,
    )
    model = load_model(dest)
    save_model(model, dest, external_data=True)
    assert _visible(tmp_path) == ["m.onnx"]  # no initializer: no data file, the old one removed
    reloaded = onnx.load(dest)
    np.testing.assert_array_equal(
        numpy_helper.to_array(reloaded.graph.node[0].attribute[0].t), value
    )
    const = model.graph.node(0).attributes["value"].value
    np.testing.assert_array_equal(const.numpy(), value)


def test_weights_of_subgraphs_go_to_the_data_file(tmp_path: Path) -> None:
    weight = np.arange(SIZE * SIZE, dtype=np.float32)
    then_branch = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [SIZE * SIZE])],
        [numpy_helper.from_array(weight, "w")],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [SIZE * SIZE])],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch)],
        "if",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [SIZE * SIZE]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [SIZE * SIZE])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    dest = save_model(ir.from_proto(proto), tmp_path / "m.onnx", external_data=True)
    assert _visible(tmp_path) == ["m.onnx", "m.onnx.data"]
    # Saved over itself without saying how: its weights were external, so they stay so.
    model = load_model(dest)
    save_model(model, dest)
    (data,) = _visible(tmp_path)[1:]
    assert re.fullmatch(r"m\.onnx\.[0-9a-f]{8}\.data", data)
    then_graph = onnx.load(dest).graph.node[0].attribute[1].g
    np.testing.assert_array_equal(numpy_helper.to_array(then_graph.initializer[0]), weight)
    # The model given reads the subgraph's weight from the new file (the old one is gone).
    w = {g.name: g for g in model.graph.subgraphs()}["then"].initializers["w"].const_value
    assert isinstance(w, ir.ExternalTensor) and Path(w.path).name == data
    np.testing.assert_array_equal(w.numpy(), weight)


def test_saved_files_get_normal_permissions(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        dest = save_model(_model(0), tmp_path / "m.onnx", external_data=True)
        save_model(_model(1), dest, external_data=True)
    finally:
        os.umask(umask)
    assert {p.name.split(".")[-1]: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()} == {
        "onnx": 0o644,
        "data": 0o644,
    }


def test_saving_without_external_data_is_unchanged(tmp_path: Path) -> None:
    model = _model(0)
    dest = save_model(model, tmp_path / "m.onnx", external_data=False)
    ir.save(model, tmp_path / "plain.onnx")
    assert dest.read_bytes() == (tmp_path / "plain.onnx").read_bytes()
    assert _visible(tmp_path) == ["m.onnx", "plain.onnx"]
    # Small models decide for themselves: no external data.
    assert save_model(model, tmp_path / "auto.onnx").read_bytes() == dest.read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".data")]
