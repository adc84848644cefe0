"""The Backend contract is typed: every optional capability has its default on ``BackendBase``,
is listed in the ``Backend`` Protocol, and is read directly (no ``getattr`` probing, no engine
special-cased by name outside its own module); adapters that do not derive from the base are
refused, named."""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from onnx import TensorProto, helper

import ferry
from ferry.backends import Backend, BackendBase, explain, get_backend, place, rule_table
from ferry.backends import _registry as registry
from ferry.errors import BackendUnavailableError, InvalidInputError

SRC = Path(ferry.__file__).parent

#: The names a backend object goes by in ferry's code.
BACKEND_NAMES = frozenset({"backend", "backends", "b", "engine", "item", "handle"})

#: The optional capabilities and what an engine that says nothing gets.
DEFAULTS = {
    "device": "cpu",
    "precisions": ("fp32",),
    "option_keys": frozenset(),
    "options": {},
    "dynamic_shapes": True,
    "ranked_inputs": False,
    "computes_shapes": False,
    "simulated": False,
    "engine_cache": None,
    "op_domains": frozenset(),
}


def _modules(*parts: str) -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(SRC.joinpath(*parts).rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _is_backend(node: ast.expr) -> bool:
    """A name a backend goes by, ``self.backend``, or ``get_backend(...)``."""
    if isinstance(node, ast.Name):
        return node.id in BACKEND_NAMES
    if isinstance(node, ast.Attribute):
        return node.attr in BACKEND_NAMES
    if isinstance(node, ast.Call):
        func = node.func
        return (isinstance(func, ast.Name) and func.id == "get_backend") or (
            isinstance(func, ast.Attribute) and func.attr == "get_backend"
        )
    return False


def test_no_module_probes_a_backend_with_getattr() -> None:
    probes = [
        f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}"
        for path, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in {"getattr", "hasattr"}
        and node.args
        and _is_backend(node.args[0])
    ]
    assert probes == [], "read the typed attribute (BackendBase gives its default):\n" + "\n".join(
        probes
    )


