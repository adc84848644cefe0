"""The README and docs/ name only pages, headings, verbs and options that exist.

Docs rot silently: a page is renamed, a verb or a flag is dropped, and the README still shows it.
These checks read README.md and docs/*.md (the hand-written pages; docs/conformance/ is generated)
and compare them with the files in the repository and with the CLI's own click commands. Nothing
runs a model: the whole file takes well under a second.
"""

from __future__ import annotations

import ast
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from ferry.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
IDS = [str(page.relative_to(ROOT)) for page in PAGES]

_FENCE = re.compile(r"^\s*```")
_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_CODE_SPAN = re.compile(r"`+[^`]*`+")
# Shell words that end one command and may start another (shlex's punctuation tokens).
_SEPARATOR = re.compile(r"^[();<>|&]+$")
_ASSIGNMENT = re.compile(r"^\w+=")
# Paths the prose names: from the repository root, or inside src/ferry (ferry/bench/x.py,
# optimizer/rules/common/).
_SOURCE_PATH = re.compile(
    r"(?<![\w./~-])((?:src|tests|benchmarks|scripts|examples|ferry|optimizer)/[\w./-]*)"
)


def _prose_lines(text: str) -> Iterator[str]:
    """The lines outside fenced code blocks, with inline code spans removed."""
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield _CODE_SPAN.sub("", line)


