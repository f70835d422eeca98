"""The README stays true: its Python example runs as written, every ``rpeg`` name it uses
resolves, and every command line it shows names a real sub-command and real flags."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import re
import shlex
from pathlib import Path

import pytest

import rpeg
from rpeg.cli import _parser

README = Path(__file__).resolve().parents[1] / "README.md"
TEXT = README.read_text()


def _fenced(text: str) -> tuple[list[tuple[str, str]], str]:
    """The fenced blocks of ``text`` as ``(language, body)`` pairs, and the prose between them."""
    blocks: list[tuple[str, str]] = []
    prose: list[str] = []
    body: list[str] | None = None
    language = ""
    for line in text.splitlines():
        if line.startswith("```"):
            if body is None:
                body, language = [], line[3:].strip()
            else:
                blocks.append((language, "\n".join(body)))
                body = None
        elif body is not None:
            body.append(line)
        else:
            prose.append(line)
    return blocks, "\n".join(prose)


BLOCKS, PROSE = _fenced(TEXT)
#: Fenced code blocks and inline code spans: where the README shows code.
CODE = [body for _, body in BLOCKS] + re.findall(r"`([^`\n]+)`", PROSE)
#: ``rpeg.a.b``, not a format name (``rpeg.result/1``) nor part of a path or longer name.
DOTTED = re.compile(r"(?<![\w./-])rpeg((?:\.[A-Za-z_]\w*)+)(?![\w/])")
FROM_IMPORT = re.compile(
    r"^[ \t]*from[ \t]+(rpeg(?:\.\w+)*)[ \t]+import[ \t]+(\([^)]*\)|[\w \t,]+)", flags=re.M
)
#: Attributes the README reads off a result (``result.summary()``, ``result.gantt(...)``).
RESULT_ATTR = re.compile(r"(?<![\w.])(?:result|again)\.([A-Za-z_]\w*)")


def test_readme_python_example_runs(tmp_path, monkeypatch):
    blocks = [body for language, body in BLOCKS if language == "python"]
    assert blocks, "README has no python example"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    assert namespace["result"].feasible
    assert namespace["again"].throughput == namespace["result"].throughput
    assert (tmp_path / "plan.json").is_file()


def test_readme_gives_exactly_the_two_setup_commands():
    setup = TEXT[TEXT.index("## Set up") : TEXT.index("## Python")]
    commands = re.findall(r"^make \w+", setup, flags=re.M)
    assert commands == ["make demo", "make test"]


def _dotted_names() -> list[str]:
    return sorted({m.group(1)[1:] for code in CODE for m in DOTTED.finditer(code)})


def test_the_readme_uses_rpeg_names():
    """The parsers below find what the README shows (a test over nothing could not fail)."""
    names = _dotted_names()
    for expected in ("solve", "Cluster.from_shape", "Result.from_json", "InputError", "run"):
        assert expected in names, names
    assert "result" not in names  # rpeg.result/1 is a format, not a name


#: Names ``rpeg/__init__.py`` loads on first use (torch, Ray): they are checked against
#: ``rpeg.__all__`` here, without loading the runtime (tests/runtime/test_exports.py calls them).
LAZY = ("run", "verify")


@pytest.mark.parametrize("dotted", _dotted_names())
def test_every_rpeg_name_in_the_readme_resolves(dotted):
    head, *rest = dotted.split(".")
    if head in LAZY:
        assert head in rpeg.__all__ and not rest, dotted
        return
    obj: object = rpeg
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if not hasattr(obj, part):  # a subpackage nothing has imported yet (rpeg.runtime)
            with contextlib.suppress(ImportError):
                importlib.import_module(".".join(["rpeg", *parts[: i + 1]]))
        assert hasattr(obj, part), f"README uses rpeg.{dotted}, but {part!r} does not resolve"
        obj = getattr(obj, part)


def _imports_in(codes: list[str]) -> list[tuple[str, str]]:
    """``(module, name)`` of every ``from rpeg... import name`` in ``codes``."""
    found = set()
    for code in codes:
        for module, names in FROM_IMPORT.findall(code):
            found |= {(module, n.strip()) for n in names.strip("()").split(",") if n.strip()}
    return sorted(found)


def test_every_import_in_the_readme_resolves():
    # the parser reads what it must (the README may import nothing today)
    sample = "from rpeg.solvers import Result, solve\nfrom rpeg import (plan_transition)\n"
    assert _imports_in([sample]) == [
        ("rpeg", "plan_transition"),
        ("rpeg.solvers", "Result"),
        ("rpeg.solvers", "solve"),
    ]
    for module, name in _imports_in(CODE):
        assert hasattr(importlib.import_module(module), name), f"README: from {module} import {name}"


def test_every_result_attribute_in_the_readme_exists():
    attrs = {m for code in CODE for m in RESULT_ATTR.findall(code)}
    assert {"summary", "to_json", "gantt"} <= attrs, attrs
    known = {f.name for f in dataclasses.fields(rpeg.Result)} | set(dir(rpeg.Result))
    assert attrs <= known, attrs - known


def _command_lines() -> list[list[str]]:
    """``rpeg ...`` lines of the README's console blocks, split like a shell (comments dropped)."""
    blocks = [body for language, body in BLOCKS if language == ""]
    lines = [line for block in blocks for line in block.splitlines() if line.startswith("rpeg ")]
    return [shlex.split(line, comments=True)[1:] for line in lines]


def test_every_command_line_in_the_readme_names_real_flags():
    commands = _command_lines()
    assert len(commands) >= 10, commands
    sub = next(a for a in _parser()._actions if a.dest == "command").choices
    for argv in commands:
        assert argv[0] in sub, f"rpeg {argv[0]}: no such sub-command"
        known = sub[argv[0]]._option_string_actions
        flags = [a.split("=")[0] for a in argv[1:] if a.startswith("--")]
        unknown = [f for f in flags if f not in known]
        assert not unknown, f"rpeg {' '.join(argv)}: unknown flag(s) {unknown}"