def _names_onnxruntime(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return node.value == "onnxruntime"
    if isinstance(node, (ast.Set, ast.Tuple, ast.List)):
        return any(_names_onnxruntime(e) for e in node.elts)
    if isinstance(node, ast.Call):  # frozenset({...}), set([...])
        return any(_names_onnxruntime(a) for a in node.args)
    return False


def _is_set(node: ast.AST) -> bool:
    """A set literal, or ``set(...)``/``frozenset(...)``."""
    return isinstance(node, ast.Set) or (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in {"set", "frozenset"}
    )


def _special_cases(tree: ast.Module) -> Iterator[ast.expr]:
    """Comparisons with "onnxruntime" (``==``, ``!=``, ``in``) and sets naming it."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            if any(_names_onnxruntime(side) for side in [node.left, *node.comparators]):
                yield node
        elif isinstance(node, ast.expr) and _is_set(node) and _names_onnxruntime(node):
            yield node


@pytest.mark.parametrize("room", ["runtime", "bench"])
def test_no_engine_is_special_cased_by_name_outside_its_module(room: str) -> None:
    """What an engine does differently is its adapter's typed attribute. (Naming ONNX Runtime as
    the default or as the baseline to measure against is no special case.)"""
    found = [
        f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}"
        for path, tree in _modules(room)
        for node in _special_cases(tree)
    ]
    assert found == []


def test_the_scans_see_what_they_look_for() -> None:
    """The two scans above would catch the probes this contract replaced."""
    tree = ast.parse(
        textwrap.dedent(
            """
            getattr(backend, "engine_cache", b.name != "onnxruntime")
            _IN_PROCESS = frozenset({"onnxruntime"})
            """
        )
    )
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert _is_backend(calls[0].args[0])
    # The comparison, and the frozenset (with the set inside it).
    assert [type(n).__name__ for n in _special_cases(tree)] == ["Call", "Compare", "Set"]


def test_the_base_gives_every_optional_capability_its_default() -> None:
    class Quiet(BackendBase):
        name = "quiet"
        sdk = "numpy"

    backend = Quiet()
    for attr, default in DEFAULTS.items():
        assert getattr(backend, attr) == default, attr
    assert backend.cache_fingerprint() == ""
    assert backend.capability(None, ["n"]) is None  # type: ignore[arg-type]
    assert backend.validate(None, ["n"]) == {}  # type: ignore[arg-type]
    assert rule_table(backend) is None  # publishes no rules
    with pytest.raises(NotImplementedError):
        backend.compile(None)  # type: ignore[arg-type]
    with pytest.raises(NotImplementedError):  # its engine cannot be asked by trial
        backend.trial(None)  # type: ignore[arg-type]
    assert [(d.name, d.kind) for d in backend.devices()] == [("cpu", "cpu")]
    assert backend.available() and backend.install_hint == "pip install numpy"
    assert isinstance(backend, Backend)


def test_every_optional_capability_is_in_the_protocol() -> None:
    members = set(Backend.__annotations__) | {
        n for n in vars(Backend) if not n.startswith("_") and callable(getattr(Backend, n))
    }
    members |= {n for n, v in vars(Backend).items() if isinstance(v, property)}
    own = {"sdk", "extra", "needs"}  # how the base finds an importable SDK: not the contract
    offered = {n for n in dir(BackendBase) if not n.startswith("_")} | set(
        BackendBase.__annotations__
    )
    assert offered - own <= members, sorted(offered - own - members)
    assert set(DEFAULTS) <= members


# What each built-in engine had before the base spelt the defaults out: the attributes it set
# itself, and for the others what placement, the cache and the bench assumed when it had none.
ENGINES: dict[str, dict[str, Any]] = {
    "ferry.backends._onnxruntime:OnnxRuntimeBackend": {
        "ranked_inputs": False,
        "computes_shapes": False,
        "engine_cache": False,  # was special-cased by name in runtime/_cache.py and the bench
        "op_domains": frozenset(
            {
                "com.microsoft",
                "com.microsoft.nchwc",
                "com.ms.internal.nhwc",
                "ai.onnx.preview.training",
            }
        ),  # was special-cased by name in bench/_generate.py
        "option_keys": frozenset({"device", "providers"}),
        "whole_model": False,
    },
    "ferry.backends._openvino:OpenVINOBackend": {
        "ranked_inputs": True,
        "computes_shapes": True,
        "engine_cache": None,
        "option_keys": frozenset(),
        "whole_model": True,
    },
    "ferry.backends._litert:LiteRTBackend": {
        "ranked_inputs": True,
        "computes_shapes": True,
        "engine_cache": None,
        "option_keys": frozenset(),
        "whole_model": True,
    },
    "ferry.backends._tensorrt:TensorRTBackend": {
        "ranked_inputs": True,
        "computes_shapes": False,
        "engine_cache": None,
        "option_keys": frozenset(
            {"workspace", "max_batch", "profile", "tf32", "optimization_level"}
        ),
        "whole_model": False,
    },
}


@pytest.mark.parametrize("target", sorted(ENGINES))
def test_builtin_engines_keep_what_they_had(target: str) -> None:
    import importlib

    module, _, name = target.partition(":")
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, BackendBase)
    backend = cls()
    expected = dict(ENGINES[target])
    whole_model = expected.pop("whole_model")
    for attr, value in expected.items():
        assert getattr(backend, attr) == value, attr
    assert backend.simulated is False
    assert backend.cache_fingerprint() == ""
    # A whole-model answer is its own method; the others keep the base's None.
    assert (cls.capability is not BackendBase.capability) is whole_model
    assert registry._BUILTIN[backend.name] == target


class Plain:
    """An adapter written to the Protocol alone, not deriving from the base."""

    name = "plain"
    device = "cpu"


def test_the_registry_refuses_an_adapter_not_on_the_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "plain_adapter.py").write_text(
        "class Plain:\n    name = 'plain'\n    def available(self):\n        return True\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_BUILTIN", {**registry._BUILTIN, "plain": "plain_adapter:Plain"})
    with pytest.raises(BackendUnavailableError, match=r"plain_adapter\.Plain does not derive from"):
        get_backend("plain")
    assert "plain" not in registry._instances


def test_place_refuses_an_object_not_on_the_base() -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for call in (place, explain):
        with pytest.raises(InvalidInputError, match=r"test_backend_contract\.Plain does not"):
            call(model, [Plain()])  # type: ignore[list-item]