def _code_blocks(text: str) -> Iterator[tuple[str, list[str]]]:
    """(language, lines) of every fenced code block."""
    language = ""
    lines: list[str] = []
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            if fenced:
                yield language, lines
            else:
                language, lines = line.strip().strip("`").strip().lower(), []
            fenced = not fenced
        elif fenced:
            lines.append(line)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = _CODE_SPAN.sub(lambda m: m.group(0).strip("`"), heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if fenced or not heading:
            continue
        slug = _slug(heading.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _links(page: Path) -> list[str]:
    return [
        target
        for line in _prose_lines(page.read_text(encoding="utf-8"))
        for target in _LINK.findall(line)
    ]


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_relative_links_point_at_files_and_headings(page: Path) -> None:
    broken = []
    for target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no heading with that anchor in {linked.name}")
    assert not broken, broken


def test_readme_links_every_docs_page() -> None:
    linked = {
        (ROOT / target.partition("#")[0]).resolve()
        for target in _links(ROOT / "README.md")
        if target.startswith("docs/")
    }
    pages = {page.resolve() for page in PAGES[1:]}
    assert pages <= linked, sorted(str(p.relative_to(ROOT)) for p in pages - linked)


def _code_spans(page: Path) -> Iterator[str]:
    """The inline code spans of a page's prose."""
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield from re.findall(r"`([^`]+)`", line)


def _module_file(dotted: str) -> Path | None:
    """The source file of module ``dotted`` (``ferry.a.b``), found without importing it."""
    base = SRC.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _defined_names(source: Path) -> set[str]:
    """What a module offers: ``__all__`` and its top-level definitions, assignments and imports."""
    names: set[str] = set()
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                value = node.value
                if isinstance(value, (ast.List, ast.Tuple)):
                    names.update(
                        e.value
                        for e in value.elts
                        if isinstance(e, ast.Constant) and isinstance(e.value, str)
                    )
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _python_name_problem(dotted: str) -> str | None:
    """Why ``ferry.a.b.name`` does not exist, or None: the longest module, then one attribute."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        source = _module_file(".".join(parts[:end]))
        if source is None:
            continue
        if end == len(parts):
            return None
        attribute = parts[end]
        if attribute in _defined_names(source):
            return None
        return f"{'.'.join(parts[:end])} has no {attribute}"
    return "no such module"


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_python_names_and_source_paths_exist(page: Path) -> None:
    """`ferry.x.y` names and src/tests/benchmarks/scripts paths the prose shows are there."""
    problems = []
    for span in _code_spans(page):
        for found in re.finditer(r"(?<![\w./\"-])ferry(?:\.[A-Za-z_]\w*)+", span):
            name = found.group(0)
            if re.search(r"\.(json|js|md|py|onnx|tflite)$", name):  # a file name, not a module
                continue
            problem = _python_name_problem(name)
            if problem:
                problems.append(f"{name}: {problem}")
        for found in re.finditer(_SOURCE_PATH, span):
            path = found.group(1).rstrip(".")
            if not any((base / path).exists() for base in (ROOT, SRC, SRC / "ferry")):
                problems.append(f"{path}: no such file or folder")
    assert not problems, problems


def _shell_commands(text: str) -> Iterator[str]:
    """Each shell command of the bash and console blocks, continuation lines joined.

    A console block's commands are its ``$ `` lines (the rest is output); a bash block's are all
    its lines but comments.
    """
    for language, lines in _code_blocks(text):
        if language not in {"bash", "sh", "shell", "console"}:
            continue
        command = ""
        for line in lines:
            if not command:
                if language == "console":
                    if not line.startswith("$ "):
                        continue
                    line = line[2:]
                if line.lstrip().startswith("#"):
                    continue
            command += line
            if command.rstrip().endswith("\\"):
                command = command.rstrip()[:-1] + " "
                continue
            yield command
            command = ""
        if command:
            yield command


def _ferry_invocations(command: str) -> Iterator[list[str]]:
    """The words of every ``ferry ...`` invocation in a shell command, up to its end."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = list(lexer)
    starts = True  # at the start of a command: after a separator or an environment assignment
    for i, word in enumerate(words):
        if word == "ferry" and starts:
            end = next((j for j in range(i + 1, len(words)) if _SEPARATOR.match(words[j])), None)
            yield words[i + 1 : end]
        starts = bool(_SEPARATOR.match(word)) or (starts and bool(_ASSIGNMENT.match(word)))


def _option_names(command: click.Command) -> set[str]:
    names = {"--help", "-h"}
    for param in command.params:
        names.update(param.opts)
        names.update(param.secondary_opts)
    return names


def _check_invocation(words: list[str]) -> list[str]:
    """What in ``ferry WORDS`` the CLI does not know: a verb, a subcommand or an option."""
    problems: list[str] = []
    command: click.Command = cli
    path = "ferry"
    position = 0
    while isinstance(command, click.Group):
        # The group's own options come first (ferry --version, ferry --debug VERB ...).
        while position < len(words) and words[position].startswith("-"):
            position += 1
        if position == len(words):
            break
        name = words[position]
        sub = command.commands.get(name)
        if sub is None:
            return [
                f"{path} {name}: no such command (known: {', '.join(sorted(command.commands))})"
            ]
        command, path, position = sub, f"{path} {name}", position + 1
    known = _option_names(command)
    group_known = _option_names(cli)
    for word in words:
        option = word.strip("[]").split("=", 1)[0]
        if not option.startswith("-") or option == "-" or re.match(r"^-[\d.]", option):
            continue
        if option not in known and option not in group_known:
            problems.append(f"{path}: no option {option}")
    return problems


def _invocations() -> list[tuple[str, list[str]]]:
    found = []
    for page, page_id in zip(PAGES, IDS):
        for command in _shell_commands(page.read_text(encoding="utf-8")):
            for words in _ferry_invocations(command):
                found.append((page_id, words))
    return found


def test_docs_show_ferry_commands() -> None:
    # The parser finds what the pages show: the README's tour runs every verb.
    verbs = {words[0] for page, words in _invocations() if page == "README.md" and words}
    assert set(cli.commands) <= verbs, sorted(set(cli.commands) - verbs)


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_every_ferry_command_shown_is_a_real_verb_with_real_options(page: Path) -> None:
    page_id = str(page.relative_to(ROOT))
    problems = [
        f"`ferry {' '.join(words)}`: {problem}"
        for found_in, words in _invocations()
        if found_in == page_id
        for problem in _check_invocation(words)
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_shell_blocks_name_real_scripts_and_extras(page: Path) -> None:
    """Scripts, benchmarks and examples the commands run exist; pip's extras are pyproject's."""
    # pyproject's [project.optional-dependencies] keys (tomllib is Python 3.11+; ferry runs on 3.10).
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = pyproject.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    extras = set(re.findall(r"^([\w-]+)\s*=", section, re.M))
    problems = []
    for command in _shell_commands(page.read_text(encoding="utf-8")):
        for found in re.finditer(_SOURCE_PATH, command):
            path = found.group(1).rstrip(".")
            if (
                path.startswith(("scripts/", "benchmarks/", "examples/"))
                and not (ROOT / path).exists()
            ):
                problems.append(f"{command.strip()}: no {path}")
        if "pip install" in command:
            for group in re.findall(r"\.\[([\w,-]+)\]", command):
                problems += [
                    f"{command.strip()}: no extra {extra!r}"
                    for extra in group.split(",")
                    if extra not in extras
                ]
    assert not problems, problems
