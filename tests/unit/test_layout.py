"""The house rules of DESIGN.md's Layout, checked from the source (AST, lazy imports included).

Imports run one way, bottom up::

    errors <- graph, parity, plan, formats, tflite <- backends <- runtime
        <- converters, optimizer, generate, mobile, web <- serving, bench, conformance
        <- deploy <- cli

Rooms on one level may use each other one way (``plan`` uses ``graph``; the bench agent uses
``serving``'s server), never in a cycle. Library code never imports the facade (``import ferry``)
and never imports ``zoo`` or ``cli``; the CLI may use the facade, the zoo anything but the CLI.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import ferry

SRC = Path(ferry.__file__).parent

#: Each room's level; a room may import rooms of a lower level (and, one way, of its own).
LEVELS: dict[str, int] = {
    "_version": 0,
    "_lazy": 0,
    "_state_names": 0,
    "_signals": 0,
    "errors": 0,
    "_folders": 1,
    "graph": 1,
    "parity": 1,
    "plan": 1,
    "formats": 1,
    "tflite": 1,
    "backends": 2,
    "runtime": 3,
    "converters": 4,
    "optimizer": 4,
    "generate": 4,
    "mobile": 4,
    "web": 4,
    "serving": 5,
    "bench": 5,
    "conformance": 5,
    "deploy": 6,
    "cli": 7,
    "zoo": 7,
}
#: Rooms the library never imports.
TOP_ONLY = {"cli", "zoo"}


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def _imports(module: str, path: Path) -> Iterator[tuple[int, str]]:
    """``(line, imported module)`` for every import in the file, however deeply nested."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target == "ferry":
                # ``from ferry import graph`` imports a room; ``from ferry import load`` the facade.
                for alias in node.names:
                    is_room = alias.name in LEVELS
                    yield node.lineno, f"ferry.{alias.name}" if is_room else "ferry"
            else:
                yield node.lineno, target


def _room(module: str) -> str | None:
    """``ferry.backends._api`` -> ``backends``; the facade (``ferry``) -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _violations() -> tuple[list[str], dict[tuple[str, str], str]]:
    bad: list[str] = []
    edges: dict[tuple[str, str], str] = {}
    for module, path in _modules():
        source = _room(module)
        for line, target in _imports(module, path):
            if target != "ferry" and not target.startswith("ferry."):
                continue
            where = f"{path.relative_to(SRC.parent)}:{line} imports {target}"
            if source is None:
                continue  # the facade re-exports the rooms lazily
            dest = _room(target)
            if dest is None:
                if source != "cli":
                    bad.append(f"{where}: library code must not import the facade")
                continue
            if dest not in LEVELS:
                bad.append(f"{where}: {dest!r} is not a room of DESIGN.md's layout")
                continue
            if source not in LEVELS:
                bad.append(
                    f"{path.relative_to(SRC.parent)}: {source!r} is not a room of the layout"
                )
                continue
            if dest == source:
                continue
            if dest in TOP_ONLY and source not in TOP_ONLY:
                bad.append(f"{where}: the library never imports {dest}")
            elif LEVELS[dest] > LEVELS[source]:
                bad.append(f"{where}: {source} (level {LEVELS[source]}) sits below {dest}")
            elif LEVELS[dest] == LEVELS[source]:
                edges.setdefault((source, dest), where)
    return bad, edges


def test_imports_run_one_way() -> None:
    bad, _ = _violations()
    assert not bad, "imports against DESIGN.md's direction:\n" + "\n".join(bad)


def test_rooms_on_one_level_never_import_each_other_both_ways() -> None:
    _, edges = _violations()
    both = [f"{edges[a, b]}\n  and {edges[b, a]}" for a, b in edges if (b, a) in edges and a < b]
    assert not both, "rooms of one level import each other:\n" + "\n".join(both)


def test_every_room_is_known() -> None:
    rooms = {p.stem for p in SRC.glob("*.py")} | {p.parent.name for p in SRC.glob("*/__init__.py")}
    rooms.discard("__init__")
    assert rooms <= set(LEVELS), f"rooms missing from the layout test: {rooms - set(LEVELS)}"


@pytest.mark.parametrize(
    ("source", "line", "problem"),
    [
        ("ferry.backends._x", "from ferry.runtime import load", "sits below runtime"),
        ("ferry.graph", "import ferry", "must not import the facade"),
        ("ferry.converters._x", "from ferry import load", "must not import the facade"),
        ("ferry.converters._x", "from ferry.zoo import build", "never imports zoo"),
        ("ferry.runtime._x", "from ..cli import main", "never imports cli"),
    ],
)
def test_the_checker_catches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, line: str, problem: str
) -> None:
    """The checker itself: each kind of bad import in a module of its own is reported."""
    path = tmp_path / (source.rsplit(".", 1)[-1] + ".py")
    path.write_text(f"def f():\n    {line}\n")
    this = sys.modules[__name__]
    monkeypatch.setattr(this, "_modules", lambda: iter([(source, path)]))
    monkeypatch.setattr(this, "SRC", tmp_path.parent)
    bad, _ = _violations()
    assert len(bad) == 1 and problem in bad[0], bad


#: Generated or declarative tables, exempt from the size rule (DESIGN: "generated tables aside").
_TABLES = ("backends/_openvino_rules.py",)
MAX_LINES = 800


def test_no_source_file_passes_800_lines() -> None:
    big = [
        f"{path.relative_to(SRC.parent)} ({n} lines)"
        for path in sorted(SRC.rglob("*.py"))
        if path.relative_to(SRC).as_posix() not in _TABLES
        and (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    ]
    assert not big, "split these by job (DESIGN: one job a module):\n" + "\n".join(big)
