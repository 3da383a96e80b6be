"""The docs hold against the code: every flag they give flagosd or flagos-smi
is one the tool's --help lists, every tool flag is in docs/operations.md,
every environment variable they name is in the sources (and every one the
code reads is in docs/usage.md's table), and their Python snippets run.

Python blocks: ```python is a complete program, run here against the test
run's daemon; ```python fragment is a piece of one (it names a model or data
the reader has, or needs torch_fl installed, which test_install.py covers),
only compiled; a block after `<!-- NAME-example -->` is run
by the test that names that marker (with the arguments and checks it needs).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flagos_test_env import REPO, help_flags

DOCS = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
OPERATIONS = REPO / "docs" / "operations.md"
USAGE = REPO / "docs" / "usage.md"
TOOLS = {"flagosd": REPO / "build" / "bin" / "flagosd",
         "flagos-smi": REPO / "build" / "bin" / "flagos-smi"}
# Sources in which a documented variable must appear (read, set or passed on).
SOURCE_DIRS = ["client", "plugin", "daemon", "backends", "scripts", "tests", "deploy", ".ci"]
SOURCE_SUFFIXES = {".cc", ".h", ".cpp", ".py", ".in", ".txt", ".conf", ".yaml", ".service", ""}
# Named in the docs, read by no flagos code, on purpose.
NOT_OURS = {"XDNN_ROOT": "the vendor's tools read it; installation.md says flagosd does not",
            "XPU_EVENT_KL3_ENABLE": "libxpurt's; installation.md says not to set it"}
ENV_NAME = re.compile(r"\b((?:FLAGOS|XPU|XDNN|FAKE_XPU)_[A-Z0-9_]*[A-Z0-9])\b")


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def tool_flags() -> dict[str, set[str]]:
    flags = {}
    for tool, binary in TOOLS.items():
        proc = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        flags[tool] = set(help_flags(proc.stdout))
        assert len(flags[tool]) > 3, proc.stdout
    return flags


def code_texts(markdown: str) -> list[str]:
    """The code of a page: each line of its fenced blocks (backslash
    continuations joined) and each inline code span of its prose."""
    texts = []
    prose = []
    fence = False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        (texts if fence else prose).append(line)
    texts = re.sub(r"\\\n\s*", " ", "\n".join(texts)).splitlines()
    texts += re.findall(r"`([^`\n]+)`", "\n".join(prose))
    return texts


INVOCATION = re.compile(r"(?:^|[\s/\"'(])(flagosd|flagos-smi)((?:\s+[^\s|;&#`]+)*)")


def test_every_flag_the_docs_give_a_tool_is_one_it_has() -> None:
    flags = tool_flags()
    wrong = []
    invocations = 0
    for page in DOCS:
        for text in code_texts(page.read_text()):
            for tool, args in INVOCATION.findall(text):
                invocations += 1
                for name in re.findall(r"(?:^|\s)--([a-z][a-z0-9_-]*)", args):
                    if name.replace("_", "-") not in flags[tool]:
                        wrong.append(f"{rel(page)}: {tool} --{name} (in `{text.strip()}`)")
    assert invocations > 20, "no tool invocations found: the parser lost them"
    assert not wrong, "flags the tools do not have:\n" + "\n".join(wrong)


def test_every_flag_in_the_operations_tables_is_a_tools() -> None:
    flags = tool_flags()
    known = flags["flagosd"] | flags["flagos-smi"]
    rows = [line for line in OPERATIONS.read_text().splitlines() if line.startswith("| `--")]
    assert len(rows) > 20, "the flag tables of docs/operations.md went missing"
    wrong = [f"--{name}" for row in rows
             for name in re.findall(r"`--([a-z][a-z0-9-]*)", row.split("|")[1])
             if name not in known]
    assert not wrong, f"docs/operations.md lists flags no tool has: {wrong}"


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_every_flag_of_each_tool_is_in_operations_md(tool: str) -> None:
    text = OPERATIONS.read_text()
    missing = sorted(f"--{name}" for name in tool_flags()[tool]
                     if not re.search(rf"`--{re.escape(name)}(?![a-z0-9-])", text))
    assert not missing, f"{tool}'s flags missing from docs/operations.md: {missing}"


def source_text() -> str:
    parts = []
    for directory in SOURCE_DIRS:
        for path in (REPO / directory).rglob("*"):
            if path.is_file() and path.suffix in SOURCE_SUFFIXES and path.stat().st_size < 2 << 20:
                parts.append(path.read_text(errors="replace"))
    parts.append((REPO / "CMakeLists.txt").read_text())
    return "\n".join(parts)


def test_every_environment_variable_in_the_docs_is_in_the_sources() -> None:
    sources = source_text()
    missing = sorted({f"{name} ({rel(page)})" for page in DOCS
                      for name in ENV_NAME.findall(page.read_text())
                      if name not in NOT_OURS and not re.search(rf"\b{name}\b", sources)})
    assert not missing, f"variables the docs name and no source has: {missing}"


def variables_read(*directories: str) -> set[str]:
    """Names passed to getenv / os.environ in the sources under `directories`."""
    read = re.compile(r"(?:getenv|environ\.get|environ\[|Env)\(?\s*\"([A-Z][A-Z0-9_]+)\"")
    names = set()
    for directory in directories:
        for path in (REPO / directory).rglob("*"):
            if path.suffix in {".cc", ".h", ".cpp", ".py"}:
                names.update(read.findall(path.read_text(errors="replace")))
    return names


def usage_table() -> str:
    return "\n".join(line for line in USAGE.read_text().splitlines() if line.startswith("| `"))


def test_every_variable_the_client_reads_is_in_the_usage_table() -> None:
    names = variables_read("client", "plugin")
    assert "FLAGOS_ENDPOINT" in names, "the search for getenv calls lost them"
    missing = sorted(n for n in names if f"`{n}`" not in usage_table())
    assert not missing, f"variables torch_fl reads but docs/usage.md's table lacks: {missing}"


def test_every_variable_the_daemon_reads_is_documented() -> None:
    # In usage.md's table, or (a vendor's) on its backend's page.
    names = variables_read("daemon", "backends")
    assert "XPU_ROOT" in names, "the search for getenv calls lost them"
    docs = "\n".join(page.read_text() for page in DOCS)
    missing = sorted(n for n in names if f"`{n}`" not in docs)
    assert not missing, f"variables flagosd reads that no doc names: {missing}"


def python_blocks() -> list[tuple[str, str, str, str]]:
    """(page:line, info string, marker before it or "", code) of every Python block."""
    blocks = []
    for page in DOCS:
        text = page.read_text()
        for match in re.finditer(r"(?:<!-- ([\w-]+-example) -->\n)?```(python[^\n]*)\n(.*?)```",
                                 text, re.S):
            line = text.count("\n", 0, match.start(2)) + 1
            blocks.append((f"{rel(page)}:{line}", match.group(2).strip(), match.group(1) or "",
                           match.group(3)))
    return blocks


BLOCKS = python_blocks()


def test_the_docs_have_python_blocks_of_every_kind() -> None:
    kinds = {("marked" if marker else info) for _, info, marker, _ in BLOCKS}
    assert kinds == {"python", "python fragment", "marked"}, kinds


@pytest.mark.parametrize("where,info,marker,code", BLOCKS, ids=[b[0] for b in BLOCKS])
def test_python_block(where: str, info: str, marker: str, code: str, endpoint: str,
                      tmp_path: Path) -> None:
    assert info in ("python", "python fragment"), f"{where}: unknown info string {info!r}"
    compile(code, where, "exec")  # every block is Python, fragments too
    if marker:
        tests = [p for p in (REPO / "tests" / "python").glob("test_*.py")
                 if f"<!-- {marker} -->" in p.read_text()]
        assert tests, f"{where}: no test runs the block marked {marker}"
        return
    if info == "python fragment":
        return
    script = tmp_path / "snippet.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "FLAGOS_ENDPOINT": endpoint})
    assert proc.returncode == 0, f"{where} failed:\n{code}\n{proc.stderr}"
