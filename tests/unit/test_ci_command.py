"""CI runs the README's test command, exactly: the two may not drift apart again.

The README's "two commands" block gives the demo and the test command; ``.ci/run`` may set
CI-only switches (environment variables) but must run that very test command and nothing else.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README's 'The two commands' section has no bash block"
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]


def _ci_commands() -> list[str]:
    """The commands .ci/run runs, less shell plumbing (set, cd, export, the exit-code handling)."""
    commands = []
    for raw in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or re.match(r"(set|cd|export|if|fi|exit|echo|then|else)\b|\w+=\$\?$", line):
            continue
        commands.append(line)
    return commands


def test_readme_gives_two_commands_demo_and_tests() -> None:
    commands = _readme_commands()
    assert len(commands) == 2, commands
    assert "demo" in commands[0] and "test" in commands[1], commands


def test_ci_runs_exactly_the_readme_test_command() -> None:
    test_command = _readme_commands()[1]
    ci = _ci_commands()
    assert ci == [test_command], (
        f".ci/run runs {ci}, the README's test command is {test_command!r}: make them the same"
    )
    # No environment prefix on the command line itself either (FERRY_X=1 bash ...).
    assert "=" not in shlex.split(ci[0])[0]


def test_ci_sets_only_ci_switches() -> None:
    exports = re.findall(r"^export (\w+)=", (ROOT / ".ci" / "run").read_text(), re.M)
    # FERRY_CI makes a skip a failure; anything that changes what is installed or run belongs
    # in the README's command, where a newcomer gets it too.
    assert set(exports) <= {"FERRY_CI"}, exports
