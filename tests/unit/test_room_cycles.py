"""No module of a room imports another of the same room back, however indirectly (DESIGN.md's
Layout: "no room imports itself in a circle"). Function-level and ``TYPE_CHECKING`` imports
count: a type that must be named from both sides says the two modules hold one job.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

import ferry

SRC = Path(ferry.__file__).parent


def _modules(src: Path) -> dict[str, Path]:
    found = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(module: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """The modules of the tree ``module`` imports: at the top, in functions, under
    TYPE_CHECKING; ``from pkg import mod`` is an import of ``pkg.mod``."""

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [known(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            targets = [
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else known(source)
                for alias in node.names
            ]
        else:
            continue
        yield from (t for t in targets if t is not None and t != module)


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


@functools.cache
def _cycles(src: Path) -> dict[str, list[list[str]]]:
    """Each room's circles: sets of its modules that import each other round (Tarjan's strongly
    connected components of the import graph, edges kept inside a room)."""
    modules = _modules(src)
    graph = {
        m: sorted({t for t in _imported(m, p, modules) if _room(t) == _room(m)})
        for m, p in modules.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: dict[str, list[list[str]]] = {}

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.setdefault(_room(v), []).append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    return found


_ROOMS = sorted({_room(m) for m in _modules(SRC)})


@pytest.mark.parametrize("room", _ROOMS)
def test_no_module_of_a_room_imports_itself_back(room: str) -> None:
    found = _cycles(SRC).get(room, [])
    assert not found, f"modules of {room} import each other in a circle: {found}"


def test_the_cycle_checker_catches_a_function_level_import(tmp_path: Path) -> None:
    room = tmp_path / "ferry" / "room"
    room.mkdir(parents=True)
    (tmp_path / "ferry" / "__init__.py").write_text("")
    (room / "__init__.py").write_text("")
    (room / "_a.py").write_text("from ferry.room._b import f\n")
    (room / "_b.py").write_text("def f():\n    from ferry.room import _a\n")
    (room / "_c.py").write_text("from ferry.room._a import f\n")  # on the way, not in the circle
    assert _cycles(tmp_path / "ferry") == {"room": [["ferry.room._a", "ferry.room._b"]]}
