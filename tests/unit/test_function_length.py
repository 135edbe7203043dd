"""Issue 37 item 7: no function in bench/ or analysis/ is over 60 lines without a one-line reason above it.

The reason is a comment on the line above the `def` (or its first decorator) that starts with the function's
length, `# 68 lines: ...`, so that it is rewritten when the function grows or shrinks: a stale count fails here.
A function's length runs from its `def` line to its last line, as `ast` reports them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.helpers import REPO

LIMIT = 60
REASON = re.compile(r"#\s*(\d+) lines: \S")


def unexplained(folders: list[Path]) -> list[str]:
    """Every function over LIMIT lines in `folders` whose line above does not give its length and a reason."""
    out = []
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            lines = path.read_text().splitlines()
            for node in ast.walk(ast.parse("\n".join(lines))):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                length = node.end_lineno - node.lineno + 1
                first = min([d.lineno for d in node.decorator_list] + [node.lineno])
                above = lines[first - 2].strip() if first > 1 else ""
                m = REASON.match(above)
                if length > LIMIT and (m is None or int(m.group(1)) != length):
                    out.append(f"{path.relative_to(folder.parent)}:{node.name} is {length} lines; above it: {above!r}")
    return out


def test_every_function_over_60_lines_says_why_above_it():
    found = unexplained([REPO / "bench", REPO / "analysis"])
    assert not found, "split these, or say why above them ('# N lines: why'):\n" + "\n".join(found)


def test_the_check_finds_long_methods_and_stale_counts(tmp_path):
    body = "        x = 1\n" * 60
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text(f"class A:\n    def long(self):\n{body}\n    def short(self):\n        pass\n")
    (pkg / "b.py").write_text(f"class B:\n    # 61 lines: the loop on one screen\n    @staticmethod\n"
                              f"    def said(x):\n{body}")
    (pkg / "c.py").write_text(f"class C:\n    # 60 lines: a count the function outgrew\n    def stale(self):\n{body}")
    found = unexplained([pkg])
    assert [f.split(" is ")[0] for f in found] == ["pkg/a.py:long", "pkg/c.py:stale"]
    assert all(" is 61 lines" in f for f in found)
