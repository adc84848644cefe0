"""ferry's own package names no vendor plugin (issue 34): the IREE adapter is plugins/ferry-iree,
found through the entry point, and removing it leaves ferry as it is."""

from __future__ import annotations

from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "ferry"


def test_ferry_names_no_plugin() -> None:
    named = [
        str(path.relative_to(SRC))
        for path in sorted(SRC.rglob("*.py"))
        if "iree" in path.read_text(encoding="utf-8").lower()
    ]
    assert not named, f"ferry's package names the IREE plugin: {named}"
